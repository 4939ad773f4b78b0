"""tune: knobs found in any Triton source, moved within valid values, formatting kept."""

import random

from farm.generators.base import Candidate, Context, model_as_candidate
from farm.generators.tune import TuneGenerator, apply, find_knobs, grid, space

SOURCE = '''
import torch
import triton
import triton.language as tl

BLOCK_ROWS = 4   # rows per program


@triton.autotune(configs=[triton.Config({"BLOCK_N": 64}, num_warps=2),
                          triton.Config({"BLOCK_N": 128}, num_warps=4, num_stages=3)], key=["n"])
@triton.jit
def _k(x_ptr, y_ptr, n, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, EXTRA: tl.constexpr):
    pass


@triton.jit
def _plain(x_ptr, n, BLOCK: tl.constexpr):
    pass


class ModelNew(torch.nn.Module):
    def forward(self, x):
        BLOCK = 256  # a comment that must survive
        _plain[(1,)](x, x.numel(), BLOCK=BLOCK, num_warps=min(8, max(1, BLOCK // 64)))
        _k[(1,)](x, x, x.numel(), ROWS=BLOCK_ROWS, EXTRA=triton.next_power_of_2(x.shape[-1]))
        return x
'''


def test_knobs_are_found_with_their_kinds():
    knobs = {k.name: k for k in find_knobs(SOURCE)}
    assert knobs["_plain.BLOCK"].value == 256 and knobs["_plain.BLOCK"].kind == "block"
    assert knobs["_plain.num_warps"].value is None  # an expression: replaceable by a literal
    assert knobs["_k.ROWS"].value == 4  # bound at module level
    assert not any(n.endswith("EXTRA") for n in knobs)  # computed from the input: left alone
    config_values = sorted(k.value for k in knobs.values() if k.name.startswith("Config@") and k.kind == "block")
    assert config_values == [64, 128]
    assert {k.kind for k in knobs.values() if k.name.startswith("Config@")} == {"block", "warps", "stages"}


def test_apply_edits_only_the_spans():
    knobs = {k.name: k for k in find_knobs(SOURCE)}
    new = apply(SOURCE, {knobs["_plain.BLOCK"]: 1024, knobs["_plain.num_warps"]: 4})
    assert "BLOCK = 1024  # a comment that must survive" in new
    assert "BLOCK=BLOCK, num_warps=4)" in new
    assert new.count("\n") == SOURCE.count("\n")


def test_target_limits():
    cuda = {k.name for k, _ in space(SOURCE, "cuda")}
    cpu = {k.name for k, _ in space(SOURCE, "cpu")}
    assert "_plain.num_warps" in cuda and "_plain.num_warps" not in cpu  # meaningless in the interpreter
    for knob, choices in space(SOURCE, "ascend"):
        assert knob.kind == "block" and max(choices) <= 8192 and all(c & (c - 1) == 0 for c in choices)


def test_proposals_differ_from_parent_and_each_other():
    ctx = Context(task_code="", op="x", source="s", target="cuda", rng=random.Random(1))
    parent = Candidate("c1", SOURCE, "tune", "pass", 1.0)
    props = TuneGenerator().propose(parent, [], ctx, n=5)
    assert 1 <= len(props) <= 5
    assert len({p.source for p in props}) == len(props) and all(p.source != SOURCE for p in props)
    assert all("->" in p.note for p in props)


def test_crossover_takes_values_from_an_inspiration():
    knobs = {k.name: k for k in find_knobs(SOURCE)}
    other = apply(SOURCE, {knobs["_plain.BLOCK"]: 2048})
    ctx = Context(task_code="", op="x", source="s", target="cpu", rng=random.Random(3))
    gen = TuneGenerator(crossover_rate=1.0)
    seen = set()
    for _ in range(20):
        for p in gen.propose(Candidate("c1", SOURCE, "tune", "pass"), [Candidate("c2", other, "tune", "pass")], ctx):
            seen.add(p.note.split()[0])
    assert "crossover" in seen


def test_grid_enumerates_the_space_of_a_corpus_task():
    from pathlib import Path

    task = Path(__file__).resolve().parents[2] / "tasks" / "demo" / "row_sum.py"
    points = grid(model_as_candidate(task.read_text()), "cuda")
    assert len(points) == len(set(points)) > 10
    assert all("class ModelNew" in p for p in points)


NO_WARPS = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, n, BLOCK: tl.constexpr):
    pass


class ModelNew(torch.nn.Module):
    def forward(self, x):
        _scale[(1,)](
            x,
            x.numel(),
            BLOCK=1024,
        )
        return x
'''


def test_absent_num_warps_is_inserted_on_cuda_only():
    import ast

    [knob] = [k for k in find_knobs(NO_WARPS) if k.kind == "warps"]
    assert knob.name == "_scale.num_warps" and knob.value == 4  # Triton's default
    new = apply(NO_WARPS, {knob: 16})
    assert "BLOCK=1024, num_warps=16," in new
    ast.parse(new)
    assert "_scale.num_warps" in {k.name for k, _ in space(NO_WARPS, "cuda")}
    assert "_scale.num_warps" not in {k.name for k, _ in space(NO_WARPS, "cpu")}
    # an autotuned kernel's configs set num_warps: its launch must not
    assert not any(k.name == "_k.num_warps" for k in find_knobs(SOURCE))


def test_tile_moves_scale_block_and_warps_together():
    ctx = Context(task_code="", op="x", source="s", target="cuda", rng=random.Random(5))
    gen = TuneGenerator(crossover_rate=0.0, tile_move_rate=1.0)
    parent = Candidate("c1", NO_WARPS, "tune", "pass", 1.0)
    notes = [p.note for _ in range(10) for p in gen.propose(parent, [], ctx)]
    assert notes and all(n.startswith("tile x") for n in notes)
    for prop in gen.propose(parent, [], ctx, n=3):
        knobs = {k.name: k.value for k in find_knobs(prop.source)}
        block, warps = knobs["_scale.BLOCK"], knobs["_scale.num_warps"]
        if 1 < warps < 32:  # not clamped: the elements per thread are those of the parent
            assert block // warps == 1024 // 4


def test_tile_seeds_reach_a_whole_long_row_on_cuda():
    from pathlib import Path

    task = (Path(__file__).resolve().parents[2] / "tasks" / "vllm_triton" / "log_softmax_kernel.py").read_text()
    cuda = TuneGenerator().initial_candidates(Context(task_code=task, op="x", source="s", target="cuda"))
    values = [{k.name.split(".")[-1]: k.value for k in find_knobs(p.source)} for p in cuda]
    assert values[0] == {"BLOCK_SIZE": 1024, "num_warps": 4}  # the original first
    # 32000 columns in one block of 32 warps: past the old limits (16384, 16 warps)
    assert {"BLOCK_SIZE": 32768, "num_warps": 32} in values
    assert len(TuneGenerator().initial_candidates(Context(task_code=task, op="x", source="s", target="cpu"))) == 1


AUTOGRAD_SOURCE = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _fwd(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass


@triton.jit
def _bwd(g_ptr, dx_ptr, n, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    pass


class _Op(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        BLOCK = 128
        y = torch.empty_like(x)
        _fwd[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK, num_warps=4)
        ctx.BLOCK = BLOCK
        ctx.WARPS = 8
        return y

    @staticmethod
    def backward(ctx, g):
        dx = torch.empty_like(g)
        _bwd[(1,)](g, dx, g.numel(), BLOCK=ctx.BLOCK, ROWS=4, num_warps=ctx.WARPS)
        return dx
'''


def test_launches_inside_an_autograd_function_are_tuned_positional_and_ctx_arguments_included():
    found = find_knobs(AUTOGRAD_SOURCE)
    knobs = {k.name: k for k in found}
    lines = AUTOGRAD_SOURCE.splitlines()
    # forward's block passed by position and backward's ctx.BLOCK lead to the one literal in
    # forward's scope: one knob, so both kernels keep the same tile
    block = [k for k in found if k.kind == "block" and "BLOCK = 128" in lines[k.line - 1]]
    assert len(block) == 1 and block[0].value == 128
    assert {"_bwd.ROWS", "_fwd.num_warps"} <= set(knobs)
    assert knobs["_bwd.num_warps"].value == 8
    assert knobs["_bwd.num_warps"].line == AUTOGRAD_SOURCE.splitlines().index("        ctx.WARPS = 8") + 1
    moved = apply(AUTOGRAD_SOURCE, {knobs["_bwd.num_warps"]: 2, knobs["_bwd.ROWS"]: 8})
    assert "ctx.WARPS = 2" in moved and "ROWS=8" in moved and "num_warps=ctx.WARPS" in moved


def test_positional_reading_stops_at_a_starred_argument():
    source = AUTOGRAD_SOURCE.replace("(x, y, x.numel(), BLOCK, num_warps=4)", "(*[x, y], x.numel(), BLOCK, num_warps=4)")
    assert "_fwd.BLOCK" not in {k.name for k in find_knobs(source)}


def test_flash_attention_triton_exposes_forward_and_backward_launches():
    from pathlib import Path

    source = (Path(__file__).resolve().parents[2] / "tasks" / "training" / "flash_attention_triton.py").read_text()
    names = {k.name for k, _ in space(source, "cuda")}
    for kernel in ("_attn_fwd_kernel", "_attn_bwd_dkdv_kernel", "_attn_bwd_dq_kernel"):
        assert {f"{kernel}.BLOCK_M", f"{kernel}.BLOCK_N", f"{kernel}.num_warps", f"{kernel}.num_stages"} <= names
    assert {"_attn_bwd_preprocess_kernel.BLOCK_M", "_attn_bwd_preprocess_kernel.num_warps"} <= names
    # the head dim's block follows the input (next_power_of_2): never a knob
    assert not any(name.endswith("BLOCK_D") for name in names)
