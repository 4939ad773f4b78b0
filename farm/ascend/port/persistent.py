"""Persistent grids: a launch with more programs than AI cores becomes one program per core
looping over the tasks, where the kernel's meaning provably allows it."""

from __future__ import annotations

import ast

from farm import pyast
from farm.ascend.lint import (
    call_name,
    find_launches,
    grid_dims,
    is_tl_call,
    kernel_defs,
    mentions,
)
from farm.ascend.port.edits import (
    INDENT,
    PURE_CALLS,
    Edits,
    PortContext,
    _append_args,
    _append_params,
    _body,
    _cores_line,
    _define,
    _indent_lines,
    _insert_lines,
    _leading,
    _paren,
    _plain_signature,
    _replace_lines,
    _tl,
    _unique,
)


def _early_returns_removed(source: str, name: str) -> str | None:
    """`if c: return` at the kernel's top level -> `if not (c):` around the rest; a final bare
    return is dropped. None when another return remains (it would end the persistent loop)."""
    for _ in range(16):
        src = Edits(source)
        body = _body(kernel_defs(src.tree)[name])
        last = body[-1]
        if isinstance(last, ast.Return) and last.value is None and len(body) > 1:
            source = _replace_lines(source, last.lineno, pyast.last_line(last), "")
            continue
        guard = next((i for i, s in enumerate(body) if isinstance(s, ast.If) and not s.orelse and len(s.body) == 1
                      and isinstance(s.body[0], ast.Return) and s.body[0].value is None), None)
        if guard is None:
            fn = kernel_defs(src.tree)[name]
            return None if any(isinstance(n, ast.Return) for n in ast.walk(fn)) else source
        stmt, rest = body[guard], body[guard + 1:]
        assert isinstance(stmt, ast.If)  # as the guard was found
        head = f"{_leading(src, stmt)}if not ({src.seg(stmt.test)}):\n"
        if not rest:
            source = _replace_lines(source, stmt.lineno, pyast.last_line(stmt), "")
            continue
        source = _indent_lines(source, rest[0].lineno, pyast.last_line(rest[-1]))
        source = _replace_lines(source, stmt.lineno, pyast.last_line(stmt), head)
    return None


def _program_ids(fn: ast.FunctionDef) -> list[tuple[ast.Call, int]] | None:
    found: list[tuple[ast.Call, int]] = []
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
    found = [grid_dims(la, tree) for la in launches]
    dims = [d for d in found if d is not None]
    if len(dims) < len(found) or len({len(d) for d in dims}) != 1 or not 1 <= len(dims[0]) <= 3:
        return None
    if max(axis for _, axis in ids) >= len(dims[0]) \
            or any(kw.arg is None for la in launches for kw in la.call.keywords):
        return None
    return launches, dims


def _make_persistent(source: str, name: str, ctx: PortContext) -> str:
    if _persistent_plan(pyast.parse(source), name) is None:
        return source
    flat = _early_returns_removed(source, name)
    if flat is None:
        return source
    src = Edits(flat)
    plan = _persistent_plan(src.tree, name)
    if plan is None:
        return source
    launches, dims = plan
    fn = kernel_defs(src.tree)[name]
    tl, rank = _tl(src.tree), len(dims[0])
    pids = [_unique(src.tree, f"pid{k}") for k in range(rank)]
    sizes = [_unique(src.tree, f"num_pid{k}") for k in range(rank)]
    reuse = _pid_statement(fn) if rank == 1 else None
    if reuse is not None:  # `pid = tl.program_id(0)` becomes the loop variable itself
        target = reuse.targets[0]
        assert isinstance(target, ast.Name)  # as _pid_statement found it
        pids[0] = target.id
        src.delete(src.starts[reuse.lineno - 1], src.starts[pyast.last_line(reuse)])
    cast = rank == 1 and _pid_is_receiver(fn, pids[0])
    for call, axis in _program_ids(fn) or ():  # the plan found them
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
    kernel = kernel_defs(pyast.parse(text))[name]
    body = _body(kernel)
    body = body[_invariant_prefix(kernel, body, set(pids) | set(sizes)):]
    indent = _leading(Edits(text), body[0])
    head = _loop_head(indent, tl, pids, sizes, _unique(fn, "task"), cast)
    text = _insert_lines(_indent_lines(text, body[0].lineno, pyast.last_line(body[-1])), body[0].lineno, head)
    return _define(text, cores, _cores_line(cores, ctx))


def _invariant_prefix(fn: ast.FunctionDef, body: list[ast.stmt], loop_names: set[str]) -> int:
    """How many leading statements stay before the task loop: assignments made once that read
    no program id. Inside the loop they would be loop-carried, and a parameter re-bound with
    another type (`stride = tl.cast(stride, tl.int64)`) is a compile error there (Triton's
    "Loop-carried variable ... re-assigned to int64"; found by the triton-ascend frontend check
    on AKG's moe_sum_reduce_triton)."""
    stores: dict[str, int] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            stores[node.id] = stores.get(node.id, 0) + 1
    count = 0
    for stmt in body[:-1]:  # the loop keeps at least one statement
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            break
        if not all(isinstance(t, ast.Name) and stores.get(t.id) == 1 for t in targets):
            break
        if mentions(value, loop_names) or any(isinstance(n, ast.Call) and call_name(n) not in PURE_CALLS
                                              for n in ast.walk(value)):
            break  # reads a program id, or memory another task may write: per task
        count += 1
    return count


def _pid_statement(fn: ast.FunctionDef) -> ast.Assign | None:
    """A top-level `pid = tl.program_id(0)` whose name is bound nowhere else."""
    for stmt in _body(fn):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and is_tl_call(stmt.value, "program_id"):
            target = stmt.targets[0].id
            stores = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == target
                      and isinstance(n.ctx, ast.Store)]
            ids = _program_ids(fn)
            if len(stores) == 1 and len(_body(fn)) > 1 and ids and all(a == 0 for _, a in ids):
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
    for name in list(kernel_defs(pyast.parse(source))):
        source = _make_persistent(source, name, ctx)
    return source
