"""Port CUDA Triton sources to triton-ascend: source-to-source rewrite passes.

Each pass is a small pure function `pass_x(source, ctx) -> str`. It parses the source, finds
what one rule of the migration guide (docs/porting.md) forbids or advises, and edits exactly
those spans, so comments and formatting elsewhere survive. A pass that cannot show that its
rewrite keeps the kernel's meaning leaves that kernel alone; farm.lint reports what is left.
`port(source, ctx)` runs the passes in PASSES order.

Ported sources stay runnable off Ascend, on CUDA and in the CPU Triton interpreter that CI
checks them in: torch_npu is imported under try/except, devices come from the input tensors
(or a DEVICE constant with a fallback), libdevice falls back to the community module, and
core counts are module constants rather than device queries.
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from farm.lint import (
    UB_BYTES,
    KernelShapes,
    Source,
    call_name,
    constexprs,
    device_position,
    dotted,
    enclosing_function,
    find_launches,
    grid_dims,
    host_value,
    int32_stride_products,
    is_arange_of,
    is_kernel,
    is_method,
    is_tl_call,
    kernel_defs,
    launch_constexprs,
    live_peak,
    mentions,
    params,
)

log = logging.getLogger(__name__)

INDENT = "    "
MIN_SUB, MAX_SUB = 16, 1 << 16  # bounds of an automatically sized BLOCK_SUB


@dataclass(frozen=True)
class PortContext:
    num_vectorcore: int = 40  # A2 parts: 2 vector cores per AI core
    num_aicore: int = 20  # cube cores; persistent grids of kernels with tl.dot use these
    ub_bytes: int = UB_BYTES  # effective unified buffer (192 KB halved by double buffering)
    block_sub: int | None = None  # BLOCK_SUB (and BLOCK caps); None: sized from ub_bytes
    cores_scale: int = 1  # persistent grid = cores x this (extra programs run in batches)

    @classmethod
    def from_device(cls, device: dict | None, **overrides) -> PortContext:
        """From a device description (num_vectorcore / num_aicore, as farm.sandbox_child reports)."""
        device = device or {}
        base = cls()
        aicore = int(device.get("num_aicore") or base.num_aicore)
        vector = int(device.get("num_vectorcore") or 2 * aicore)
        return replace(cls(num_vectorcore=vector, num_aicore=aicore), **overrides)


# ------------------------------------------------------------------ editing sources by AST spans


class Edits:
    """A source, its AST, and edits addressed by AST positions (col_offset counts UTF-8 bytes)."""

    def __init__(self, text: str):
        self.text = text
        self.tree = ast.parse(text)
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        self.edits: list[tuple[int, int, str]] = []

    def pos(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno <= len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode()[:col].decode("utf-8", "ignore"))

    def start(self, node: ast.AST) -> int:
        return self.pos(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> int:
        return self.pos(node.end_lineno, node.end_col_offset)

    def seg(self, node: ast.AST) -> str:
        return self.text[self.start(node):self.end(node)]

    def replace(self, node: ast.AST, new: str) -> None:
        self.edits.append((self.start(node), self.end(node), new))

    def delete(self, start: int, end: int) -> None:
        self.edits.append((start, end, ""))

    def insert(self, at: int, new: str) -> None:
        self.edits.append((at, at, new))

    def result(self) -> str:
        """The text with every edit applied. An edit inside another one is dropped (the outer, or
        the first of two on the same span, wins); insertions at the edges of a replacement stay."""
        kept: list[tuple[int, int, int, str]] = []
        for seq, (s, e, new) in sorted(enumerate(self.edits), key=lambda p: (p[1][0], -p[1][1], p[0])):
            if any((a < s < b) if s == e else (a <= s and e <= b) for a, b, _, _ in kept):
                continue
            if any(a < s < b < e for a, b, _, _ in kept):
                raise ValueError("overlapping source edits")
            kept.append((s, e, seq, new))
        text = self.text
        for s, e, _, new in sorted(kept, key=lambda k: (k[0], k[1], k[2]), reverse=True):
            text = text[:s] + new + text[e:]
        return text


def _indent_lines(text: str, first: int, last: int, by: str = INDENT) -> str:
    lines = text.splitlines(keepends=True)
    for i in range(first - 1, min(last, len(lines))):
        if lines[i].strip():
            lines[i] = by + lines[i]
    return "".join(lines)


def _insert_lines(text: str, before: int, block: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[:before - 1]) + block + "".join(lines[before - 1:])


def _replace_lines(text: str, first: int, last: int, block: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[:first - 1]) + block + "".join(lines[last:])


def _leading(src: Edits, node: ast.AST) -> str:
    line = src.lines[node.lineno - 1]
    return line[:len(line) - len(line.lstrip())]


def _atomic(node: ast.AST) -> bool:
    return isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant))


def _paren(src: Edits, node: ast.AST) -> str:
    return src.seg(node) if _atomic(node) else f"({src.seg(node)})"


def _tl(tree: ast.Module) -> str:
    """The name triton.language is imported as."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "triton.language":
                    return alias.asname or "triton.language"
    return "tl"


def _body(fn: ast.FunctionDef) -> list[ast.stmt]:
    """A function's statements without its docstring."""
    first = fn.body[0]
    doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    return fn.body[1:] if doc and len(fn.body) > 1 else fn.body


def _unique(tree: ast.AST, base: str) -> str:
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {a.arg for a in ast.walk(tree)
                                                                          if isinstance(a, ast.arg)}
    name, i = base, 2
    while name in used:
        name, i = f"{base}{i}", i + 1
    return name


def _append_params(src: Edits, fn: ast.FunctionDef, text: str) -> None:
    """`, text` after a kernel's last parameter (its annotation included)."""
    src.insert(src.end(fn.args.args[-1]), f", {text}")


def _append_args(src: Edits, call: ast.Call, text: str) -> None:
    items = [*call.args, *call.keywords]
    if items:
        last = max(items, key=lambda n: (n.end_lineno, n.end_col_offset))
        src.insert(src.end(last), f", {text}")
    else:
        src.insert(src.end(call) - 1, text)


def _plain_signature(fn: ast.FunctionDef) -> bool:
    a = fn.args
    return bool(a.args) and not (a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.posonlyargs)


# ------------------------------------------------------------------ module header


HEADER_NAMES = ("DEVICE", "DEVICE_API", "NUM_VECTORCORE", "NUM_AICORE")


def _ours(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Assign) and [dotted(t) for t in stmt.targets] in ([n] for n in HEADER_NAMES)


def _header_end(tree: ast.Module) -> int:
    """The line after which module-level definitions go: after the docstring, leading imports
    (guarded ones included) and the constants the passes define."""
    last = 0
    for stmt in tree.body:
        doc = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        guarded = isinstance(stmt, ast.Try) and all(isinstance(s, (ast.Import, ast.ImportFrom, ast.Try))
                                                    for s in stmt.body)
        if not (doc or guarded or _ours(stmt) or isinstance(stmt, (ast.Import, ast.ImportFrom))):
            break
        last = stmt.end_lineno
    return last


def _imports_end(tree: ast.Module) -> int:
    """The last line of the leading docstring and imports (before any assignment)."""
    last = 0
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Try)) or (
                isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            if isinstance(stmt, ast.Try) and not all(isinstance(s, (ast.Import, ast.ImportFrom, ast.Try))
                                                     for s in stmt.body):
                break
            last = stmt.end_lineno
        else:
            break
    return last


def _module_names(tree: ast.Module) -> set[str]:
    names = set()
    for stmt in tree.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            names.add(stmt.name)
    return names


def _define(text: str, name: str, block: str) -> str:
    """Add a module-level definition after the imports unless the module binds the name already."""
    tree = ast.parse(text)
    if name in _module_names(tree):
        return text
    at = _header_end(tree)
    lines = text.splitlines()
    after_ours = any(_ours(s) and s.end_lineno == at for s in tree.body)
    before = "" if after_ours else "\n"
    after = "\n" if at < len(lines) and lines[at].strip() else ""
    return _insert_lines(text, at + 1, before + block + after)


TORCH_NPU = ("try:\n"
             "    import torch_npu  # noqa: F401 - registers the 'npu' device and torch.npu (Ascend only)\n"
             "except ImportError:\n"
             "    torch_npu = None\n")
DEVICE_LINE = 'DEVICE = "npu" if torch_npu is not None else ("cuda" if torch.cuda.is_available() else "cpu")\n'
DEVICE_API_LINE = "DEVICE_API = torch.npu if torch_npu is not None else torch.cuda\n"


def _cores_line(name: str, ctx: PortContext) -> str:
    if name == "NUM_AICORE":
        return f"NUM_AICORE = {ctx.num_aicore}  # Ascend AI (cube) cores: persistent grids of tl.dot kernels\n"
    return f"NUM_VECTORCORE = {ctx.num_vectorcore}  # Ascend vector cores: persistent grids of vector kernels\n"


def _with_torch_npu(text: str) -> str:
    """The guarded `import torch_npu`, replacing a bare one."""
    tree = ast.parse(text)
    for stmt in tree.body:
        if isinstance(stmt, ast.Try) and any(isinstance(s, ast.Import) and any(a.name == "torch_npu" for a in s.names)
                                             for s in stmt.body):
            handler = stmt.handlers[0].body if stmt.handlers else []
            if any(isinstance(s, ast.Assign) and mentions(s, "torch_npu") for s in handler):
                return text
            return _replace_lines(text, stmt.lineno, stmt.end_lineno, TORCH_NPU)
        if isinstance(stmt, ast.Import) and [a.name for a in stmt.names] == ["torch_npu"] and not stmt.names[0].asname:
            return _replace_lines(text, stmt.lineno, stmt.end_lineno, TORCH_NPU)
    return _insert_lines(text, _imports_end(tree) + 1, TORCH_NPU)


# ------------------------------------------------------------------ (a) libdevice


def _guarded_libdevice(indent: str, suffix: str, names: str) -> str:
    """Rule 9: triton-ascend 3.2 has extra.ascend.libdevice, its main branch extra.cann.libdevice;
    community Triton's extra.libdevice dispatches to the active backend."""
    return (f"{indent}try:\n"
            f"{indent}    from triton.language.extra.ascend{suffix} import {names}  # triton-ascend 3.2\n"
            f"{indent}except ImportError:\n"
            f"{indent}    try:\n"
            f"{indent}        from triton.language.extra.cann{suffix} import {names}  # triton-ascend main\n"
            f"{indent}    except ImportError:\n"
            f"{indent}        from triton.language.extra{suffix} import {names}  # community Triton\n")


def _alias_text(alias: ast.alias) -> str:
    return f"{alias.name} as {alias.asname}" if alias.asname else alias.name


def pass_libdevice(source: str, ctx: PortContext) -> str:
    """CUDA libdevice imports and `tl.extra.cuda.libdevice.f` uses -> the Ascend module, guarded."""
    src = Edits(source)
    statements: list[tuple[ast.stmt, str]] = []
    need_name = False
    for node in ast.walk(src.tree):
        if isinstance(node, ast.ImportFrom) and node.module == "triton.language.extra.cuda" \
                and all(a.name == "libdevice" for a in node.names):
            names = ", ".join(map(_alias_text, node.names))
            statements.append((node, _guarded_libdevice(_leading(src, node), "", names)))
        elif isinstance(node, ast.ImportFrom) and node.module == "triton.language.extra.cuda.libdevice":
            names = ", ".join(map(_alias_text, node.names))
            statements.append((node, _guarded_libdevice(_leading(src, node), ".libdevice", names)))
        elif isinstance(node, ast.Import) and len(node.names) == 1 \
                and node.names[0].name == "triton.language.extra.cuda.libdevice":
            asname = node.names[0].asname or "libdevice"
            need_name |= not node.names[0].asname
            names = "libdevice" if asname == "libdevice" else f"libdevice as {asname}"
            statements.append((node, _guarded_libdevice(_leading(src, node), "", names)))
        elif isinstance(node, ast.Attribute) and dotted(node).endswith("extra.cuda.libdevice"):
            src.replace(node, "libdevice")
            need_name = True
    text = src.result()
    for stmt, block in sorted(statements, key=lambda p: -p[0].lineno):
        text = _replace_lines(text, stmt.lineno, stmt.end_lineno, block)
    if need_name and "libdevice" not in _module_names(ast.parse(text)):
        text = _insert_lines(text, _header_end(ast.parse(text)) + 1, _guarded_libdevice("", "", "libdevice"))
    return text


# ------------------------------------------------------------------ (b) num_warps / num_stages

CUDA_LAUNCH_OPTIONS = {"num_warps", "num_stages"}


def _drop_keywords(src: Edits, call: ast.Call, names: set[str]) -> list[ast.keyword]:
    items = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
    gone = [i for i in items if isinstance(i, ast.keyword) and i.arg in names]
    for item in gone:
        idx = next(k for k, i in enumerate(items) if i is item)
        before = [i for i in items[:idx] if all(i is not g for g in gone)]
        after = [i for i in items[idx + 1:] if all(i is not g for g in gone)]
        if before:
            src.delete(src.end(before[-1]), src.end(item))
        elif after:
            src.delete(src.start(item), src.start(after[0]))
        else:
            end = src.end(item)
            comma = re.match(r"\s*,", src.text[end:])
            src.delete(src.start(item), end + (comma.end() if comma else 0))
    return gone


def pass_launch_options(source: str, ctx: PortContext) -> str:
    """Rule 8: strip num_warps / num_stages from launches and triton.Config, and the locals
    that only fed them."""
    src = Edits(source)
    kernels = kernel_defs(src.tree)
    calls = [la.call for la in find_launches(src.tree, kernels)]
    calls += [n for n in ast.walk(src.tree) if isinstance(n, ast.Call)
              and dotted(n.func) in ("triton.Config", "Config")]
    dropped = [kw for call in calls for kw in _drop_keywords(src, call, CUDA_LAUNCH_OPTIONS)]
    _drop_dead_locals(src, dropped)
    return src.result()


def _drop_dead_locals(src: Edits, dropped: list[ast.keyword]) -> None:
    """`num_warps = ...` statements whose name is read only by keywords that were removed."""
    inside = {id(n) for kw in dropped for n in ast.walk(kw.value)}
    names = {n.id for kw in dropped for n in ast.walk(kw.value) if isinstance(n, ast.Name)}
    for fn in (n for n in ast.walk(src.tree) if isinstance(n, ast.FunctionDef) and not is_kernel(n)):
        for name in names:
            uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == name]
            loads = [n for n in uses if isinstance(n.ctx, ast.Load)]
            stores = [n for n in uses if isinstance(n.ctx, ast.Store)]
            if not stores or any(id(n) not in inside for n in loads):
                continue
            assigns = [s for s in ast.walk(fn) if isinstance(s, ast.Assign) and len(s.targets) == 1
                       and isinstance(s.targets[0], ast.Name) and s.targets[0].id == name]
            if len(assigns) == len(stores) and all(_alone_on_lines(src, s, fn) for s in assigns):
                for s in assigns:
                    src.delete(src.starts[s.lineno - 1], src.starts[s.end_lineno])


def _alone_on_lines(src: Edits, stmt: ast.stmt, fn: ast.FunctionDef) -> bool:
    others = [s for s in ast.walk(fn) if isinstance(s, ast.stmt) and s is not stmt and s is not fn
              and not (s.lineno > stmt.end_lineno or s.end_lineno < stmt.lineno)]
    line = src.lines[stmt.end_lineno - 1]
    tail = line.encode()[stmt.end_col_offset:].decode("utf-8", "ignore").strip()
    head = src.lines[stmt.lineno - 1][:stmt.col_offset]
    return not others and (not tail or tail.startswith("#")) and not head.strip()


# ------------------------------------------------------------------ (c) devices

CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
TENSOR_ATTRS = {"shape", "device", "dtype", "stride", "numel", "contiguous", "size", "is_contiguous", "view", "reshape",
                "dim", "element_size", "data_ptr", "new_empty", "float", "half"}


def _tensor_param(fn: ast.FunctionDef | None) -> str | None:
    """The first argument of a host function that is used as a tensor."""
    if fn is None:
        return None
    used = {n.value.id for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.attr in TENSOR_ATTRS}
    return next((a for a in params(fn) if a != "self" and a in used), None)


def pass_device(source: str, ctx: PortContext) -> str:
    """Rules 1-2: guarded `import torch_npu`; 'cuda' devices -> the input's device (or DEVICE);
    torch.cuda.X -> DEVICE_API.X; .cuda() -> .to(DEVICE); SM counts -> NUM_VECTORCORE."""
    lint_src = Source.parse(source)
    src = Edits(source)
    need: set[str] = set()
    for node in lint_src.host_walk():
        if lint_src.guarded(node):
            continue
        parent = lint_src.parents.get(id(node))
        new = _device_rewrite(src, node, parent, enclosing_function(node, lint_src.parents))
        if new is not None and _binds_device(node, lint_src):
            new = re.sub(r"\bDEVICE\b", f"({DEVICE_LINE.split(' = ', 1)[1].strip()})", new)
        if new is not None:
            src.replace(node, new)
            need |= {n for n in ("DEVICE_API", "DEVICE", "NUM_VECTORCORE") if re.search(rf"\b{n}\b", new)}
    text = _with_torch_npu(src.result())
    for name, block in (("NUM_VECTORCORE", _cores_line("NUM_VECTORCORE", ctx)), ("DEVICE_API", DEVICE_API_LINE),
                        ("DEVICE", DEVICE_LINE)):
        if name in need:
            text = _define(text, name, block)
    return text


def _binds_device(node: ast.AST, src) -> bool:
    """Inside the module's own `DEVICE = ...`, where the DEVICE constant cannot be used."""
    while id(node) in src.parents and not isinstance(src.parents[id(node)], ast.Module):
        node = src.parents[id(node)]
    return isinstance(node, ast.Assign) and any(dotted(t) == "DEVICE" for t in node.targets)


def _device_rewrite(src: Edits, node: ast.AST, parent: ast.AST | None, fn: ast.FunctionDef | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and CUDA_STRING.match(node.value) \
            and device_position(node, parent):
        tensor = _tensor_param(fn)
        if node.value == "cuda":
            return f"{tensor}.device" if tensor else "DEVICE"
        return f'torch.device(str(DEVICE).split(":")[0], {node.value[5:]})'  # DEVICE may be a str or a device
    if isinstance(node, ast.Attribute) and node.attr == "multi_processor_count":
        return "NUM_VECTORCORE"
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
            and node.slice.value == "multiprocessor_count":
        return "NUM_VECTORCORE"
    if isinstance(node, ast.Attribute) and dotted(node) == "torch.cuda" and isinstance(parent, ast.Attribute):
        return "DEVICE_API"
    if isinstance(node, ast.Call) and call_name(node) == "get_active_torch_device":
        return "torch.device(DEVICE)"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" \
            and not node.args and dotted(node.func) != "torch.cuda":
        return f"{_paren(src, node.func.value)}.to(DEVICE)"
    return None


# ------------------------------------------------------------------ (f) tl.dot, (g) fp64


def pass_dot(source: str, ctx: PortContext) -> str:
    """Rule 12: out_dtype=bfloat16 -> float32 then a cast; tf32 precisions -> "ieee"."""
    src = Edits(source)
    tl = _tl(src.tree)
    for fn in kernel_defs(src.tree).values():
        for node in ast.walk(fn):
            if is_tl_call(node, "dot"):
                _fix_dot(src, node, tl)
    return src.result()


def _fix_dot(src: Edits, call: ast.Call, tl: str) -> None:
    for kw in call.keywords:
        if kw.arg == "out_dtype" and dotted(kw.value).rsplit(".", 1)[-1] in ("bfloat16", "bf16"):
            src.replace(kw.value, f"{tl}.float32")
            acc = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "acc"), None)
            if acc is not None and not (isinstance(acc, ast.Constant) and acc.value is None):
                src.replace(acc, f"{_paren(src, acc)}.to({tl}.float32)")
            src.insert(src.end(call), f".to({tl}.bfloat16)")
        elif kw.arg == "input_precision" and isinstance(kw.value, ast.Constant) \
                and kw.value.value in ("tf32", "tf32x3"):
            src.replace(kw.value, '"ieee"')
        elif kw.arg == "allow_tf32":
            has_precision = any(k.arg == "input_precision" for k in call.keywords)
            if has_precision:
                _drop_keywords(src, call, {"allow_tf32"})
            else:
                src.replace(kw, 'input_precision="ieee"')


def pass_fp64(source: str, ctx: PortContext) -> str:
    """Rule 13: tl.float64 in kernels -> tl.float32 (fp8 is left for lint to report)."""
    src = Edits(source)
    for fn in kernel_defs(src.tree).values():
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and node.attr in ("float64", "fp64") and dotted(node):
                src.replace(node, f"{src.seg(node.value)}.float32")
    return src.result()


# ------------------------------------------------------------------ (h) int64 offsets


def pass_int64(source: str, ctx: PortContext) -> str:
    """Rule 14: `pid * stride` -> `pid.to(tl.int64) * stride` for program-id indices."""
    src = Edits(source)
    tl = _tl(src.tree)
    for fn in kernel_defs(src.tree).values():
        for _, side in int32_stride_products(fn):
            if not _atomic(side):
                src.insert(src.start(side), "(")
            src.insert(src.end(side), f".to({tl}.int64)" if _atomic(side) else f").to({tl}.int64)")
    return src.result()


# ------------------------------------------------------------------ (e) two-level tiling


def _launches_pass(tree: ast.Module, name: str, block: str) -> list:
    """The kernel's launches, if every one passes `block` by keyword (else [])."""
    launches = [la for la in find_launches(tree, kernel_defs(tree)) if la.kernel == name]
    ok = launches and all(la.keyword(block) is not None and all(kw.arg for kw in la.call.keywords) for la in launches)
    return launches if ok else []


def _tile_cap(tree: ast.Module, fn: ast.FunctionDef, block: str, launches: list, ctx: PortContext) -> int:
    """BLOCK_SUB: ctx.block_sub, else the largest power of two whose live tiles fit the UB."""
    if ctx.block_sub:
        return ctx.block_sub
    values = {name: 8 for name in constexprs(fn)}
    values.update(launch_constexprs(launches[0], fn, tree))
    values[block] = 1
    per_element = max(live_peak(KernelShapes(fn), values)[0], 4)
    cap = 1 << max(0, (ctx.ub_bytes // per_element).bit_length() - 1)
    return max(MIN_SUB, min(MAX_SUB, cap))


def _block_candidates(tree: ast.Module, fn: ast.FunctionDef, ctx: PortContext) -> list[tuple[str, int, list]]:
    """(constexpr, cap, launches) for every tl.arange(0, B) block worth tiling, largest first."""
    found = []
    for block in sorted(constexprs(fn)):
        if not any(is_arange_of(n, block) for n in ast.walk(fn)):
            continue
        launches = _launches_pass(tree, fn.name, block)
        if not launches:
            continue
        cap = _tile_cap(tree, fn, block, launches, ctx)
        sizes = [host_value(la.keyword(block).value, tree, la.func, la.call.lineno) for la in launches]
        if all(s is not None and s <= cap for s in sizes):
            continue  # already small enough: nothing to gain
        found.append((block, cap, launches, max((s or 1 << 30) for s in sizes)))
    return [(b, c, la) for b, c, la, _ in sorted(found, key=lambda f: -f[3])]


def subtile_region(fn: ast.FunctionDef, block: str) -> list[ast.stmt] | None:
    """The statements to run in `for sub in range(0, BLOCK, BLOCK_SUB)`, if every lane of the
    block is independent there: no reduction, scan or reshape across the block axis, every store
    indexed by it, no atomics, no return. None when the kernel does not allow it."""
    body = _body(fn)
    first = next((i for i, s in enumerate(body) if any(is_arange_of(n, block) for n in ast.walk(s))), None)
    if first is None:
        return None
    region = body[first:]
    inside = {id(n) for s in region for n in ast.walk(s)}
    for fact in KernelShapes(fn).facts:
        if id(fact.node) not in inside:
            if fact.kind == "bind" and fact.info.has(block):
                return None
        elif not _lane_independent(fact, block):
            return None
    shapes_ok = {id(c.args[0]) for s in region for c in ast.walk(s) if is_tl_call(c, "zeros", "full") and c.args}
    for node in (n for s in region for n in ast.walk(s)):
        if isinstance(node, (ast.Return, ast.FunctionDef, ast.Lambda, ast.While)):
            return None
        if call_name(node) == "arange" and mentions(node, block) and not is_arange_of(node, block):
            return None
        if isinstance(node, (ast.List, ast.Tuple)) and mentions(node, block) and id(node) not in shapes_ok:
            return None
    return region


def _lane_independent(fact, block: str) -> bool:
    info = fact.info
    if fact.kind == "bind":
        return info.shape is not None
    if fact.kind in ("reduce", "scan"):
        if info.shape is None:
            return False
        return not info.has(block) if fact.axis is None else info.shape[fact.axis] != block
    if fact.kind in ("reshape", "call"):
        return info.shape is not None and not info.has(block)
    if fact.kind == "store":
        return info.has(block)
    if fact.kind == "atomic":
        return False
    return info.shape is not None


def _subtile(source: str, name: str, block: str, cap: int) -> str:
    src = Edits(source)
    fn = kernel_defs(src.tree)[name]
    region = subtile_region(fn, block)
    sub, sub_block = _unique(fn, "sub"), _unique(src.tree, f"{block}_SUB")
    tl = _tl(src.tree)
    for node in (n for s in region for n in ast.walk(s)):
        if is_arange_of(node, block):
            src.replace(node, f"({sub} + {src.seg(node.func)}(0, {sub_block}))")
        elif is_tl_call(node, "zeros", "full") and node.args and isinstance(node.args[0], (ast.List, ast.Tuple)):
            for elt in node.args[0].elts:
                if isinstance(elt, ast.Name) and elt.id == block:
                    src.replace(elt, sub_block)
    _append_params(src, fn, f"{sub_block}: {tl}.constexpr")
    for launch in _launches_pass(src.tree, name, block):
        _append_args(src, launch.call, f"{sub_block}=min({src.seg(launch.keyword(block).value)}, {cap})")
    first, last, indent = region[0].lineno, region[-1].end_lineno, _leading(src, region[0])
    text = _indent_lines(src.result(), first, last)
    return _insert_lines(text, first, f"{indent}for {sub} in range(0, {block}, {sub_block}):\n")


def cap_allowed(fn: ast.FunctionDef, block: str) -> bool:
    """True when the kernel walks its data in `block`-sized chunks (a loop whose range depends on
    the block) so that any power-of-two block gives the same result: tiles are loaded and stored
    only inside those loops, a tile bound outside them is an arange or an accumulator reduced
    after the loop with the op that fills it, and nothing else carries state across chunks."""
    loops = _chunk_loops(fn, block)
    if not loops:
        return False
    in_chunk = lambda fact: any(loop in loops for loop in fact.loops)
    accumulators = _accumulators(fn, loops)
    if accumulators is None:
        return False
    for fact in KernelShapes(fn).facts:
        tile = fact.info.shape is None or fact.info.has(block)
        if fact.kind in ("load", "store", "atomic") and tile and not in_chunk(fact):
            return False
        if fact.kind in ("store", "atomic") and in_chunk(fact) and not fact.info.has(block):
            return False
        if fact.kind in ("reshape", "call", "scan") and tile:
            return False
        if fact.kind == "reduce" and tile and (in_chunk(fact) or not _reduces_accumulator(fact, accumulators)):
            return False
        if fact.kind == "bind" and tile and not in_chunk(fact) and not _tile_source(fact.node):
            return False
    return _block_uses_ok(fn, block, loops)


def _chunk_loops(fn: ast.FunctionDef, block: str) -> list[ast.For]:
    derived = {block}
    for _ in range(4):
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and mentions(node.value, derived) and not _tile_source(node):
                derived.add(node.targets[0].id)
    return [n for n in ast.walk(fn) if isinstance(n, ast.For) and mentions(n.iter, derived)]


def _tile_source(stmt: ast.AST) -> bool:
    value = getattr(stmt, "value", None)
    return is_tl_call(value, "arange", "zeros", "full")


def _accumulators(fn: ast.FunctionDef, loops: list[ast.For]) -> dict[str, str] | None:
    """Names bound before a chunk loop and updated in it: each must be `acc += e` (from tl.zeros)
    or `acc = tl.maximum/minimum(acc, e)`; name -> the reduction that may consume it."""
    found: dict[str, str] = {}
    outside = {t.id for s in ast.walk(fn) if isinstance(s, (ast.Assign, ast.AnnAssign))
               and not any(_within(s, loop) for loop in loops)
               for t in (s.targets if isinstance(s, ast.Assign) else [s.target]) if isinstance(t, ast.Name)}
    for loop in loops:
        for stmt in (s for s in ast.walk(loop) if isinstance(s, (ast.Assign, ast.AugAssign)) and s is not loop):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                if not isinstance(target, ast.Name) or target.id not in outside:
                    continue
                kind = _update_kind(stmt, target.id)
                if kind is None or found.get(target.id, kind) != kind or not _zero_start(fn, target.id, kind):
                    return None
                found[target.id] = kind
    return found


def _within(node: ast.AST, loop: ast.AST) -> bool:
    return loop.lineno <= node.lineno <= loop.end_lineno and node is not loop


def _update_kind(stmt: ast.stmt, name: str) -> str | None:
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) and not mentions(stmt.value, name):
        return "sum"
    value = getattr(stmt, "value", None)
    if is_tl_call(value, "maximum", "minimum") and len(value.args) == 2 \
            and isinstance(value.args[0], ast.Name) and value.args[0].id == name and not mentions(value.args[1], name):
        return "max" if call_name(value) == "maximum" else "min"
    return None


def _zero_start(fn: ast.FunctionDef, name: str, kind: str) -> bool:
    """A sum accumulator must start from tl.zeros (a max/min one from anything)."""
    inits = [s.value for s in ast.walk(fn) if isinstance(s, ast.Assign) and len(s.targets) == 1
             and isinstance(s.targets[0], ast.Name) and s.targets[0].id == name]
    return kind != "sum" or bool(inits) and is_tl_call(inits[0], "zeros")


def _reduces_accumulator(fact, accumulators: dict[str, str]) -> bool:
    call = fact.node
    operand = call.func.value if is_method(call) else (call.args[0] if call.args else None)
    return (isinstance(operand, ast.Name) and accumulators.get(operand.id) == call_name(call)
            and fact.axis in (None, 0) and len(fact.info.shape or ()) == 1)


def _block_uses_ok(fn: ast.FunctionDef, block: str, loops: list[ast.For]) -> bool:
    """The block size itself is read only as the chunk step: in loop ranges, `i * BLOCK` with i a
    chunk loop's index, tile shapes, or names that only feed loop ranges."""
    iters = {id(n) for loop in loops for n in ast.walk(loop.iter)}
    loop_vars = {loop.target.id for loop in loops if isinstance(loop.target, ast.Name)}
    feeds = {id(n) for s in ast.walk(fn) if isinstance(s, ast.Assign) and len(s.targets) == 1
             and isinstance(s.targets[0], ast.Name) and all(id(u) in iters for u in ast.walk(fn)
                                                              if isinstance(u, ast.Name) and u.id == s.targets[0].id
                                                              and isinstance(u.ctx, ast.Load))
             for n in ast.walk(s.value)}
    shapes = {id(n) for c in ast.walk(fn) if is_tl_call(c, "arange", "zeros", "full") for n in ast.walk(c)}
    muls = {id(side) for b in ast.walk(fn) if isinstance(b, ast.BinOp) and isinstance(b.op, ast.Mult)
            for side, other in ((b.left, b.right), (b.right, b.left))
            if isinstance(other, ast.Name) and other.id in loop_vars}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == block and isinstance(node.ctx, ast.Load) \
                and not {id(node)} & (iters | feeds | shapes | muls):
            return False
    return True


def _cap_block(source: str, name: str, block: str, cap: int) -> str:
    src = Edits(source)
    for launch in _launches_pass(src.tree, name, block):
        value = launch.keyword(block).value
        src.replace(value, f"min({src.seg(value)}, {cap})")
    return src.result()


def pass_tile(source: str, ctx: PortContext) -> str:
    """Rules 5-6: keep live tiles within the unified buffer. A block whose lanes are independent
    gets BLOCK_SUB and `for sub in range(0, BLOCK, BLOCK_SUB)`; a block that is only a chunk size
    of the kernel's own loop is capped at the launch (`BLOCK=min(BLOCK, cap)`)."""
    for name in list(kernel_defs(ast.parse(source))):
        tree = ast.parse(source)
        fn = kernel_defs(tree)[name]
        if not _plain_signature(fn) or any(p.endswith("_SUB") for p in constexprs(fn)):
            continue
        for block, cap, _ in _block_candidates(tree, fn, ctx):
            if subtile_region(fn, block) is not None:
                source = _subtile(source, name, block, cap)
                break
            if cap_allowed(fn, block):
                source = _cap_block(source, name, block, cap)
                break
    return source


# ------------------------------------------------------------------ (d) persistent grids


def _early_returns_removed(source: str, name: str) -> str | None:
    """`if c: return` at the kernel's top level -> `if not (c):` around the rest; a final bare
    return is dropped. None when another return remains (it would end the persistent loop)."""
    for _ in range(16):
        src = Edits(source)
        body = _body(kernel_defs(src.tree)[name])
        last = body[-1]
        if isinstance(last, ast.Return) and last.value is None and len(body) > 1:
            source = _replace_lines(source, last.lineno, last.end_lineno, "")
            continue
        guard = next((i for i, s in enumerate(body) if isinstance(s, ast.If) and not s.orelse and len(s.body) == 1
                      and isinstance(s.body[0], ast.Return) and s.body[0].value is None), None)
        if guard is None:
            fn = kernel_defs(src.tree)[name]
            return None if any(isinstance(n, ast.Return) for n in ast.walk(fn)) else source
        stmt, rest = body[guard], body[guard + 1:]
        head = f"{_leading(src, stmt)}if not ({src.seg(stmt.test)}):\n"
        if not rest:
            source = _replace_lines(source, stmt.lineno, stmt.end_lineno, "")
            continue
        source = _indent_lines(source, rest[0].lineno, rest[-1].end_lineno)
        source = _replace_lines(source, stmt.lineno, stmt.end_lineno, head)
    return None


def _program_ids(fn: ast.FunctionDef) -> list[tuple[ast.Call, int]] | None:
    found = []
    for node in ast.walk(fn):
        if is_tl_call(node, "num_programs"):
            return None  # already loops over programs
        if is_tl_call(node, "program_id"):
            axis = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "axis"), None)
            if not (isinstance(axis, ast.Constant) and isinstance(axis.value, int)):
                return None
            found.append((node, axis.value))
    return found


def _persistent_plan(tree: ast.Module, name: str) -> tuple[list, list[list[ast.expr]]] | None:
    """The launches and their grid dims, when the kernel can loop over its programs."""
    kernels = kernel_defs(tree)
    fn = kernels[name]
    ids = _program_ids(fn)
    launches = [la for la in find_launches(tree, kernels) if la.kernel == name]
    if not ids or not launches or not _plain_signature(fn):
        return None
    helpers = {c.func.id for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    if any(_program_ids(kernels[h]) != [] for h in helpers & set(kernels)):
        return None  # a helper reads program ids itself
    dims = [grid_dims(la, tree) for la in launches]
    if any(d is None for d in dims) or len({len(d) for d in dims}) != 1 or not 1 <= len(dims[0]) <= 3:
        return None
    if max(axis for _, axis in ids) >= len(dims[0]) \
            or any(kw.arg is None for la in launches for kw in la.call.keywords):
        return None
    return launches, dims


def _make_persistent(source: str, name: str, ctx: PortContext) -> str:
    if _persistent_plan(ast.parse(source), name) is None:
        return source
    flat = _early_returns_removed(source, name)
    plan = _persistent_plan(ast.parse(flat), name) if flat is not None else None
    if plan is None:
        return source
    src = Edits(flat)
    launches, dims = _persistent_plan(src.tree, name)
    fn = kernel_defs(src.tree)[name]
    tl, rank = _tl(src.tree), len(dims[0])
    pids = [_unique(src.tree, f"pid{k}") for k in range(rank)]
    sizes = [_unique(src.tree, f"num_pid{k}") for k in range(rank)]
    reuse = _pid_statement(fn) if rank == 1 else None
    if reuse is not None:  # `pid = tl.program_id(0)` becomes the loop variable itself
        pids[0] = reuse.targets[0].id
        src.delete(src.starts[reuse.lineno - 1], src.starts[reuse.end_lineno])
    cast = rank == 1 and _pid_is_receiver(fn, pids[0])
    for call, axis in _program_ids(fn):
        if reuse is None or call is not reuse.value:
            src.replace(call, pids[axis])
    _append_params(src, fn, ", ".join(sizes))
    cores = "NUM_AICORE" if any(is_tl_call(n, "dot") for n in ast.walk(fn)) else "NUM_VECTORCORE"
    scaled = f"{ctx.cores_scale} * {cores}" if ctx.cores_scale > 1 else cores
    for launch, grid in zip(launches, dims):
        named = isinstance(launch.grid, ast.Name)
        texts = [f"{launch.grid.id}[{k}]" if named else _paren(src, d) for k, d in enumerate(grid)]
        values = [f"{launch.grid.id}[{k}]" if named else src.seg(d) for k, d in enumerate(grid)]
        src.replace(launch.grid, f"(min({' * '.join(texts)}, {scaled}),)")
        _append_args(src, launch.call, ", ".join(f"{s}={v}" for s, v in zip(sizes, values)))
    text = src.result()
    body = _body(kernel_defs(ast.parse(text))[name])
    indent = _leading(Edits(text), body[0])
    head = _loop_head(indent, tl, pids, sizes, _unique(fn, "task"), cast)
    text = _insert_lines(_indent_lines(text, body[0].lineno, body[-1].end_lineno), body[0].lineno, head)
    return _define(text, cores, _cores_line(cores, ctx))


def _pid_statement(fn: ast.FunctionDef) -> ast.Assign | None:
    """A top-level `pid = tl.program_id(0)` whose name is bound nowhere else."""
    for stmt in _body(fn):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and is_tl_call(stmt.value, "program_id"):
            target = stmt.targets[0].id
            stores = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == target
                      and isinstance(n.ctx, ast.Store)]
            if len(stores) == 1 and len(_body(fn)) > 1 and _program_ids(fn) and \
                    all(a == 0 for _, a in _program_ids(fn)):
                return stmt
    return None


def _pid_is_receiver(fn: ast.FunctionDef, name: str) -> bool:
    """Is the program id used as a tensor (`pid.to(...)`)? A range() index is a Python int in the
    interpreter, so the loop then casts it to a tensor as tl.program_id returns one."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            if is_tl_call(receiver, "program_id") or (isinstance(receiver, ast.Name) and receiver.id == name):
                return True
    return False


def _loop_head(indent: str, tl: str, pids: list[str], sizes: list[str], task: str, cast: bool) -> str:
    """for task in range(program_id, tasks, num_programs), recovering (pid0, pid1, ...) row-major."""
    first, step = f"{tl}.program_id(0)", f"{tl}.num_programs(0)"
    if len(pids) == 1 and not cast:
        return f"{indent}for {pids[0]} in range({first}, {sizes[0]}, {step}):\n"
    lines = [f"{indent}for {task} in range({first}, {' * '.join(sizes)}, {step}):\n"]
    if cast:
        return lines[0] + f"{indent}{INDENT}{pids[0]} = {tl}.cast({task}, {tl}.int32)\n"
    for k, pid in enumerate(pids):
        inner = " * ".join(sizes[k + 1:])
        value = f"{task} // ({inner})" if k + 1 < len(sizes) - 1 else (f"{task} // {inner}" if inner else task)
        if k > 0:
            value = f"{value} % {sizes[k]}"
        lines.append(f"{indent}{INDENT}{pid} = {value}\n")
    return "".join(lines)


def pass_persistent(source: str, ctx: PortContext) -> str:
    """Rules 3-4: grids of up to 3 dims -> (min(tasks, cores),) programs looping over the tasks
    with the original program ids recovered; other grids are left for lint to report."""
    for name in list(kernel_defs(ast.parse(source))):
        source = _make_persistent(source, name, ctx)
    return source


# ------------------------------------------------------------------ all passes

Pass = Callable[[str, PortContext], str]
PASSES: list[tuple[str, Pass]] = [
    ("libdevice", pass_libdevice),
    ("launch_options", pass_launch_options),
    ("device", pass_device),
    ("dot", pass_dot),
    ("fp64", pass_fp64),
    ("int64", pass_int64),
    ("tile", pass_tile),
    ("persistent", pass_persistent),
]


def port(source: str, ctx: PortContext | None = None, passes: list[str] | None = None) -> str:
    """Run the named passes (default all) in order. A pass that fails or yields invalid Python is
    skipped, so a source the passes do not understand comes back unchanged rather than broken."""
    ctx = ctx or PortContext()
    for name, fn in PASSES:
        if passes is not None and name not in passes:
            continue
        try:
            out = fn(source, ctx)
            ast.parse(out)
        except Exception:
            log.warning("port pass %s failed; skipped", name, exc_info=True)
            continue
        source = out
    return source

