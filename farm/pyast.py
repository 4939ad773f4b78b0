"""Small helpers over Python syntax trees, shared by the tools that read or rewrite kernels
(static checks, tune, port, lint, the inductor capture)."""

from __future__ import annotations

import ast
import threading
from typing import Literal, Protocol, overload


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


class Positioned(Protocol):
    """A node with a place in its source: a statement, expression, argument, keyword, ..."""

    lineno: int
    col_offset: int
    end_lineno: int | None
    end_col_offset: int | None


def end(node: Positioned) -> tuple[int, int]:
    """(line, column) where a parsed node ends. The stubs type them Optional, for nodes built by
    hand; the tools position only nodes the parser made, which always have them."""
    if node.end_lineno is None or node.end_col_offset is None:
        raise ValueError(f"{type(node).__name__} at line {node.lineno} has no end (built, not parsed)")
    return node.end_lineno, node.end_col_offset


def last_line(node: Positioned) -> int:
    return end(node)[0]


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
