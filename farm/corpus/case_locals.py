"""Sizes a task file keeps as int literals inside get_inputs (`batch_size = 16`, AKG's style),
made settable per case of a shape space. Imports nothing of Kernel Farm: `farm export` copies
this file into a package as `_locals.py`, where the package's tests draw cases the same way.

get_inputs is recompiled from the file's source with each `name = <int literal>` statement at
the top of its body reading `__farm_case__.get("get_inputs.<name>", <literal>)`: with no case
applied it draws exactly what the file says. The file itself is never changed.
"""

from __future__ import annotations

import ast
import types
from typing import Any, Callable

LOCAL_PREFIX = "get_inputs."
CASE_GLOBAL = "__farm_case__"


def expose_locals(module: types.ModuleType, source: str, filename: str,
                  parse: Callable[..., ast.Module] = ast.parse) -> dict[str, int]:
    """Replace module.get_inputs by the rewritten one; returns {"get_inputs.<name>": literal}."""
    fn = getattr(module, "get_inputs", None)
    known = getattr(fn, "__farm_locals__", None)
    if known is not None:
        return known
    try:
        tree = parse(source, filename)
    except SyntaxError:
        return {}
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_inputs"), None)
    code_obj = getattr(fn, "__code__", None)
    if node is None or code_obj is None or code_obj.co_firstlineno != (
            node.decorator_list[0].lineno if node.decorator_list else node.lineno):
        return {}  # get_inputs was made some other way: leave it
    found: dict[str, int] = {}
    for stmt in node.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Constant) and type(stmt.value.value) is int and stmt.value.value >= 2):
            name = LOCAL_PREFIX + stmt.targets[0].id
            found[name] = stmt.value.value
            stmt.value = ast.copy_location(ast.Call(
                func=ast.Attribute(ast.Name(CASE_GLOBAL, ast.Load()), "get", ast.Load()),
                args=[ast.Constant(name), stmt.value], keywords=[]), stmt.value)
    if not found:
        return {}
    code = compile(ast.fix_missing_locations(ast.Module([node], [])), filename, "exec")
    module.__dict__.setdefault(CASE_GLOBAL, {})
    scope: dict[str, Any] = {}
    exec(code, module.__dict__, scope)  # noqa: S102 - the task's own function, already executed once
    new = scope["get_inputs"]
    new.__farm_locals__ = found
    module.__dict__["get_inputs"] = new
    return found
