"""The source under lint and the rules: one small function `rule_x(src) -> Iterator[Finding]` per
rule of the migration guide (docs/porting.md); `lint()` runs a target's rules."""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from farm import pyast
from farm.ascend.lint.analysis import (
    ATOMICS,
    CUDA_DEVICE,
    DEVICE_WORDS,
    FP8_TYPES,
    GRID_LIMIT,
    LOOP_BANNED_ATOMICS,
    NEWER_THAN_ASCEND,
    SEVERITIES,
    UB_BYTES,
    Finding,
    Launch,
    arg,
    call_name,
    constexprs,
    dtype_bytes,
    find_launches,
    host_value,
    is_tl_call,
    kernel_defs,
    mentions,
    params,
    parent_map,
)
from farm.ascend.lint.shapes import KernelShapes, grid_dims, launch_constexprs, live_peak
from farm.errors import FarmError
from farm.pyast import dotted_name as dotted


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
        tree = pyast.parse(text)
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
        elif isinstance(node, (ast.Attribute, ast.Constant)) and _device_property(node):
            yield Finding(node.lineno, "device-props", f"{_device_property(node)}: Ascend device properties are "
                          "num_aicore / num_vectorcore (max_shared_mem is a dummy)")
        elif isinstance(node, ast.Attribute) and node.attr == "is_cuda":
            if _in_assert(src, node):  # the frontend check's recording stopped on one (AKG mean_kernel)
                yield Finding(node.lineno, "cuda-device", "asserts .is_cuda, which is False for NPU tensors: "
                              "the forward fails on Ascend")
            else:
                yield Finding(node.lineno, "cuda-device", ".is_cuda is False for NPU tensors", "warning")


def _in_assert(src: Source, node: ast.AST | None) -> bool:
    while node is not None and not isinstance(node, (ast.stmt, ast.Module)):
        node = src.parents.get(id(node))
    return isinstance(node, ast.Assert)


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
        values = [v for d in dims if (v := host_value(d, src.tree, launch.func, line)) is not None]
        if len(values) == len(dims):
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
    return sorted(nodes, key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0), -getattr(n, "end_lineno", 0)))


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
    """Rules 10 and 15: inline PTX, tl.sort, permutes of non-adjacent axes, device_print, and tl
    functions newer than triton-ascend 3.2."""
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
        elif is_tl_call(node, *NEWER_THAN_ASCEND):
            yield Finding(node.lineno, "newer-triton-api", f"tl.{call_name(node)} is not in triton-ascend 3.2's "
                          "language (a later Triton API): rewrite it with 3.2 ops")


def _literal_dims(call: ast.Call) -> list[int] | None:
    items = call.args[1:] if is_tl_call(call, "permute", "trans") else call.args
    if len(items) == 1 and isinstance(items[0], (ast.Tuple, ast.List)):
        items = items[0].elts
    values = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, int)]
    return values if items and len(values) == len(items) else None


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
