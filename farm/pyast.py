"""Small helpers over Python syntax trees, shared by the tools that read or rewrite kernels
(static checks, tune, port, lint, the inductor capture)."""

from __future__ import annotations

import ast


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
