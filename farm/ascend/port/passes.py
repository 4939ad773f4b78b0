"""The local rewrites: libdevice imports, CUDA launch options, hard-coded devices, tl.dot
operand types, fp64, and int64 offsets."""

from __future__ import annotations

import ast
import re

from farm import pyast
from farm.ascend.lint import (
    Source,
    call_name,
    device_position,
    enclosing_function,
    find_launches,
    int32_stride_products,
    is_kernel,
    is_tl_call,
    kernel_defs,
    params,
)
from farm.ascend.lint.analysis import Function
from farm.ascend.port.edits import (
    DEVICE_API_LINE,
    DEVICE_LINE,
    Edits,
    PortContext,
    _atomic,
    _cores_line,
    _define,
    _header_end,
    _insert_lines,
    _leading,
    _module_names,
    _paren,
    _replace_lines,
    _tl,
    _with_torch_npu,
)
from farm.pyast import dotted_name as dotted


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
        text = _replace_lines(text, stmt.lineno, pyast.last_line(stmt), block)
    if need_name and "libdevice" not in _module_names(pyast.parse(text)):
        text = _insert_lines(text, _header_end(pyast.parse(text)) + 1, _guarded_libdevice("", "", "libdevice"))
    return text


CUDA_LAUNCH_OPTIONS = {"num_warps", "num_stages"}


def _drop_keywords(src: Edits, call: ast.Call, names: set[str]) -> list[ast.keyword]:
    items: list[ast.expr | ast.keyword] = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
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
                    src.delete(src.starts[s.lineno - 1], src.starts[pyast.last_line(s)])


def _alone_on_lines(src: Edits, stmt: ast.stmt, fn: ast.FunctionDef) -> bool:
    last, end_col = pyast.end(stmt)
    others = [s for s in ast.walk(fn) if isinstance(s, ast.stmt) and s is not stmt and s is not fn
              and not (s.lineno > last or pyast.last_line(s) < stmt.lineno)]
    line = src.lines[last - 1]
    tail = line.encode()[end_col:].decode("utf-8", "ignore").strip()
    head = src.lines[stmt.lineno - 1][:stmt.col_offset]
    return not others and (not tail or tail.startswith("#")) and not head.strip()


CUDA_STRING = re.compile(r"^cuda(:\d+)?$")

TENSOR_ATTRS = {"shape", "device", "dtype", "stride", "numel", "contiguous", "size", "is_contiguous", "view", "reshape",
                "dim", "element_size", "data_ptr", "new_empty", "float", "half"}


def _tensor_param(fn: Function | None) -> str | None:
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
        if lint_src.guarded(node) or not isinstance(node, ast.expr):  # only expressions are rewritten
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


def _device_rewrite(src: Edits, node: ast.expr, parent: ast.AST | None, fn: Function | None) -> str | None:
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
