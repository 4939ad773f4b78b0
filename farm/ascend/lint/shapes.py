"""Symbolic tile shapes: what each value in a kernel holds (a scalar or a tile of symbolic
dimensions), so that unified-buffer use can be estimated from a launch's constexprs."""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

from farm import pyast
from farm.ascend.lint.analysis import (
    ATOMICS,
    ELEMENTWISE,
    REDUCTIONS,
    RESHAPES,
    SCANS,
    Launch,
    _arith,
    _binding,
    arg,
    call_name,
    constexprs,
    dtype_bytes,
    host_value,
    is_method,
    module_constants,
    params,
)
from farm.pyast import dotted_name as dotted

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
    node: ast.stmt | ast.expr
    info: Info  # the bound value (bind), else the operand / pointer
    loops: tuple[ast.AST, ...]
    name: str = ""
    axis: int | None = None  # reduce/scan: the axis, normalised; None = all axes


def _broadcast(infos: list[Info]) -> Info:
    shapes = [i.shape for i in infos if i.shape is not None]
    if len(shapes) < len(infos):
        return UNKNOWN
    rank = max((len(s) for s in shapes), default=0)
    dims: list[int | str] = []
    for pos in range(rank):
        seen = {s[pos - rank + len(s)] for s in shapes if pos - rank + len(s) >= 0} - {1}
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

    def _fact(self, kind: str, node: ast.expr, info: Info, axis: int | None = None) -> None:
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
        dims: list[int | str] = []
        rest = list(base.shape)
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
        assert isinstance(node.func, ast.Attribute)  # is_method(node)
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
        tree = pyast.parse(dim, mode="eval").body
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
    sizes = [s for d in info.shape if (s := eval_dim(d, values)) is not None]
    return None if len(sizes) < len(info.shape) else math.prod(sizes) * info.nbytes


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
                last_line = pyast.last_line(loop)
                inside = loop.lineno <= node.lineno <= last_line
                if inside and not loop.lineno <= first[node.id] <= last_line:
                    end = max(end, last_line)
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
                    if isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Constant) \
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
    grid: ast.expr | None = launch.grid
    if isinstance(grid, ast.Name):
        grid = _binding(grid.id, tree, launch.func, launch.call.lineno)
    if isinstance(grid, (ast.Tuple, ast.List)):
        return list(grid.elts)
    return None
