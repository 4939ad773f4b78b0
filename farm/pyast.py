"""Small helpers over Python syntax trees, shared by the tools that read or rewrite kernels
(static checks, tune, port, lint, the inductor capture)."""

from __future__ import annotations

import ast
import threading
from typing import Literal, overload


def dotted_name(node: ast.AST) -> str:
    """'torch.cuda.Stream' for the expression torch.cuda.Stream; '' unless rooted at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


# CPython 3.11 counts the depth of its parse-tree-to-object conversion per interpreter, not per
# thread: two threads parsing at once fail with "SystemError: AST constructor recursion depth
# mismatch" (the suite met it: ops searched at once in threads, --ops-per-device). One at a time.
_PARSING = threading.Lock()


@overload
def parse(source: str, filename: str = "<unknown>", mode: Literal["exec"] = "exec") -> ast.Module: ...


@overload
def parse(source: str, filename: str = "<unknown>", *, mode: Literal["eval"]) -> ast.Expression: ...


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """ast.parse, one thread of the process at a time. Typed as ast.parse is: a module, or an
    expression in mode "eval"."""
    with _PARSING:
        return ast.parse(source, filename, mode)
