"""Training ops: the evaluator verifies and times the backward, and catches the four ways a
backward goes wrong (candidates in tests/evaluate/training/)."""

from pathlib import Path

import pytest

from farm.corpus import tasks as taskfiles
from farm.evaluate.evaluator import EvalSettings, Evaluator
from farm.reference.generate import generate_reference
from farm.targets import resolve_device

REPO = Path(__file__).resolve().parents[2]
CANDIDATES = Path(__file__).resolve().parent / "training"


def _evaluator(op: str) -> Evaluator:
    ref = taskfiles.TaskRef("training", op, REPO / "tasks" / "training" / f"{op}.py")
    spec = resolve_device("cpu")
    data = generate_reference(taskfiles.load_task(ref, "small"), spec, seed=0)
    settings = EvalSettings.for_device(spec)
    settings.timing.update(budget_ms=50.0, min_reps=2, max_reps=3)
    return Evaluator(ref, data, spec, settings)


@pytest.fixture(scope="module")
def silu():
    with _evaluator("silu") as ev:
        yield ev


@pytest.fixture(scope="module")
def dropout():
    with _evaluator("dropout_residual") as ev:
        yield ev


def _judge(ev: Evaluator, name: str):
    return ev.evaluate((CANDIDATES / f"{name}.py").read_text(), name)


def test_a_triton_forward_and_backward_passes_with_both_timed(silu):
    result = _judge(silu, "silu_good")
    assert result.verdict == "pass", result.reason
    assert result.backward["verified"] and result.backward["seeds_checked"] == 2
    assert result.backward["kernels"] == ["_silu_bwd"]
    assert result.timing["median_ms"] > 0 and result.timing_backward["median_ms"] > 0
    assert result.speedup_fwd_bwd_vs_reference is not None


def test_a_wrong_backward_is_a_mismatch(silu):
    result = _judge(silu, "silu_wrong_backward")
    assert result.verdict == "mismatch" and "gradient of input 0" in result.reason


def test_a_backward_left_to_pytorch_autograd_is_not_a_kernel(silu):
    result = _judge(silu, "silu_torch_backward")
    assert result.verdict == "cheat" and "backward launched no Triton kernel" in result.reason


def test_dropout_with_the_mask_in_both_directions_passes(dropout):
    result = _judge(dropout, "dropout_good")
    assert result.verdict == "pass", result.reason


def test_a_backward_that_ignores_the_dropout_mask_is_a_mismatch(dropout):
    result = _judge(dropout, "dropout_ignores_mask")
    assert result.verdict == "mismatch" and "gradient of input 0" in result.reason


def test_a_mask_reused_across_calls_fails_on_fresh_noise(dropout):
    result = _judge(dropout, "dropout_reuses_mask")
    assert result.verdict in ("mismatch", "cheat") and "fresh input set" in result.reason
