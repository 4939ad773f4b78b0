"""Two-level tiling: a block too large for the unified buffer is split into sub-tiles looped over
inside the program, where the kernel's meaning provably allows it."""

from __future__ import annotations

import ast

from farm import pyast
from farm.ascend.lint import (
    KernelShapes,
    call_name,
    constexprs,
    find_launches,
    host_value,
    is_arange_of,
    is_method,
    is_tl_call,
    kernel_defs,
    launch_constexprs,
    live_peak,
    mentions,
)
from farm.ascend.port.edits import (
    MAX_SUB,
    MIN_SUB,
    Edits,
    PortContext,
    _append_args,
    _append_params,
    _body,
    _indent_lines,
    _insert_lines,
    _leading,
    _plain_signature,
    _tl,
    _unique,
)


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
    if region is None:  # the caller found one
        return source
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
    first, last, indent = region[0].lineno, pyast.last_line(region[-1]), _leading(src, region[0])
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
    def in_chunk(fact):
        return any(loop in loops for loop in fact.loops)

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


def _within(node: ast.stmt, loop: ast.stmt) -> bool:
    return loop.lineno <= node.lineno <= pyast.last_line(loop) and node is not loop


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
    for name in list(kernel_defs(pyast.parse(source))):
        tree = pyast.parse(source)
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
