"""Inductor's Triton kernels as plain @triton.jit functions: the sources found in its wrapper,
the triton_helpers they call copied in (renamed), and interpreter shims for the cpu target."""

from __future__ import annotations

import ast
import builtins

from farm import pyast
from farm.generators.inductor.layers import Unsupported
from farm.pyast import dotted_name as _dotted


def kernel_sources(wrapper: str) -> dict[str, str]:
    """name -> source of every `name = async_compile.triton('name', '''...''')` in the wrapper."""
    found: dict[str, str] = {}
    for node in pyast.parse(wrapper).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = _dotted(node.value.func)
            if func.startswith("async_compile."):
                if func != "async_compile.triton":
                    raise Unsupported(f"the wrapper compiles a {func.split('.', 1)[1]} kernel, not Triton")
                name, src = [a.value for a in node.value.args[:2]
                             if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                found[name] = src
    return found


def _free_names(fn: ast.FunctionDef) -> set[str]:
    bound = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
    bound |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


class _Usage:
    """What renaming met: libdevice functions shimmed, and those with no interpreter twin."""

    def __init__(self) -> None:
        self.shims: set[str] = set()
        self.missing: set[str] = set()


class _Renamer(ast.NodeTransformer):
    """Rewrites free names, `triton_helpers.x` and (cpu) `libdevice.x` inside jit functions."""

    def __init__(
        self, free: set[str], names: dict[str, str], helper_prefix: str | None, libdevice_to_math: bool, usage: _Usage
    ):
        self.free, self.names = free, names
        self.helper_prefix = helper_prefix
        self.libdevice_to_math = libdevice_to_math
        self.usage = usage

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.free and node.id in self.names:
            return ast.copy_location(ast.Name(self.names[node.id], node.ctx), node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        base = node.value
        if isinstance(base, ast.Name) and base.id in self.free:
            if base.id == "triton_helpers":
                if self.helper_prefix is not None:
                    return ast.copy_location(ast.Name(self.helper_prefix + node.attr, node.ctx), node)
                return node
            if base.id == "libdevice" and self.libdevice_to_math:
                import triton.language as tl

                if hasattr(tl.math, node.attr):
                    return ast.copy_location(pyast.parse(f"tl.math.{node.attr}", mode="eval").body, node)
                if node.attr in INTERPRETER_SHIMS:
                    self.usage.shims.add(node.attr)
                    return ast.copy_location(ast.Name(f"libdevice_{node.attr}", node.ctx), node)
                self.usage.missing.add(node.attr)
                return node
        self.generic_visit(node)
        return node


def _jit_functions(src: str, where: str) -> list[ast.FunctionDef]:
    """The @triton.jit functions of one inductor kernel module, heuristics decorators dropped."""
    out = []
    for node in pyast.parse(src).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and _dotted(node.value.func).startswith("triton_helpers.set_driver_to_")
        ):
            continue
        if isinstance(node, ast.FunctionDef):
            jit = [
                d
                for d in node.decorator_list
                if _dotted(d.func if isinstance(d, ast.Call) else d) in ("triton.jit", "jit")
            ]
            if not jit:
                raise Unsupported(f"{where}: function {node.name} is not a @triton.jit function")
            node.decorator_list = jit
            out.append(node)
            continue
        raise Unsupported(f"{where}: unsupported statement at line {node.lineno}: {ast.unparse(node)[:80]}")
    return out


def _helper_library() -> dict[str, ast.FunctionDef]:
    """The top-level @triton.jit functions of torch._inductor.runtime.triton_helpers, read from
    its file without importing it: importing torch._inductor changes Triton's interpreter for
    the rest of the process, and this runs in the search process."""
    from pathlib import Path

    import torch

    path = Path(torch.__file__).parent / "_inductor" / "runtime" / "triton_helpers.py"
    found = {}
    for node in pyast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and any(
            _dotted(d.func if isinstance(d, ast.Call) else d) == "triton.jit" for d in node.decorator_list
        ):
            found[node.name] = node
    return found


INTERPRETER_SHIMS = {
    "tanh": "@triton.jit\ndef libdevice_tanh(x):\n    return 2.0 * tl.sigmoid(2.0 * x) - 1.0",
    "isnan": "@triton.jit\ndef libdevice_isnan(x):\n    return x != x",
    "isinf": "@triton.jit\ndef libdevice_isinf(x):\n    return (x == float('inf')) | (x == float('-inf'))",
    # softplus: below 1e-4 the series (error ~x^3/3), above it log(1 + x) (absolute error ~6e-8)
    "log1p": "@triton.jit\ndef libdevice_log1p(x):\n    return tl.where(tl.abs(x) < 1e-4, x - 0.5 * x * x, "
    "tl.log(1.0 + x))",
    # ELU, SELU: below 1e-2 the series to x^4 (error ~x^5/120), above it exp(x) - 1 (relative
    # error ~6e-6 at 1e-2, less beyond)
    "expm1": "@triton.jit\ndef libdevice_expm1(x):\n    return tl.where(tl.abs(x) < 1e-2, "
    "x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0)))), tl.exp(x) - 1.0)",
}

_ALLOWED_FREE = {"tl", "triton", "libdevice", "tl_math"} | set(dir(builtins))


def _inline_helpers(needed: set[str], cpu: bool, usage: _Usage) -> list[str] | None:
    """Sources of the needed triton_helpers functions and everything they call, renamed
    triton_helpers_<name>; None if one of them needs more than tl/triton/libdevice/math."""
    library = _helper_library()
    order: list[str] = []
    todo = sorted(needed)
    while todo:
        name = todo.pop()
        if name in order:
            continue
        if name not in library:
            return None
        order.append(name)
        for free in _free_names(library[name]):
            if free in library and free not in order:
                todo.append(free)
    names = {n: "triton_helpers_" + n for n in order}
    names["math"] = "tl_math"  # triton_helpers' `math` is triton.language.math
    out = []
    for name in sorted(order):
        fn = pyast.parse(ast.unparse(library[name])).body[0]
        assert isinstance(fn, ast.FunctionDef)  # the text of one
        used = _free_names(fn)
        if used - set(names) - _ALLOWED_FREE:
            return None
        fn = _Renamer(used, names, "triton_helpers_", cpu, usage).visit(fn)
        fn.name = names[name]
        out.append(ast.unparse(ast.fix_missing_locations(fn)))
    return out


def _kernel_defs(kernels: dict[str, str], cpu: bool) -> tuple[list[str], dict[str, ast.FunctionDef], list[str]]:
    """(module-level source blocks, kernel name -> def, header imports)."""
    fns: dict[str, ast.FunctionDef] = {}
    seen_src: dict[str, str] = {}
    for kname, src in kernels.items():
        for fn in _jit_functions(src, kname):
            text = ast.unparse(fn)
            if fn.name in seen_src and seen_src[fn.name] != text:
                raise Unsupported(f"two different jit functions named {fn.name}")
            seen_src[fn.name] = text
            fns[fn.name] = fn
    helpers_used: set[str] = set()
    for fn in fns.values():
        helpers_used |= {
            n.attr
            for n in ast.walk(fn)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "triton_helpers"
        }
    usage = _Usage()
    inlined = _inline_helpers(helpers_used, cpu, usage) if helpers_used else []
    header, blocks = [], []
    if inlined is None:
        header.append("from torch._inductor.runtime import triton_helpers")
        prefix = None
    else:
        blocks.extend(inlined)
        prefix = "triton_helpers_"
    for name, fn in fns.items():
        fn = ast.fix_missing_locations(_Renamer(_free_names(fn), {}, prefix, cpu, usage).visit(fn))
        fns[name] = fn
        blocks.append(ast.unparse(fn))
    if usage.missing:
        raise Unsupported(
            f"libdevice function(s) {', '.join(sorted(usage.missing))} have no equivalent "
            "that the Triton interpreter runs"
        )
    blocks[:0] = [INTERPRETER_SHIMS[name] for name in sorted(usage.shims)]
    text = "\n".join(blocks)
    if "libdevice." in text:
        header.append("from triton.language.extra import libdevice")
    if "tl_math." in text:
        header.append("from triton.language import math as tl_math")
    return blocks, fns, header
