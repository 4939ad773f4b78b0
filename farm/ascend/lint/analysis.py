"""What the lint rules and the porting passes read from a kernel's source: kernels, launches,
host values, dtype sizes, and the constants of the migration guide."""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass
from typing import TypeGuard

from farm.pyast import dotted_name as dotted

# a def of host code, where a launch or a binding is looked for
Function = ast.FunctionDef | ast.AsyncFunctionDef

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

NEWER_THAN_ASCEND = {"reduce_or", "map_elementwise", "squeeze", "unsqueeze", "atomic_load", "atomic_store"}

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


def is_kernel(fn: ast.AST) -> TypeGuard[ast.FunctionDef]:
    return isinstance(fn, ast.FunctionDef) and any(
        dotted(d.func if isinstance(d, ast.Call) else d) in JIT_DECORATORS for d in fn.decorator_list)


def kernel_defs(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if is_kernel(n)}


def params(fn: Function) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def constexprs(fn: Function) -> set[str]:
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


def is_tl_call(node: ast.AST | None, *names: str) -> TypeGuard[ast.Call]:
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


def is_arange_of(node: ast.AST, block: str) -> TypeGuard[ast.Call]:
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
    func: Function | None

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


def enclosing_function(node: ast.AST, parents: dict[int, ast.AST]) -> Function | None:
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


def host_value(expr: ast.expr | None, tree: ast.Module, func: Function | None, line: int, depth: int = 0) -> int | None:
    """An int (or an upper bound of it, through min()) that a host expression has, if it is fixed."""
    if expr is None or depth > 8:
        return None
    def again(e):
        return host_value(e, tree, func, line, depth + 1)

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


def _binding(name: str, tree: ast.Module, func: Function | None, line: int) -> ast.expr | None:
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
