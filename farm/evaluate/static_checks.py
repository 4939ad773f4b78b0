"""Static checks of candidate source, before anything runs.

Each check is a small pure function `check_x(tree, source) -> str` returning a reason when the
candidate is not acceptable, or "" when it is. They catch what a kernel never needs and a
metric-gamer does: reaching for the reference data, the harness, the timer, other processes
or streams. Dynamic checks (farm.evaluate.evaluator) back every one of them up; these only make the
common exploits cheap to reject with a clear reason.
"""

from __future__ import annotations

import ast
import re
from typing import Callable

from farm import pyast
from farm.pyast import dotted_name as _dotted

# Rationale: a kernel module needs torch, triton and math; these reach the file system, other
# processes, the interpreter's internals or other threads.
BANNED_MODULES = {
    "pickle", "marshal", "shelve", "ctypes", "cffi", "subprocess", "socket", "threading", "_thread",
    "multiprocessing", "concurrent", "gc", "inspect", "importlib", "builtins", "signal", "shutil", "urllib",
    "http", "requests", "glob", "pathlib", "tempfile", "io", "mmap", "resource", "asyncio", "sched",
}
# Rationale: dotted names through which a candidate reads data it must not see (environment,
# saved tensors, caller frames) or bypasses the timer (side streams, replaced events).
BANNED_ATTRIBUTES = {
    "os.environ", "os.getenv", "os.system", "os.popen", "os.fork", "os.listdir", "os.walk", "os.open", "os.read",
    "os.scandir", "sys._getframe", "sys.modules", "sys.settrace", "sys.setprofile", "torch.load", "torch.cuda.Stream",
    "torch.cuda.stream", "torch.cuda.set_stream", "torch.npu.Stream", "torch.npu.stream", "torch.Stream",
    "torch.cuda.graphs", "torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.npu.graph",
}
BANNED_CALLS = {"open", "exec", "eval", "compile", "__import__", "globals", "breakpoint", "input", "getattr", "setattr"}
# Rationale: the reference store and process internals are reached through paths.
BANNED_PATHS = ("/proc/", ".farm", "refs/", ".pt")  # what the prompt tells a model
BANNED_STRINGS = re.compile(r"/proc/|\.farm\b|\brefs/|\.pt\b")
MONKEYPATCH_ROOTS = {"torch", "triton", "time", "os", "sys", "math", "numpy", "np"}




def check_defines_model_new(tree: ast.Module, source: str) -> str:
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        return "defines no top-level class ModelNew"
    return ""


def check_has_triton_kernel(tree: ast.Module, source: str) -> str:
    """The farm judges Triton kernels (DESIGN: candidates); anything else is told so plainly,
    naming what it is where that is recognisable (a CUDA/C++ extension is not PyTorch-only)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if _dotted(target) in ("triton.jit", "jit", "triton.autotune", "triton.heuristics"):
                    return ""
    return f"not a Triton kernel: {_what_instead(tree, source)}"


_EXTENSION_CALLS = {"load_inline": "CUDA/C++ compiled with torch.utils.cpp_extension.load_inline",
                    "load": "a C++/CUDA extension loaded with torch.utils.cpp_extension.load",
                    "CUDAExtension": "a CUDA extension", "RawKernel": "a CuPy raw CUDA kernel",
                    "SourceModule": "a PyCUDA kernel", "compile_kernel": "a CUDA kernel compiled at run time"}


def _what_instead(tree: ast.Module, source: str) -> str:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func).rsplit(".", 1)[-1]
            if name in _EXTENSION_CALLS and (name != "load" or "cpp_extension" in source):
                return f"the source defines no @triton.jit function; it uses {_EXTENSION_CALLS[name]}"
    return "the source defines no @triton.jit function (a forward that only calls PyTorch is no kernel either)"


def check_imports(tree: ast.Module, source: str) -> str:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if name.split(".")[0] in BANNED_MODULES:
                return f"imports {name} (line {node.lineno}), which a kernel does not need"
    return ""


def check_attributes(tree: ast.Module, source: str) -> str:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if any(name == b or name.startswith(b + ".") for b in BANNED_ATTRIBUTES):
                return f"uses {name} (line {node.lineno}): reads hidden state or escapes the timed stream"
    return ""


def check_calls(tree: ast.Module, source: str) -> str:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BANNED_CALLS:
            return f"calls {node.func.id}() (line {node.lineno}), which a kernel does not need"
    return ""


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def check_strings(tree: ast.Module, source: str) -> str:
    docs = _docstrings(tree)  # prose may mention a .pt file; only strings the code uses count
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if BANNED_STRINGS.search(node.value):
                return f"string {node.value[:40]!r} (line {node.lineno}) points at files a kernel must not read"
    return ""


def check_monkeypatching(tree: ast.Module, source: str) -> str:
    """Assigning to torch.*, triton.*, time.* ... replaces what the harness and timer call."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            name = _dotted(t) if isinstance(t, ast.Attribute) else ""
            if name and name.split(".")[0] in MONKEYPATCH_ROOTS:
                return f"assigns to {name} (line {node.lineno}): replaces library code the harness relies on"
    return ""


CHECKS: list[Callable[[ast.Module, str], str]] = [
    check_has_triton_kernel, check_imports, check_attributes, check_calls, check_strings, check_monkeypatching,
]


def static_verdict(source: str) -> tuple[str, str]:
    """('', '') if the source may run; else (verdict, reason) with verdict compile_error or cheat."""
    try:
        tree = pyast.parse(source)
    except SyntaxError as exc:
        return "compile_error", f"line {exc.lineno}: {exc.msg}"
    reason = check_defines_model_new(tree, source)
    if reason:
        return "compile_error", reason
    for check in CHECKS:
        reason = check(tree, source)
        if reason:
            return "cheat", reason
    return "", ""
