"""What every porting pass shares: the port context (core counts, limits), editing a source by
AST spans so comments and formatting elsewhere survive, and the module header (torch_npu import,
DEVICE, core-count constants) that ported sources carry."""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass, replace

from farm import pyast
from farm.ascend.lint import (
    UB_BYTES,
    mentions,
)
from farm.pyast import Positioned
from farm.pyast import dotted_name as dotted

log = logging.getLogger(__name__)

PURE_CALLS = {"cast", "to", "arange", "full", "zeros", "cdiv", "multiple_of", "max_contiguous", "constexpr"}

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
        """From a device description (num_vectorcore / num_aicore, as farm.evaluate.runner_child reports)."""
        device = device or {}
        base = cls()
        aicore = int(device.get("num_aicore") or base.num_aicore)
        vector = int(device.get("num_vectorcore") or 2 * aicore)
        return replace(cls(num_vectorcore=vector, num_aicore=aicore), **overrides)


class Edits:
    """A source, its AST, and edits addressed by AST positions (col_offset counts UTF-8 bytes)."""

    def __init__(self, text: str):
        self.text = text
        self.tree = pyast.parse(text)
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        self.edits: list[tuple[int, int, str]] = []

    def pos(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno <= len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode()[:col].decode("utf-8", "ignore"))

    def start(self, node: Positioned) -> int:
        return self.pos(node.lineno, node.col_offset)

    def end(self, node: Positioned) -> int:
        return self.pos(*pyast.end(node))

    def seg(self, node: Positioned) -> str:
        return self.text[self.start(node):self.end(node)]

    def replace(self, node: Positioned, new: str) -> None:
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


def _leading(src: Edits, node: Positioned) -> str:
    line = src.lines[node.lineno - 1]
    return line[:len(line) - len(line.lstrip())]


def _atomic(node: ast.AST) -> bool:
    return isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant))


def _paren(src: Edits, node: ast.expr) -> str:
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
    items: list[ast.expr | ast.keyword] = [*call.args, *call.keywords]
    if items:
        last = max(items, key=pyast.end)
        src.insert(src.end(last), f", {text}")
    else:
        src.insert(src.end(call) - 1, text)


def _plain_signature(fn: ast.FunctionDef) -> bool:
    a = fn.args
    return bool(a.args) and not (a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.posonlyargs)


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
        last = pyast.last_line(stmt)
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
            last = pyast.last_line(stmt)
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
    tree = pyast.parse(text)
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
    tree = pyast.parse(text)
    for stmt in tree.body:
        if isinstance(stmt, ast.Try) and any(isinstance(s, ast.Import) and any(a.name == "torch_npu" for a in s.names)
                                             for s in stmt.body):
            handler = stmt.handlers[0].body if stmt.handlers else []
            if any(isinstance(s, ast.Assign) and mentions(s, "torch_npu") for s in handler):
                return text
            return _replace_lines(text, stmt.lineno, pyast.last_line(stmt), TORCH_NPU)
        if isinstance(stmt, ast.Import) and [a.name for a in stmt.names] == ["torch_npu"] and not stmt.names[0].asname:
            return _replace_lines(text, stmt.lineno, pyast.last_line(stmt), TORCH_NPU)
    return _insert_lines(text, _imports_end(tree) + 1, TORCH_NPU)
