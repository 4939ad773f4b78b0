"""Static porting checks: does a Triton source follow a target's rules?

`lint(source, target="ascend")` returns Findings (line, rule, message, severity); each rule of
the migration guide (docs/porting.md, /work/shared/notes/triton_ascend.md section 1) is one
small function `rule_x(src) -> Iterator[Finding]`. Nothing runs: the checks read the AST.
Where a rule needs a size (unified-buffer use, grid size) it is estimated from the constexpr
values a launch passes, the module's constants and the dtypes the kernel casts to; a size
that depends on the input is a warning, a size known to break the limit is an error.

The analyses (kernels, launches, host values, symbolic tile shapes) are shared with
farm.port, whose passes fix what these rules find.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

from farm.errors import FarmError
from farm.pyast import dotted_name as dotted

UB_BYTES = 96 * 1024  # A2/A3 unified buffer is 192 KB; double buffering (default) halves it
GRID_LIMIT = 65535  # gridX * gridY * gridZ on Ascend
SEVERITIES = ("error", "warning", "info")

JIT_DECORATORS = {"triton.jit", "jit", "triton.autotune", "autotune", "triton.heuristics", "heuristics"}
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "float64": 8,
               "fp64": 8, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
               "uint64": 8, "int1": 1}
FP8_TYPES = {"float8e4nv", "float8e5", "float8e4b15", "float8e4b8", "float8e5b16", "float8e4b15x4", "fp8e4nv",
             "fp8e5", "fp8e4b15", "fp8e4b8", "fp8e5b16"}
REDUCTIONS = {"sum", "max", "min", "argmax", "argmin", "reduce", "xor_sum"}
SCANS = {"cumsum", "cumprod", "associative_scan"}
RESHAPES = {"reshape", "view", "trans", "permute", "broadcast_to", "expand_dims", "join", "split", "gather",
            "sort", "flip", "interleave", "ravel", "histogram", "dot", "dot_scaled", "topk"}
ELEMENTWISE = {"exp", "exp2", "log", "log2", "abs", "sqrt", "sqrt_rn", "rsqrt", "sin", "cos", "sigmoid", "maximum",
               "minimum", "where", "fma", "clamp", "erf", "floor", "ceil", "fdiv", "div_rn", "umulhi", "cdiv",
               "softplus", "tanh", "isnan", "isinf", "pow"}
ATOMICS = {"atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg",
           "atomic_cas"}
LOOP_BANNED_ATOMICS = {"atomic_or", "atomic_xor", "atomic_and", "atomic_xchg", "atomic_cas"}
CUDA_DEVICE = re.compile(r"^cuda(:\d+)?$")
DEVICE_WORDS = re.compile(r"dev", re.IGNORECASE)


@dataclass(frozen=True)
class Finding:
    line: int
    rule: str
    message: str
    severity: str = "error"

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ shared analyses




def is_kernel(fn: ast.AST) -> bool:
    return isinstance(fn, ast.FunctionDef) and any(
        dotted(d.func if isinstance(d, ast.Call) else d) in JIT_DECORATORS for d in fn.decorator_list)


def kernel_defs(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if is_kernel(n)}


def params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def constexprs(fn: ast.FunctionDef) -> set[str]:
    return {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
            if a.annotation is not None and dotted(a.annotation).endswith("constexpr")}


def parent_map(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def call_name(node: ast.AST) -> str:
    """'arange' for tl.arange(...), 'to' for x.to(...); '' when not a call."""
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):
            return node.func.attr
        if isinstance(node.func, ast.Name):
            return node.func.id
    return ""


def is_tl_call(node: ast.AST, *names: str) -> bool:
    """A call of triton.language (tl.X, triton.language.X, or a bare imported X)."""
    if not isinstance(node, ast.Call) or call_name(node) not in names:
        return False
    base = dotted(node.func.value) if isinstance(node.func, ast.Attribute) else ""
    return base in ("", "tl", "triton.language", "language")


def arg(call: ast.Call, index: int, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return call.args[index] if len(call.args) > index else None


MODULE_PREFIXES = {"tl", "triton", "libdevice", "math", "language"}


def is_method(node: ast.Call) -> bool:
    """x.to(...), x.sum(...): a call on a value, not a function of a module."""
    if not isinstance(node.func, ast.Attribute):
        return False
    base = dotted(node.func.value)
    return not base or base.split(".")[0] not in MODULE_PREFIXES


def is_arange_of(node: ast.AST, block: str) -> bool:
    """tl.arange(0, BLOCK)."""
    if not is_tl_call(node, "arange") or len(node.args) != 2:
        return False
    lo, hi = node.args
    return isinstance(lo, ast.Constant) and lo.value == 0 and isinstance(hi, ast.Name) and hi.id == block


def mentions(node: ast.AST, names: set[str] | str) -> bool:
    names = {names} if isinstance(names, str) else names
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


@dataclass
class Launch:
    """`kernel[grid](args...)` in host code."""

    call: ast.Call
    kernel: str
    grid: ast.expr
    func: ast.FunctionDef | None

    def keyword(self, name: str) -> ast.keyword | None:
        return next((kw for kw in self.call.keywords if kw.arg == name), None)

    def value_of(self, kernel: ast.FunctionDef, name: str) -> ast.expr | None:
        """The expression the launch passes for a kernel parameter (keyword or positional)."""
        kw = self.keyword(name)
        if kw is not None:
            return kw.value
        names = params(kernel)
        if name in names and names.index(name) < len(self.call.args):
            value = self.call.args[names.index(name)]
            return None if isinstance(value, ast.Starred) else value
        return None


def find_launches(tree: ast.Module, kernels: dict[str, ast.FunctionDef]) -> list[Launch]:
    parents = parent_map(tree)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in kernels):
            found.append(Launch(node, node.func.value.id, node.func.slice, enclosing_function(node, parents)))
    return sorted(found, key=lambda la: (la.call.lineno, la.call.col_offset))


def enclosing_function(node: ast.AST, parents: dict[int, ast.AST]) -> ast.FunctionDef | None:
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def module_constants(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level `NAME = expr`, last binding wins."""
    found = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            found[stmt.targets[0].id] = stmt.value
    return found


def host_value(expr: ast.expr | None, tree: ast.Module, func: ast.AST | None, line: int, depth: int = 0) -> int | None:
    """An int (or an upper bound of it, through min()) that a host expression has, if it is fixed."""
    if expr is None or depth > 8:
        return None
    again = lambda e: host_value(e, tree, func, line, depth + 1)
    if isinstance(expr, ast.Constant) and isinstance(expr.value, int) and not isinstance(expr.value, bool):
        return expr.value
    if isinstance(expr, ast.Name):
        return again(_binding(expr.id, tree, func, line))
    if isinstance(expr, ast.BinOp):
        a, b = again(expr.left), again(expr.right)
        return None if a is None or b is None else _arith(expr.op, a, b)
    if isinstance(expr, ast.Call):
        name = call_name(expr)
        values = [again(a) for a in expr.args]
        known = [v for v in values if v is not None]
        if name == "min" and known:
            return min(known)
        if name == "max" and values and len(known) == len(values):
            return max(known)
        if name == "next_power_of_2" and known:
            return 1 << max(0, (known[0] - 1).bit_length())
        if name == "cdiv" and len(known) == 2 and known[1]:
            return -(-known[0] // known[1])
    return None


def _binding(name: str, tree: ast.Module, func: ast.AST | None, line: int) -> ast.expr | None:
    if func is not None:
        stores = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == name
                  and isinstance(n.ctx, ast.Store) and n.lineno < line]
        if stores:
            last = max(stores, key=lambda n: (n.lineno, n.col_offset))
            simple = [a for a in ast.walk(func) if isinstance(a, ast.Assign) and a.targets == [last]]
            return simple[0].value if simple else None
        if name in params(func):
            return None
    return module_constants(tree).get(name)


def _arith(op: ast.operator, a: int, b: int) -> int | None:
    if isinstance(op, ast.Add):
        return a + b
    if isinstance(op, ast.Sub):
        return a - b
    if isinstance(op, ast.Mult):
        return a * b
    if isinstance(op, ast.FloorDiv) and b:
        return a // b
    if isinstance(op, ast.Mod) and b:
        return a % b
    if isinstance(op, ast.LShift):
        return a << b
    return None


def dtype_bytes(node: ast.AST | None, default: int = 4) -> int:
    return DTYPE_BYTES.get(dotted(node).rsplit(".", 1)[-1], default) if node is not None else default


# ------------------------------------------------------------------ symbolic tile shapes

Dim = int | str  # a literal size, or the source text of a constexpr expression ("BLOCK", "pad_hd // 2")


@dataclass(frozen=True)
class Info:
    shape: tuple[Dim, ...] | None  # () for scalars, None when unknown
    nbytes: int = 4  # per element

    def has(self, dim: str) -> bool:
        return self.shape is not None and dim in self.shape


SCALAR = Info(())
UNKNOWN = Info(None)


@dataclass
class Fact:
    """One thing a kernel does to a tile, with where it happens."""

    kind: str  # bind | reduce | scan | reshape | load | store | atomic | call
    node: ast.AST
    info: Info  # the bound value (bind), else the operand / pointer
    loops: tuple[ast.AST, ...]
    name: str = ""
    axis: int | None = None  # reduce/scan: the axis, normalised; None = all axes


def _broadcast(infos: list[Info]) -> Info:
    if any(i.shape is None for i in infos):
        return UNKNOWN
    rank = max((len(i.shape) for i in infos), default=0)
    dims = []
    for pos in range(rank):
        seen = {i.shape[pos - rank + len(i.shape)] for i in infos if pos - rank + len(i.shape) >= 0} - {1}
        dims.append(seen.pop() if len(seen) == 1 else (1 if not seen else "?"))
    tensors = [i.nbytes for i in infos if i.shape]
    return Info(tuple(dims), max(tensors) if tensors else 4)


class KernelShapes:
    """Symbolic shapes of a kernel's values, statement by statement, and the facts that matter
    for tiling and UB estimates. Conservative: what it cannot follow is UNKNOWN."""

    def __init__(self, fn: ast.FunctionDef):
        self.fn = fn
        self.env: dict[str, Info] = {p: SCALAR for p in params(fn)}
        self.facts: list[Fact] = []
        self.loops: list[ast.AST] = []
        self._stmts(fn.body)

    def _stmts(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self._stmt(stmt)

    def _stmt(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Assign):
            info = self.expr(stmt.value)
            for target in stmt.targets:
                self._bind(target, info if isinstance(target, ast.Name) else UNKNOWN, stmt)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            self._bind(stmt.target, self.expr(stmt.value), stmt)
        elif isinstance(stmt, ast.AugAssign):
            current = self.env.get(stmt.target.id, SCALAR) if isinstance(stmt.target, ast.Name) else UNKNOWN
            self._bind(stmt.target, _broadcast([current, self.expr(stmt.value)]), stmt)
        elif isinstance(stmt, (ast.For, ast.While)):
            if isinstance(stmt, ast.For):
                self.expr(stmt.iter)
                self._bind(stmt.target, SCALAR, stmt)
            else:
                self.expr(stmt.test)
            self.loops.append(stmt)
            self._stmts(stmt.body)
            self.loops.pop()
            self._stmts(stmt.orelse)
        elif isinstance(stmt, ast.If):
            self.expr(stmt.test)
            self._stmts(stmt.body)
            self._stmts(stmt.orelse)
        elif isinstance(stmt, (ast.Expr, ast.Return)) and stmt.value is not None:
            self.expr(stmt.value)
        elif isinstance(stmt, ast.With):
            self._stmts(stmt.body)

    def _bind(self, target: ast.AST, info: Info, stmt: ast.stmt) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = info
            self.facts.append(Fact("bind", stmt, info, tuple(self.loops), target.id))
        elif isinstance(target, ast.Tuple):
            for elt in target.elts:
                self._bind(elt, UNKNOWN, stmt)

    def _fact(self, kind: str, node: ast.AST, info: Info, axis: int | None = None) -> None:
        self.facts.append(Fact(kind, node, info, tuple(self.loops), axis=axis))

    def expr(self, node: ast.AST) -> Info:
        if isinstance(node, ast.Constant):
            return SCALAR
        if isinstance(node, ast.Name):
            return self.env.get(node.id, SCALAR)
        if isinstance(node, ast.Attribute):
            return SCALAR
        if isinstance(node, ast.BinOp):
            return _broadcast([self.expr(node.left), self.expr(node.right)])
        if isinstance(node, ast.Compare):
            return Info(_broadcast([self.expr(node.left)] + [self.expr(c) for c in node.comparators]).shape, 1)
        if isinstance(node, ast.BoolOp):
            return Info(_broadcast([self.expr(v) for v in node.values]).shape, 1)
        if isinstance(node, ast.UnaryOp):
            return self.expr(node.operand)
        if isinstance(node, ast.IfExp):
            self.expr(node.test)
            return _broadcast([self.expr(node.body), self.expr(node.orelse)])
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                self.expr(elt)
            return SCALAR
        return UNKNOWN

    def _subscript(self, node: ast.Subscript) -> Info:
        base = self.expr(node.value)
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base.shape is None or not all(_is_none(i) or _is_full_slice(i) for i in items):
            return UNKNOWN
        dims, rest = [], list(base.shape)
        for item in items:
            if _is_none(item):
                dims.append(1)
            elif rest:
                dims.append(rest.pop(0))
            else:
                return UNKNOWN
        return Info(tuple(dims + rest), base.nbytes)

    def _call(self, node: ast.Call) -> Info:
        name = call_name(node)
        args = [self.expr(a) for a in node.args]
        kwargs = {kw.arg: self.expr(kw.value) for kw in node.keywords if kw.arg}
        if is_method(node):
            return self._method(node, name)
        if name == "arange":
            return Info((_dim(node.args[1]) if _is_zero(node.args[0]) else "?",)) if len(node.args) == 2 else UNKNOWN
        if name in ("zeros", "full"):
            return self._constructor(node)
        if name in ("program_id", "num_programs", "static_assert", "device_assert", "debug_barrier", "range",
                    "static_range", "cdiv"):
            return SCALAR if name != "cdiv" else _broadcast(args)
        if name == "load":
            ptr = args[0] if args else kwargs.get("pointer", UNKNOWN)
            self._fact("load", node, ptr)
            return Info(ptr.shape, 4)
        if name in ("store", *ATOMICS):
            pointer = args[0] if args else kwargs.get("pointer", UNKNOWN)
            self._fact("store" if name == "store" else "atomic", node, pointer)
            return SCALAR if name == "store" else UNKNOWN
        if name == "cast":
            return Info(args[0].shape if args else None, dtype_bytes(arg(node, 1, "dtype")))
        if name in REDUCTIONS | SCANS:
            return self._reduce(node, name, args[0] if args else UNKNOWN, arg(node, 1, "axis"))
        if name in ELEMENTWISE or dotted(node.func).startswith("libdevice."):
            return _broadcast(args + list(kwargs.values()))
        kind = "reshape" if name in RESHAPES else "call"
        for info in args + list(kwargs.values()):
            self._fact(kind, node, info)
        return UNKNOWN if kind == "reshape" or any(i.shape != () for i in args + list(kwargs.values())) else SCALAR

    def _method(self, node: ast.Call, name: str) -> Info:
        this = self.expr(node.func.value)
        if name == "to":
            return Info(this.shape, dtype_bytes(arg(node, 0, "dtype")))
        if name in REDUCTIONS | SCANS:
            return self._reduce(node, name, this, arg(node, 0, "axis"))
        if name in ELEMENTWISE:
            return this
        self._fact("reshape" if name in RESHAPES else "call", node, this)
        return UNKNOWN if this.shape != () else SCALAR

    def _constructor(self, node: ast.Call) -> Info:
        shape = arg(node, 0, "shape")
        dtype = arg(node, 1 if call_name(node) == "zeros" else 2, "dtype")
        if isinstance(shape, (ast.List, ast.Tuple)):
            return Info(tuple(_dim(e) for e in shape.elts), dtype_bytes(dtype))
        return Info(("?",), dtype_bytes(dtype)) if shape is not None else UNKNOWN

    def _reduce(self, node: ast.Call, name: str, operand: Info, axis_node: ast.AST | None) -> Info:
        kind = "scan" if name in SCANS else "reduce"
        if operand.shape is None:
            self._fact(kind, node, operand)
            return UNKNOWN
        axis = None
        if isinstance(axis_node, ast.Constant) and isinstance(axis_node.value, int):
            axis = axis_node.value % max(1, len(operand.shape))
        elif axis_node is not None and not (isinstance(axis_node, ast.Constant) and axis_node.value is None):
            self._fact(kind, node, UNKNOWN)
            return UNKNOWN
        self._fact(kind, node, operand, axis)
        if kind == "scan":
            return operand
        if axis is None:
            return Info((), operand.nbytes)
        return Info(operand.shape[:axis] + operand.shape[axis + 1:], operand.nbytes)


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0


def _is_full_slice(node: ast.AST) -> bool:
    return isinstance(node, ast.Slice) and node.lower is None and node.upper is None and node.step is None


def _dim(node: ast.AST) -> Dim:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    return ast.unparse(node)


def eval_dim(dim: Dim, values: dict[str, int]) -> int | None:
    if isinstance(dim, int):
        return dim
    try:
        tree = ast.parse(dim, mode="eval").body
    except SyntaxError:
        return None
    return _eval_int(tree, values)


def _eval_int(node: ast.AST, values: dict[str, int]) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return values.get(node.id)
    if isinstance(node, ast.BinOp):
        a, b = _eval_int(node.left, values), _eval_int(node.right, values)
        return None if a is None or b is None else _arith(node.op, a, b)
    return None


def tile_bytes(info: Info, values: dict[str, int]) -> int | None:
    if info.shape is None:
        return None
    sizes = [eval_dim(d, values) for d in info.shape]
    return None if any(s is None for s in sizes) else math.prod(sizes) * info.nbytes


def live_peak(shapes: KernelShapes, values: dict[str, int]) -> tuple[int, list[tuple[str, int]], set[str]]:
    """(peak bytes of simultaneously live tiles, the tiles live at the peak, constexprs whose value
    is missing for some tile). Liveness: from first binding to last use; a tile read inside a loop
    it was bound outside of stays live to the loop's end."""
    sizes: dict[str, int] = {}
    missing: set[str] = set()
    first: dict[str, int] = {}
    for fact in shapes.facts:
        if fact.kind != "bind" or not fact.info.shape:
            continue
        size = tile_bytes(fact.info, values)
        if size is None:
            missing |= {n for d in fact.info.shape if isinstance(d, str) for n in _names_in(d) if n not in values}
            continue
        sizes[fact.name] = max(sizes.get(fact.name, 0), size)
        first.setdefault(fact.name, fact.node.lineno)
    last = dict(first)
    loops = [n for n in ast.walk(shapes.fn) if isinstance(n, (ast.For, ast.While))]
    for node in ast.walk(shapes.fn):
        if isinstance(node, ast.Name) and node.id in first and isinstance(node.ctx, ast.Load):
            end = node.lineno
            for loop in loops:
                inside = loop.lineno <= node.lineno <= loop.end_lineno
                if inside and not loop.lineno <= first[node.id] <= loop.end_lineno:
                    end = max(end, loop.end_lineno)
            last[node.id] = max(last[node.id], end)
    best, at = 0, []
    for line in sorted(set(first.values()) | set(last.values())):
        live = [(n, sizes[n]) for n in sizes if first[n] <= line <= last[n]]
        total = sum(s for _, s in live)
        if total > best:
            best, at = total, sorted(live, key=lambda p: -p[1])
    return best, at, missing


def _names_in(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", text))


def autotune_values(kernel: ast.FunctionDef, tree: ast.Module) -> dict[str, int]:
    """The largest value each constexpr takes in the kernel's @triton.autotune configs."""
    found: dict[str, int] = {}
    for dec in kernel.decorator_list:
        if not (isinstance(dec, ast.Call) and dotted(dec.func) in ("triton.autotune", "autotune")):
            continue
        configs = arg(dec, 0, "configs")
        if isinstance(configs, ast.Name):
            configs = module_constants(tree).get(configs.id)
        for call in ast.walk(configs) if configs is not None else ():
            if isinstance(call, ast.Call) and dotted(call.func) in ("triton.Config", "Config") \
                    and call.args and isinstance(call.args[0], ast.Dict):
                for key, value in zip(call.args[0].keys, call.args[0].values):
                    if isinstance(key, ast.Constant) and isinstance(value, ast.Constant) \
                            and isinstance(value.value, int) and not isinstance(value.value, bool):
                        found[key.value] = max(found.get(key.value, value.value), value.value)
    return found


def launch_constexprs(launch: Launch, kernel: ast.FunctionDef, tree: ast.Module) -> dict[str, int]:
    """Constexpr values of a launch (autotune configs give their largest value)."""
    values = autotune_values(kernel, tree)
    for name in constexprs(kernel):
        value = host_value(launch.value_of(kernel, name), tree, launch.func, launch.call.lineno)
        if value is not None:
            values[name] = value
    return values


def grid_dims(launch: Launch, tree: ast.Module) -> list[ast.expr] | None:
    """The grid's dimension expressions, when the grid is a tuple (directly or via one name)."""
    grid = launch.grid
    if isinstance(grid, ast.Name):
        grid = _binding(grid.id, tree, launch.func, launch.call.lineno)
    if isinstance(grid, (ast.Tuple, ast.List)):
        return list(grid.elts)
    return None


# ------------------------------------------------------------------ the source under lint


@dataclass
class Source:
    tree: ast.Module
    text: str
    kernels: dict[str, ast.FunctionDef] = field(default_factory=dict)
    launches: list[Launch] = field(default_factory=list)
    parents: dict[int, ast.AST] = field(default_factory=dict)
    kernel_nodes: set[int] = field(default_factory=set)

    @classmethod
    def parse(cls, text: str) -> Source:
        tree = ast.parse(text)
        kernels = kernel_defs(tree)
        src = cls(tree, text, kernels, find_launches(tree, kernels), parent_map(tree))
        src.kernel_nodes = {id(n) for fn in kernels.values() for n in ast.walk(fn)}
        return src

    def in_kernel(self, node: ast.AST) -> bool:
        return id(node) in self.kernel_nodes

    def kernel_walk(self) -> Iterator[ast.AST]:
        for fn in self.kernels.values():
            yield from ast.walk(fn)

    def host_walk(self) -> Iterator[ast.AST]:
        return (n for n in ast.walk(self.tree) if not self.in_kernel(n))

    def guarded(self, node: ast.AST) -> bool:
        """Inside the fallback branch of an `if torch_npu ...` / `except ImportError` guard."""
        child = node
        while id(child) in self.parents:
            parent = self.parents[id(child)]
            if isinstance(parent, (ast.If, ast.IfExp)) and mentions(parent.test, "torch_npu"):
                orelse = parent.orelse if isinstance(parent.orelse, list) else [parent.orelse]
                if any(child is n for n in orelse):
                    return True
            if isinstance(parent, ast.ExceptHandler) and _imports_torch_npu(self.parents.get(id(parent))):
                return True
            child = parent
        return False

    def loops_around(self, node: ast.AST) -> bool:
        while id(node) in self.parents:
            node = self.parents[id(node)]
            if isinstance(node, (ast.For, ast.While)):
                return True
            if isinstance(node, ast.FunctionDef):
                return False
        return False


def _imports_torch_npu(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Try) and any(
        isinstance(n, ast.Import) and any(a.name == "torch_npu" for a in n.names) for n in node.body)


Rule = Callable[[Source], Iterator[Finding]]


# ------------------------------------------------------------------ rules (ascend)


def rule_libdevice(src: Source) -> Iterator[Finding]:
    """Rule 9: the CUDA libdevice module does not exist on Ascend."""
    fix = "use triton.language.extra.ascend.libdevice (farm port guards the import)"
    for node in ast.walk(src.tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("triton.language.extra.cuda"):
            yield Finding(node.lineno, "libdevice-cuda", f"imports {node.module}: {fix}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("triton.language.extra.cuda"):
                    yield Finding(node.lineno, "libdevice-cuda", f"imports {alias.name}: {fix}")
        elif isinstance(node, ast.Attribute) and dotted(node).endswith("extra.cuda") and dotted(node) != "extra.cuda":
            yield Finding(node.lineno, "libdevice-cuda", f"uses {dotted(node)}: {fix}")


def rule_launch_options(src: Source) -> Iterator[Finding]:
    """Rule 8: num_warps / num_stages mean nothing on Ascend."""
    calls = [la.call for la in src.launches]
    calls += [n for n in ast.walk(src.tree) if isinstance(n, ast.Call)
              and dotted(n.func) in ("triton.Config", "Config")]
    for call in calls:
        for kw in call.keywords:
            if kw.arg in ("num_warps", "num_stages"):
                yield Finding(kw.value.lineno, "launch-options", f"{kw.arg} is ignored on Ascend; tune multibuffer, "
                              "BLOCK/BLOCK_SUB or the grid instead", "warning")


def rule_cuda_device(src: Source) -> Iterator[Finding]:
    """Rule 1-2: no 'cuda' device, torch.cuda, get_active_torch_device or SM counts on Ascend."""
    for node in src.host_walk():
        if src.guarded(node):
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and CUDA_DEVICE.match(node.value):
            if device_position(node, src.parents.get(id(node))):
                yield Finding(node.lineno, "cuda-device",
                              f"device string {node.value!r}: use the input's device (x.device) or 'npu'")
            else:
                yield Finding(node.lineno, "cuda-device", f"compares with {node.value!r}, which an NPU device is not",
                              "warning")
        elif isinstance(node, ast.Attribute) and dotted(node) == "torch.cuda":
            parent = src.parents.get(id(node))
            name = dotted(parent) if isinstance(parent, ast.Attribute) else "torch.cuda"
            yield Finding(node.lineno, "torch-cuda", f"{name}: use torch.npu on Ascend (import torch_npu)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" \
                and dotted(node.func) != "torch.cuda":
            yield Finding(node.lineno, "cuda-device", ".cuda(): move tensors with .to(device) instead")
        elif isinstance(node, ast.Attribute) and node.attr == "get_active_torch_device":
            yield Finding(node.lineno, "cuda-device", "get_active_torch_device() is missing from triton-ascend 3.2's "
                          "NPUDriver: use torch.device('npu', torch.npu.current_device())")
        elif _device_property(node):
            yield Finding(node.lineno, "device-props", f"{_device_property(node)}: Ascend device properties are "
                          "num_aicore / num_vectorcore (max_shared_mem is a dummy)")
        elif isinstance(node, ast.Attribute) and node.attr == "is_cuda":
            yield Finding(node.lineno, "cuda-device", ".is_cuda is False for NPU tensors", "warning")


def device_position(node: ast.AST, parent: ast.AST | None) -> bool:
    """Is a value used as a device: `device=`, torch.device(v), x.to(v), or `*dev* = v`?"""
    if isinstance(parent, ast.keyword):
        return parent.arg == "device"
    if isinstance(parent, ast.Call) and parent.args and parent.args[0] is node:
        return dotted(parent.func) == "torch.device" or call_name(parent) == "to"
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
        return bool(DEVICE_WORDS.search(parent.targets[0].id))
    return False


def _device_property(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute) and node.attr == "multi_processor_count":
        return "multi_processor_count"
    if isinstance(node, ast.Constant) and node.value in ("multiprocessor_count", "max_shared_mem"):
        return str(node.value)
    return ""


def rule_torch_npu(src: Source) -> Iterator[Finding]:
    """Rule 1: the module should import torch_npu (guarded) so 'npu' exists when it runs alone."""
    imports = [n for n in ast.walk(src.tree) if isinstance(n, ast.Import)]
    if src.launches and not any(a.name == "torch_npu" for n in imports for a in n.names):
        line = next((n.lineno for n in imports if any(a.name == "torch" for a in n.names)), 1)
        yield Finding(line, "torch-npu-import", "no `import torch_npu`: standalone use on Ascend needs it", "info")


def rule_grid(src: Source) -> Iterator[Finding]:
    """Rules 3-4: at most 65535 programs; grids that grow with the input should be persistent."""
    for launch in src.launches:
        line = launch.call.lineno
        if isinstance(launch.grid, ast.Lambda):
            yield Finding(line, "grid-limit", f"{launch.kernel}: a grid function cannot be checked; keep the "
                          f"product of its dims <= {GRID_LIMIT} or make the kernel persistent", "warning")
            continue
        dims = grid_dims(launch, src.tree)
        if dims is None:
            yield Finding(line, "grid-limit", f"{launch.kernel}: grid {ast.unparse(launch.grid)} is not a tuple; "
                          f"keep its product <= {GRID_LIMIT}", "warning")
            continue
        values = [host_value(d, src.tree, launch.func, line) for d in dims]
        if all(v is not None for v in values):
            if math.prod(values) > GRID_LIMIT:
                yield Finding(line, "grid-limit", f"{launch.kernel}: {math.prod(values)} programs > {GRID_LIMIT}")
            continue
        yield Finding(line, "grid-limit", f"{launch.kernel}: grid ({', '.join(ast.unparse(d) for d in dims)}) grows "
                      f"with the input; over {GRID_LIMIT} programs fails on Ascend: loop over tasks on "
                      "num_vectorcore programs (farm port makes it persistent)", "warning")


def rule_unified_buffer(src: Source, ub_bytes: int = UB_BYTES) -> Iterator[Finding]:
    """Rules 5-6: live tiles of a program must fit the 96 KB unified buffer."""
    shapes = {name: KernelShapes(fn) for name, fn in src.kernels.items()}
    for launch in src.launches:
        kernel = src.kernels[launch.kernel]
        values = launch_constexprs(launch, kernel, src.tree)
        peak, live, missing = live_peak(shapes[launch.kernel], values)
        top = ", ".join(f"{n} {s // 1024 or s} {'KB' if s >= 1024 else 'B'}" for n, s in live[:4])
        if peak > ub_bytes:
            yield Finding(launch.call.lineno, "ub-overflow", f"{launch.kernel}: about {peak // 1024} KB of live tiles "
                          f"({top}) > {ub_bytes // 1024} KB unified buffer: tile with BLOCK_SUB or lower the block")
        elif missing:
            names = ", ".join(sorted(missing))
            unit = _bytes_per_unit(shapes[launch.kernel], values, missing)
            limit = (f": about {unit} B live per unit of {names}, so {names} > {ub_bytes // unit} overflows the "
                     f"{ub_bytes // 1024} KB unified buffer") if unit else ""
            yield Finding(launch.call.lineno, "ub-overflow", f"{launch.kernel}: tile size {names} is set from the "
                          f"input{limit}; tile with BLOCK_SUB where the kernel allows", "warning")


def _bytes_per_unit(shapes: KernelShapes, values: dict[str, int], missing: set[str]) -> int:
    """Live bytes per unit of the missing constexpr(s), when exactly one is missing."""
    if len(missing) != 1:
        return 0
    return live_peak(shapes, {**values, next(iter(missing)): 1})[0]


def rule_dot(src: Source) -> Iterator[Finding]:
    """Rule 12: tl.dot has no bf16 out_dtype and no tf32 on Ascend; dot_scaled is missing."""
    for node in src.kernel_walk():
        if is_tl_call(node, "dot_scaled"):
            yield Finding(node.lineno, "dot-scaled", "tl.dot_scaled is not supported on Ascend")
        if not is_tl_call(node, "dot"):
            continue
        out = arg(node, 5, "out_dtype")
        if out is not None and dotted(out).rsplit(".", 1)[-1] in ("bfloat16", "bf16"):
            yield Finding(node.lineno, "dot-out-dtype", "tl.dot out_dtype=bfloat16 is rejected: compute in float32 "
                          "and cast")
        prec = arg(node, 3, "input_precision")
        if isinstance(prec, ast.Constant) and prec.value in ("tf32", "tf32x3"):
            yield Finding(node.lineno, "dot-precision",
                          f"input_precision={prec.value!r}: Ascend accepts 'ieee' or 'hf32'")
        tf32 = arg(node, 99, "allow_tf32")
        if isinstance(tf32, ast.Constant) and tf32.value is True:
            yield Finding(node.lineno, "dot-precision", "allow_tf32=True raises on Ascend: use input_precision='ieee'")
        if arg(node, 99, "max_num_imprecise_acc") is not None:
            yield Finding(node.lineno, "dot-precision", "max_num_imprecise_acc is ignored on Ascend", "info")


def rule_fp64_fp8(src: Source) -> Iterator[Finding]:
    """Rule 13: casts to or from fp64 and fp8 raise on Ascend."""
    for node in src.kernel_walk():
        if isinstance(node, ast.Attribute):
            leaf = node.attr
            if leaf in ("float64", "fp64"):
                yield Finding(node.lineno, "fp64",
                              f"{dotted(node) or leaf}: fp64 is unsupported on Ascend, use float32")
            elif leaf in FP8_TYPES:
                yield Finding(node.lineno, "fp8", f"{dotted(node) or leaf}: fp8 is unsupported on Ascend A2/A3")


def rule_int32_offsets(src: Source) -> Iterator[Finding]:
    """Rule 14: cast a program-id index to int64 before multiplying it by a stride."""
    for fn in src.kernels.values():
        for node, _ in int32_stride_products(fn):
            yield Finding(node.lineno, "int32-offset", f"{ast.unparse(node)}: int32 index times a stride can "
                          "overflow on large tensors; cast the index with .to(tl.int64) first", "warning")


def int32_stride_products(fn: ast.FunctionDef) -> list[tuple[ast.BinOp, ast.expr]]:
    """(product, its program-id side) for `pid * stride` where pid is int32 and stride a runtime argument."""
    runtime = set(params(fn)) - constexprs(fn) - pointer_params(fn)
    tainted: set[str] = set()
    found = []
    for node in _in_order(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            (tainted.add if _pid32(node.value, tainted) else tainted.discard)(node.targets[0].id)
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and _pid32(node.iter, tainted):
            tainted.add(node.target.id)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side, other in ((node.left, node.right), (node.right, node.left)):
                if isinstance(other, ast.Name) and other.id in runtime and _pid32(side, tainted):
                    found.append((node, side))
                    break
    return found


def _in_order(fn: ast.FunctionDef) -> list[ast.AST]:
    """Nodes of a function in source order (statements before their sub-expressions)."""
    nodes = [n for n in ast.walk(fn) if hasattr(n, "lineno") and n is not fn]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset, -getattr(n, "end_lineno", 0)))


def _pid32(node: ast.AST, tainted: set[str]) -> bool:
    """An int32 value derived from tl.program_id (not cast to int64, not loaded from memory)."""
    if isinstance(node, ast.Name):
        return node.id in tainted
    if is_tl_call(node, "program_id"):
        return True
    if isinstance(node, ast.Call) and call_name(node) == "to" and isinstance(node.func, ast.Attribute):
        return dtype_bytes(arg(node, 0, "dtype")) < 8 and _pid32(node.func.value, tainted)
    if isinstance(node, ast.BinOp):
        return _pid32(node.left, tainted) or _pid32(node.right, tainted)
    if isinstance(node, ast.Subscript):
        return _pid32(node.value, tainted)
    if isinstance(node, ast.Call) and call_name(node) in ("range", "static_range"):
        return any(_pid32(a, tainted) for a in node.args[:1])
    return False


def pointer_params(fn: ast.FunctionDef) -> set[str]:
    """Parameters used as the base of a load/store address (or named like pointers)."""
    names = set(params(fn))
    found = {n for n in names if n.endswith(("ptr", "_ptrs"))}
    for node in ast.walk(fn):
        if is_tl_call(node, "load", "store", *ATOMICS) and node.args:
            base = node.args[0]
            while isinstance(base, ast.BinOp):
                base = base.left
            if isinstance(base, ast.Name) and base.id in names:
                found.add(base.id)
    return found


def rule_unsupported_ops(src: Source) -> Iterator[Finding]:
    """Rules 10 and 15: inline PTX, tl.sort, permutes of non-adjacent axes, device_print."""
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Attribute) and node.attr == "inline_asm_elementwise":
            yield Finding(node.lineno, "inline-asm", "inline_asm_elementwise (PTX) cannot run on Ascend: use tl ops")
    for node in src.kernel_walk():
        if is_tl_call(node, "sort") or (isinstance(node, ast.Call) and call_name(node) == "sort"):
            yield Finding(node.lineno, "sort", "tl.sort is unsupported on Ascend (triton-ascend 3.2)")
        elif isinstance(node, ast.Call) and call_name(node) in ("permute", "trans"):
            dims = _literal_dims(node)
            if dims is not None and not _adjacent_swap(dims):
                yield Finding(node.lineno, "permute", f"{call_name(node)}{tuple(dims)} swaps non-adjacent axes, "
                              "unsupported on Ascend")
        elif is_tl_call(node, "device_print"):
            yield Finding(node.lineno, "device-print", "tl.device_print needs TRITON_DEVICE_PRINT=1 on Ascend", "info")


def _literal_dims(call: ast.Call) -> list[int] | None:
    items = call.args[1:] if is_tl_call(call, "permute", "trans") else call.args
    if len(items) == 1 and isinstance(items[0], (ast.Tuple, ast.List)):
        items = items[0].elts
    if items and all(isinstance(i, ast.Constant) and isinstance(i.value, int) for i in items):
        return [i.value for i in items]
    return None


def _adjacent_swap(dims: list[int]) -> bool:
    moved = [i for i, d in enumerate(dims) if d != i]
    return not moved or (len(moved) == 2 and moved[1] == moved[0] + 1)


def rule_atomics(src: Source) -> Iterator[Finding]:
    """Rule 11: no bitwise/xchg/cas atomics in loops, no 64-bit atomics; sem/scope are fixed."""
    for node in src.kernel_walk():
        if not is_tl_call(node, *ATOMICS):
            continue
        name = call_name(node)
        if name in LOOP_BANNED_ATOMICS and src.loops_around(node):
            yield Finding(node.lineno, "atomic-in-loop", f"tl.{name} inside a loop is not allowed on Ascend")
        value = arg(node, 2 if name == "atomic_cas" else 1, "val")
        wide = [n for n in ast.walk(value) if isinstance(n, ast.Attribute)
                and n.attr in ("int64", "float64", "uint64")] if value is not None else []
        if wide:
            yield Finding(node.lineno, "atomic-dtype", f"tl.{name} on {wide[0].attr}: Ascend has no 64-bit atomics",
                          "warning")
        for key, ok in (("sem", "acq_rel"), ("scope", "gpu")):
            given = arg(node, 99, key)
            if isinstance(given, ast.Constant) and given.value != ok:
                yield Finding(node.lineno, "atomic-sem", f"{key}={given.value!r} is treated as {ok!r} on Ascend",
                              "info")


ASCEND_RULES: list[Rule] = [
    rule_libdevice, rule_launch_options, rule_cuda_device, rule_torch_npu, rule_grid, rule_unified_buffer,
    rule_dot, rule_fp64_fp8, rule_int32_offsets, rule_unsupported_ops, rule_atomics,
]


# ------------------------------------------------------------------ rules (cuda)


def rule_ascend_only(src: Source) -> Iterator[Finding]:
    """Rule 16: Ascend-only language extras break community Triton."""
    extras = {"multibuffer", "compile_hint", "extract_slice", "insert_slice"}
    for node in src.kernel_walk():
        if is_tl_call(node, *extras):
            yield Finding(node.lineno, "ascend-only", f"tl.{call_name(node)} exists only in triton-ascend")
        if is_tl_call(node, "load") and arg(node, 99, "care_padding") is not None:
            yield Finding(node.lineno, "ascend-only", "tl.load(care_padding=...) exists only in triton-ascend")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.ImportFrom) and ".extra.ascend" in f".{node.module}" and not src.guarded(node) \
                and not _in_try(src, node):
            yield Finding(node.lineno, "ascend-only", f"imports {node.module} without a fallback")


def _in_try(src: Source, node: ast.AST) -> bool:
    parent = src.parents.get(id(node))
    return isinstance(parent, ast.Try) and any(node is n for n in parent.body)


CUDA_RULES: list[Rule] = [rule_ascend_only, rule_dot]
TARGETS: dict[str, list[Rule]] = {"ascend": ASCEND_RULES, "cuda": CUDA_RULES}


def lint(source: str, target: str = "ascend") -> list[Finding]:
    """Findings of every rule of the target, ordered by line."""
    rules = TARGETS.get(target)
    if rules is None:
        raise FarmError(f"unknown lint target '{target}' (--target); known: {', '.join(TARGETS)}")
    try:
        src = Source.parse(source)
    except SyntaxError as exc:
        return [Finding(exc.lineno or 1, "syntax", f"not valid Python: {exc.msg}")]
    found = {f for rule in rules for f in rule(src)}
    return sorted(found, key=lambda f: (f.line, SEVERITIES.index(f.severity), f.rule, f.message))


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]
