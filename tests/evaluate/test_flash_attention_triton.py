"""The training source's Triton FlashAttention: its own Model passes the evaluator as a
candidate (forward and backward verified against scaled_dot_product_attention), and the
block sizes tune may move keep it correct."""

import importlib.util
import types
from pathlib import Path

import pytest
import torch

from farm.corpus import tasks as taskfiles
from farm.evaluate.evaluator import EvalSettings, Evaluator
from farm.generators.base import model_as_candidate
from farm.generators.tune import apply, find_knobs
from farm.reference.generate import generate_reference
from farm.targets import resolve_device

TASK = Path(__file__).resolve().parents[2] / "tasks" / "training" / "flash_attention_triton.py"


def test_the_model_passes_as_a_candidate_with_all_backward_kernels():
    ref = taskfiles.TaskRef("training", "flash_attention_triton", TASK)
    spec = resolve_device("cpu")
    data = generate_reference(taskfiles.load_task(ref, "small"), spec, seed=0)
    settings = EvalSettings.for_device(spec)
    settings.timing.update(budget_ms=50.0, min_reps=2, max_reps=3)
    with Evaluator(ref, data, spec, settings) as ev:
        result = ev.evaluate(model_as_candidate(TASK.read_text()), "flash_attention_triton_model")
    assert result.verdict == "pass", result.reason
    assert result.backward["verified"] and result.backward["seeds_checked"] == 2
    assert result.backward["kernels"] == ["_attn_bwd_dkdv_kernel", "_attn_bwd_dq_kernel",
                                          "_attn_bwd_preprocess_kernel"]
    assert result.timing_backward["median_ms"] > 0


def _load(source: str) -> types.ModuleType:
    spec = importlib.util.spec_from_loader("flash_attention_variant", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, str(TASK), "exec"), module.__dict__)
    return module


def _blocks(source: str, block_m: int, block_n: int) -> str:
    """Every kernel's query tile to block_m and key tile to block_n (the preprocess: block_m)."""
    knobs = [k for k in find_knobs(source) if k.kind == "block"]
    return apply(source, {k: block_n if k.name.endswith("BLOCK_N") else block_m for k in knobs})


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block_m,block_n", [(16, 32), (128, 16)])
def test_tuned_block_sizes_match_sdpa_forward_and_backward(causal, block_m, block_n):
    # query and key tiles of different sizes: the causal bounds of every loop are exercised
    module = _load(_blocks(TASK.read_text(), block_m, block_n))
    gen = torch.Generator().manual_seed(block_m)
    q, k, v = (torch.randn(1, 2, 37, 16, generator=gen).half().requires_grad_() for _ in range(3))
    out = module.Model(causal)(q, k, v)
    upstream = torch.randn(out.shape, generator=gen).half()
    grads = torch.autograd.grad(out, (q, k, v), upstream)
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = module.Reference(causal)(*ref_in)
    ref_grads = torch.autograd.grad(ref, ref_in, upstream.float())
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=1e-2)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.float(), want, atol=8e-3, rtol=2e-2)
