"""port: the CUDA Triton -> triton-ascend rewrite passes of farm.ascend.port as a generator.

seeds: the task's Model with every pass applied, for every target. On ascend it is the port.
On cuda and cpu it is still a valid seed and a lineage of its own: the rewrites must keep the
op correct there (torch_npu is optional, devices come from the inputs, libdevice falls back),
so evaluating it off Ascend checks the port before any NPU does; its persistent grid is sized
from the device (sm_count x 4 programs on cuda), which is a fair GPU variant too. It drops
num_warps, so on cuda it is rarely the fastest lineage; tune and llm candidates compete with it.

propose: variants of the parent that keep its meaning: the whole port when the parent still
has CUDA-isms, a random subset of the passes, another BLOCK_SUB cap, another persistent-grid
size, or sub-tiling with an explicit BLOCK_SUB; each differs from the parent, or is not proposed.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TypeGuard

from farm import pyast
from farm.ascend.lint import find_launches, kernel_defs
from farm.ascend.port import PASSES, Edits, PortContext, pass_tile, port
from farm.errors import FarmError
from farm.evaluate.static_checks import check_has_triton_kernel
from farm.generators.base import Candidate, Context, Generator, Proposal, model_as_candidate

BLOCK_SUBS = tuple(2**i for i in range(5, 14))  # 32 .. 8192
GRID_SCALES = (1, 2, 4)
CORE_NAMES = ("NUM_VECTORCORE", "NUM_AICORE")
GPU_PROGRAMS_PER_SM = 4


def port_context(ctx: Context) -> PortContext:
    """Core counts for the target: Ascend's from the device (or A2 defaults); on a device that
    reports an SM count (cuda's properties) that count."""
    if ctx.device.get("sm_count"):
        sms = int(ctx.device["sm_count"])
        return PortContext(num_vectorcore=sms, num_aicore=sms, cores_scale=GPU_PROGRAMS_PER_SM)
    return PortContext.from_device(ctx.device)


class PortGenerator(Generator):
    name = "port"

    def __init__(self, **options):
        if options:
            raise FarmError(f"port generator: unknown option(s) {', '.join(sorted(options))}; it takes none")

    def no_initial_reason(self, ctx: Context) -> str:
        if check_has_triton_kernel(pyast.parse(ctx.task_code), ctx.task_code):
            return "it only ports Triton kernels, and the Model launches none"
        return "the port passes change nothing in this Model"

    def initial_candidates(self, ctx: Context) -> list[Proposal]:
        if check_has_triton_kernel(pyast.parse(ctx.task_code), ctx.task_code):
            return []  # a PyTorch Model has no kernel to port
        source = model_as_candidate(ctx.task_code)
        ported = port(source, port_context(ctx))
        if ported == source:
            return []
        return [Proposal(ported, self.name, f"Model ported to triton-ascend ({ctx.target} seed)")]

    def propose(self, parent: Candidate, inspirations: list[Candidate], ctx: Context, n: int = 1) -> list[Proposal]:
        variants: list[Callable[[str, Context], tuple[str, str] | None]] = [
            _full_port, _pass_subset, _retune_block_sub, _regrid, _subtile_with]
        out: list[Proposal] = []
        for _ in range(n * 6):
            if len(out) >= n:
                break
            made = ctx.rng.choice(variants)(parent.source, ctx)
            if made and made[0] != parent.source and all(p.source != made[0] for p in out):
                out.append(Proposal(made[0], self.name, made[1]))
        return out


def _full_port(source: str, ctx: Context) -> tuple[str, str] | None:
    ported = port(source, port_context(ctx))
    return (ported, "all port passes") if ported != source else None


def _pass_subset(source: str, ctx: Context) -> tuple[str, str] | None:
    """Some of the passes, e.g. the port without persistent grids, for the evaluator to compare."""
    names = [name for name, _ in PASSES]
    chosen = sorted(ctx.rng.sample(names, ctx.rng.randint(1, len(names) - 1)), key=names.index)
    ported = port(source, port_context(ctx), passes=chosen)
    return (ported, f"port passes: {', '.join(chosen)}") if ported != source else None


def _retune_block_sub(source: str, ctx: Context) -> tuple[str, str] | None:
    """`X_SUB=min(X, cap)` at a launch -> another power-of-two cap (any one divides X)."""
    edits = Edits(source)
    caps = [(kw, cap) for la in find_launches(edits.tree, kernel_defs(edits.tree)) for kw in la.call.keywords
            if kw.arg and kw.arg.endswith("_SUB") and (cap := _constant_cap(kw.value)) is not None]
    if not caps:
        return None
    kw, (node, old) = ctx.rng.choice(caps)
    new = ctx.rng.choice([c for c in BLOCK_SUBS if c != old and old // 8 <= c <= old * 8] or [old])
    edits.replace(node, str(new))
    return edits.result(), f"{kw.arg} cap {old}->{new}"


def _constant_cap(node: ast.AST) -> tuple[ast.Constant, int] | None:
    """`min(X, N)` with N an int literal: N's node and value."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "min"
            and len(node.args) == 2 and isinstance(cap := node.args[1], ast.Constant) and isinstance(cap.value, int)):
        return cap, cap.value
    return None


def _regrid(source: str, ctx: Context) -> tuple[str, str] | None:
    """Persistent grid `(min(tasks, k * NUM_VECTORCORE),)` -> another k; any program count is correct."""
    edits = Edits(source)
    sites = []
    for launch in find_launches(edits.tree, kernel_defs(edits.tree)):
        grid = launch.grid
        if isinstance(grid, ast.Tuple) and len(grid.elts) == 1 and _min_of_cores(grid.elts[0]):
            sites.append(grid.elts[0].args[1])
    if not sites:
        return None
    cores = ctx.rng.choice(sites)
    name = next(n.id for n in ast.walk(cores) if isinstance(n, ast.Name))
    old = cores.left.value if isinstance(cores, ast.BinOp) and isinstance(cores.left, ast.Constant) else 1
    new = ctx.rng.choice([k for k in GRID_SCALES if k != old])
    edits.replace(cores, name if new == 1 else f"{new} * {name}")
    return edits.result(), f"persistent grid {old!s}x->{new}x {name}"


def _min_of_cores(node: ast.AST) -> TypeGuard[ast.Call]:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "min"
            and len(node.args) == 2):
        return False
    cores = node.args[1]
    if isinstance(cores, ast.Name):
        return cores.id in CORE_NAMES
    return (isinstance(cores, ast.BinOp) and isinstance(cores.op, ast.Mult) and isinstance(cores.left, ast.Constant)
            and isinstance(cores.right, ast.Name) and cores.right.id in CORE_NAMES)


def _subtile_with(source: str, ctx: Context) -> tuple[str, str] | None:
    """Sub-tiling (or chunk capping) with an explicit BLOCK_SUB, also where the UB did not need it."""
    block_sub = ctx.rng.choice(BLOCK_SUBS[:6])
    tiled = pass_tile(source, PortContext(block_sub=block_sub))
    return (tiled, f"tile with BLOCK_SUB={block_sub}") if tiled != source else None
