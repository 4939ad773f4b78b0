"""tune: find the tunable knobs of any Triton source and move them within valid values.

Knobs are found in the source, not declared: launch arguments (by keyword or by position)
that feed a kernel's `tl.constexpr` parameters (literals, names bound to a literal in the same
function or at module level, or attributes such as an autograd.Function's `ctx.BLOCK` bound
once to one), wherever the launch is (a module's forward, an autograd.Function's forward or
backward), `num_warps` / `num_stages` at launches, and the entries of `triton.Config`
lists. Only power-of-two block sizes are moved (tl.arange needs them); a value computed from
the input (`triton.next_power_of_2(n)`) is left alone, since replacing it could break
correctness for other shapes. Edits replace exact source spans, so everything else in the
file stays as written.

One knob may be absent from the source: a CUDA launch of a kernel without `num_warps`
(and without @triton.autotune, whose configs set it) runs with Triton's default of 4 warps,
and tune inserts `num_warps=` there. Memory-bound kernels often need a large tile and many
warps together, several single knob steps away from the original: on CUDA, tune also seeds
the original with its tiles scaled x8 and x32, and a tile move scales one block size and its
kernel's warps by the same power of two in one step.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass

from farm import pyast
from farm.generators.base import Candidate, Context, Generator, Proposal, model_as_candidate
from farm.pyast import dotted_name as _dotted
from farm.targets import known

# 32 warps (1024 threads, the CUDA limit per program): a whole long row per program needs them
WARPS = (1, 2, 4, 8, 16, 32)
STAGES = (1, 2, 3, 4, 5)
DEFAULT_WARPS = 4  # Triton's num_warps when a launch names none
# The largest block is the target's (Target.max_block: CUDA registers, the Ascend unified
# buffer, the CPU interpreter where big blocks are merely slow); this for a target not installed here.
DEFAULT_MAX_BLOCK = 16384
MIN_BLOCK = 1
BLOCK_WINDOW = 32  # a block knob moves within [value / 32, value * 32]
TILE_MOVE_RATE = 0.35  # share of mutations that are tile moves (block and warps scaled together)
TILE_STEPS = (-2, -1, 1, 2, 3, 4, 5)  # log2 of a tile move's factor: mostly up, memory-bound tiles grow
# Tile factors of the extra seeds (the original with wide tiles): originals often keep a tile
# sized for small shapes (vLLM's log_softmax: 1024 columns for any vocabulary), and a search of
# 8-12 candidates spread over several lineages rarely walks that far from the original.
TILE_SEEDS = (8, 32)


@dataclass(frozen=True)
class Knob:
    name: str  # e.g. "_row_sum_kernel.BLOCK" or "num_warps@12"
    kind: str  # "block", "warps", "stages"
    line: int
    col: int
    end_line: int
    end_col: int
    value: int | None  # current literal value (None: an expression that will be replaced)
    insert: str = ""  # absent from the source: text written before the value at an empty span

    @property
    def kernel(self) -> str:
        """The launch or triton.Config the knob belongs to ("_k" of "_k.BLOCK")."""
        return self.name.rsplit(".", 1)[0]

    def choices(self, target: str) -> tuple[int, ...]:
        if self.kind == "warps":
            return WARPS
        if self.kind == "stages":
            return STAGES
        caps = known(target)
        top = caps.max_block if caps else DEFAULT_MAX_BLOCK
        lo = max(MIN_BLOCK, (self.value or 16) // BLOCK_WINDOW)
        hi = min(top, max((self.value or 16) * BLOCK_WINDOW, 16))
        return tuple(v for v in (2**i for i in range(0, 17)) if lo <= v <= hi)


def _is_pow2(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0




def _kernel_defs(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """@triton.jit (autotune, heuristics) functions by name."""
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and any(
        _dotted(d.func if isinstance(d, ast.Call) else d).endswith(("jit", "autotune", "heuristics"))
        for d in node.decorator_list)}


def _kernels(tree: ast.Module) -> dict[str, set[str]]:
    """@triton.jit functions and their constexpr parameter names."""
    return {name: {a.arg for a in node.args.args + node.args.kwonlyargs
                   if a.annotation is not None and _dotted(a.annotation).endswith("constexpr")}
            for name, node in _kernel_defs(tree).items()}


def _launch_keywords(call: ast.Call, kernel: ast.FunctionDef, constexprs: set[str]) -> list[ast.keyword]:
    """The launch's keyword arguments, plus its positional arguments that land on a constexpr
    parameter (`_k[grid](x, y, n, BLOCK)`), named as keywords so both are read alike. After a
    `*args` the positions are unknown, so the reading stops there."""
    params = [a.arg for a in kernel.args.args]
    positional = []
    for i, arg in enumerate(call.args[:len(params)]):
        if isinstance(arg, ast.Starred):
            break
        if params[i] in constexprs:
            positional.append(ast.keyword(arg=params[i], value=arg))
    return positional + list(call.keywords)


def _autotuned(tree: ast.Module) -> set[str]:
    """Kernels under @triton.autotune: their configs set num_warps, a launch must not."""
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
            and any(_dotted(d.func if isinstance(d, ast.Call) else d).endswith("autotune")
                    for d in node.decorator_list)}


def _literal_binding(name: str, scopes: list[ast.AST]) -> ast.Constant | None:
    """The int literal a name is bound to, if it is bound exactly once in the nearest scope."""
    for scope in scopes:
        values = [n.value for n in ast.walk(scope)
                  if isinstance(n, ast.Assign) and len(n.targets) == 1
                  and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name]
        if len(values) == 1 and isinstance(values[0], ast.Constant) and _is_pow2(values[0].value):
            return values[0]
        if values:
            return None
    return None


def _attribute_binding(attr: ast.Attribute, tree: ast.Module, scopes_of) -> ast.Constant | None:
    """The int literal behind `ctx.BLOCK` (or `self.BLOCK`): an autograd.Function's backward
    often reads the block sizes its forward stored on ctx. Bound exactly once in the file, to
    a literal or to a name bound to one (`ctx.BLOCK = BLOCK`)."""
    target = _dotted(attr)
    values = [(n, n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Attribute) and _dotted(t) == target]
    if len(values) != 1:
        return None
    node, value = values[0]
    if isinstance(value, ast.Constant) and _is_pow2(value.value):
        return value
    if isinstance(value, ast.Name):
        return _literal_binding(value.id, scopes_of(node))
    return None


def _span_knob(name: str, kind: str, node: ast.expr, value: object) -> Knob:
    """The knob at `node`'s span; a value that is no int literal is None (an expression)."""
    return Knob(name, kind, node.lineno, node.col_offset, *pyast.end(node), value if isinstance(value, int) else None)


def find_knobs(source: str) -> list[Knob]:
    tree = pyast.parse(source)
    kernels = _kernels(tree)
    defs = _kernel_defs(tree)
    autotuned = _autotuned(tree)
    knobs: dict[tuple, Knob] = {}
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def scopes_of(node):
        out = []
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.Module)):
                out.append(node)
        return out

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id in kernels:
            kname = func.value.id
            for kw in _launch_keywords(node, defs[kname], kernels[kname]):
                _launch_knob(knobs, kname, kw, kernels[kname], scopes_of(node),
                             lambda attr: _attribute_binding(attr, tree, scopes_of))
            if kname not in autotuned:
                _absent_warps_knob(knobs, kname, node)
        elif _dotted(func).endswith("Config"):
            _config_knobs(knobs, node)
    return sorted(knobs.values(), key=lambda k: (k.line, k.col))


def _launch_knob(knobs: dict, kname: str, kw: ast.keyword, constexprs: set[str], scopes: list,
                 attribute_binding) -> None:
    bound = None
    if isinstance(kw.value, ast.Name):
        bound = _literal_binding(kw.value.id, scopes)
    elif isinstance(kw.value, ast.Attribute):
        bound = attribute_binding(kw.value)
    if kw.arg in ("num_warps", "num_stages"):
        kind = "warps" if kw.arg == "num_warps" else "stages"
        value = kw.value.value if isinstance(kw.value, ast.Constant) else None
        target: ast.expr = kw.value
        if bound is not None:
            target, value = bound, bound.value
        knobs[(target.lineno, target.col_offset)] = _span_knob(f"{kname}.{kw.arg}", kind, target, value)
    elif kw.arg in constexprs:
        if isinstance(kw.value, ast.Constant) and _is_pow2(kw.value.value):
            knobs[(kw.value.lineno, kw.value.col_offset)] = _span_knob(f"{kname}.{kw.arg}", "block", kw.value,
                                                                       kw.value.value)
        elif bound is not None:
            knobs[(bound.lineno, bound.col_offset)] = _span_knob(f"{kname}.{kw.arg}", "block", bound, bound.value)


def _absent_warps_knob(knobs: dict, kname: str, call: ast.Call) -> None:
    """num_warps for a launch that names none: an empty span after its last argument, where
    `, num_warps=N` is inserted; its value is Triton's default, so moves start from there."""
    if any(kw.arg == "num_warps" or kw.arg is None for kw in call.keywords):  # None: **kwargs may hold it
        return
    last = max(call.args + [kw.value for kw in call.keywords], key=lambda n: (n.end_lineno, n.end_col_offset),
               default=None)
    if last is None:
        return
    end = pyast.end(last)
    knobs[end] = Knob(f"{kname}.num_warps", "warps", *end, *end, DEFAULT_WARPS, insert=", num_warps=")


def _config_knobs(knobs: dict, call: ast.Call) -> None:
    for arg in call.args[:1]:
        if isinstance(arg, ast.Dict):
            for key, val in zip(arg.keys, arg.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(val, ast.Constant) \
                        and _is_pow2(val.value):
                    knobs[(val.lineno, val.col_offset)] = _span_knob(f"Config@{call.lineno}.{key.value}", "block",
                                                                     val, val.value)
    for kw in call.keywords:
        if kw.arg in ("num_warps", "num_stages") and isinstance(kw.value, ast.Constant):
            kind = "warps" if kw.arg == "num_warps" else "stages"
            knobs[(kw.value.lineno, kw.value.col_offset)] = _span_knob(f"Config@{call.lineno}.{kw.arg}", kind,
                                                                       kw.value, kw.value.value)


def tunes_warps(target: str) -> bool:
    """num_warps / num_stages mean something to the target's compiler (Target.tunes_warps:
    CUDA's; nothing to triton-ascend or to the interpreter)."""
    caps = known(target)
    return bool(caps and caps.tunes_warps)


def tunable(knob: Knob, target: str) -> bool:
    return knob.kind == "block" or tunes_warps(target)


def apply(source: str, assignment: dict[Knob, int]) -> str:
    """Replace each knob's span with its new literal (last spans first, so offsets hold)."""
    lines = source.splitlines(keepends=True)
    for knob in sorted(assignment, key=lambda k: (k.line, k.col), reverse=True):
        first, last = lines[knob.line - 1], lines[knob.end_line - 1]
        new = first[: knob.col] + knob.insert + str(assignment[knob]) + last[knob.end_col:]
        lines[knob.line - 1: knob.end_line] = [new]
    return "".join(lines)


def space(source: str, target: str) -> list[tuple[Knob, tuple[int, ...]]]:
    return [(k, k.choices(target)) for k in find_knobs(source) if tunable(k, target)]


def grid(source: str, target: str, limit: int = 4096) -> list[str]:
    """Every point of the knob space (for benchmarks: the exhaustive baseline)."""
    dims = space(source, target)
    points = itertools.islice(itertools.product(*(c for _, c in dims)), limit)
    return [apply(source, dict(zip((k for k, _ in dims), p))) for p in points]


def tile_scaled(dims, factor: float) -> dict[Knob, int]:
    """Every kernel's first literal block knob and its literal warps knob times factor (within
    their choices): the same work per thread over a larger (smaller) tile."""
    assignment: dict[Knob, int] = {}
    scaled_kernels = set()
    for knob, choices in dims:
        if knob.kind == "block" and knob.value is not None and knob.kernel not in scaled_kernels:
            scaled_kernels.add(knob.kernel)
            assignment[knob] = _clamp(choices, knob.value * factor)
    for knob, choices in dims:
        if knob.kind == "warps" and knob.value is not None and knob.kernel in scaled_kernels:
            assignment[knob] = _clamp(choices, knob.value * factor)
    return {k: v for k, v in assignment.items() if v != k.value}


def _clamp(choices: tuple[int, ...], value: float) -> int:
    """The choice nearest to value (choices are powers of two, value a power-of-two multiple)."""
    return min(choices, key=lambda c: abs(c - value))


class TuneGenerator(Generator):
    name = "tune"

    def __init__(self, max_knobs_per_step: int = 2, crossover_rate: float = 0.3,
                 tile_move_rate: float = TILE_MOVE_RATE, tile_seeds: tuple[int, ...] = TILE_SEEDS):
        self.max_knobs_per_step = max_knobs_per_step
        self.crossover_rate = crossover_rate
        self.tile_move_rate = tile_move_rate
        self.tile_seeds = tuple(tile_seeds)

    def no_initial_reason(self, ctx: Context) -> str:
        return "it only reworks Triton kernels, and the Model launches none"

    def initial_candidates(self, ctx: Context) -> list[Proposal]:
        """The original Model, when it is a Triton kernel (a PyTorch Model is no candidate), and
        the original with every kernel's tile scaled by each of tile_seeds (see tile_scaled)."""
        if not _kernels(pyast.parse(ctx.task_code)):
            return []
        original = model_as_candidate(ctx.task_code)
        out = [Proposal(original, self.name, "the original Model")]
        # where warps are tuned (CUDA) only: the interpreter's times only order candidates
        # roughly, and Ascend's tiles are bounded by its unified buffer, not by warps
        dims = space(original, ctx.target) if tunes_warps(ctx.target) else []
        for factor in self.tile_seeds:
            assignment = tile_scaled(dims, factor)
            if assignment:
                source = apply(original, assignment)
                if all(p.source != source for p in out):
                    note = f"the original, tile x{factor}: " + ", ".join(f"{k.name} {k.value}->{v}"
                                                                        for k, v in assignment.items())
                    out.append(Proposal(source, self.name, note))
        return out

    def propose(self, parent: Candidate, inspirations: list[Candidate], ctx: Context, n: int = 1) -> list[Proposal]:
        dims = space(parent.source, ctx.target)
        if not dims:
            return []
        out: list[Proposal] = []
        for _ in range(n * 4):
            if len(out) >= n:
                break
            proposal = self._crossover(parent, inspirations, dims, ctx) if ctx.rng.random() < self.crossover_rate else None
            if proposal is None and ctx.rng.random() < self.tile_move_rate:
                proposal = self._tile_move(parent, dims, ctx)
            proposal = proposal or self._mutate(parent, dims, ctx)
            if proposal and proposal.source != parent.source and all(p.source != proposal.source for p in out):
                out.append(proposal)
        return out

    def _mutate(self, parent: Candidate, dims, ctx: Context) -> Proposal | None:
        chosen = ctx.rng.sample(dims, k=min(len(dims), ctx.rng.randint(1, self.max_knobs_per_step)))
        assignment, notes = {}, []
        for knob, choices in chosen:
            current = knob.value
            if current in choices and ctx.rng.random() < 0.7:
                i = choices.index(current) + ctx.rng.choice((-1, 1))  # a neighbour
                new = choices[min(max(i, 0), len(choices) - 1)]
            else:
                new = ctx.rng.choice(choices)
            if new != current:
                assignment[knob] = new
                notes.append(f"{knob.name} {current if current is not None else 'expr'}->{new}")
        if not assignment:
            return None
        return Proposal(apply(parent.source, assignment), self.name, ", ".join(notes))

    def _tile_move(self, parent: Candidate, dims, ctx: Context) -> Proposal | None:
        """One block size of one kernel and that kernel's warps, both times 2**k: the elements
        each thread handles stay the same while the tile grows (or shrinks). Single steps
        would need several generations to get there, more than a small budget has."""
        blocks = [(k, c) for k, c in dims if k.kind == "block" and k.value is not None]
        if not blocks:
            return None
        block = ctx.rng.choice(blocks)
        step = ctx.rng.choice(TILE_STEPS)
        # that block knob first, so that tile_scaled scales it (and no other of its kernel)
        kernel_dims = [block] + [d for d in dims if d[0].kernel == block[0].kernel and d[0] != block[0]]
        assignment = tile_scaled(kernel_dims, 2.0**step)
        if not assignment:
            return None
        note = f"tile x{2.0**step:g}: " + ", ".join(f"{k.name} {k.value}->{v}" for k, v in assignment.items())
        return Proposal(apply(parent.source, assignment), self.name, note)

    def _crossover(self, parent: Candidate, inspirations: list[Candidate], dims, ctx: Context) -> Proposal | None:
        """Take some knob values from an inspiration that has the same knobs (same structure)."""
        names = [k.name for k, _ in dims]
        for other in ctx.rng.sample(inspirations, k=len(inspirations)):
            theirs = {k.name: k.value for k, _ in space(other.source, ctx.target)}
            if sorted(theirs) != sorted(names):
                continue
            assignment = {k: v for k, _ in dims
                          if (v := theirs[k.name]) is not None and v != k.value and ctx.rng.random() < 0.5}
            if assignment:
                note = "crossover " + ", ".join(f"{k.name}->{v}" for k, v in assignment.items())
                return Proposal(apply(parent.source, assignment), self.name, note)
        return None
