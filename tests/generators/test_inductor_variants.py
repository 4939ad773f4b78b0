"""Inductor's tuning space beyond compile's defaults (issue 34): `propose` on an inductor-made
parent captures the next variant of VARIANTS (inductor config options), once per op; variants
the interpreter cannot take are left out with the reason. On the cpu target: the capture with
options and its assembly, run against the ground truth in the interpreter."""

from __future__ import annotations

import random

from farm.generators.base import Candidate, Context
from farm.generators.inductor.generator import MARKER, VARIANTS, InductorGenerator
from tests.generators.test_inductor import REPO, run_in_interpreter

TASK = REPO / "tasks" / "vllm_torch" / "rms_norm.py"


def _ctx() -> Context:
    return Context(task_code=TASK.read_text(), op="rms_norm", source="vllm_torch", target="cpu",
                   device={"shapes": "small"}, rng=random.Random(0))


def _parent(source: str) -> Candidate:
    return Candidate(id="c0001", source=source, generator="tune", verdict="pass", time_ms=1.0)


def test_the_interpreter_takes_the_variants_it_can_run_and_says_why_not_the_others():
    assert InductorGenerator.variants("cpu") == ["no-persistent-reductions", "no-split-reductions"]
    assert InductorGenerator.variants("cuda") == list(VARIANTS)
    skipped = InductorGenerator.skipped_variants("cpu")
    assert "block pointers" in skipped["block-pointers"] and "times configs" in skipped["coordinate-descent"]
    assert InductorGenerator.skipped_variants("cuda") == {}


def test_a_variant_of_an_inductor_parent_is_captured_with_its_options_and_runs(tmp_path):
    """rms_norm with persistent reductions off: a looped reduction instead of one block per row,
    a child of an inductor seed that tune has already changed (any inductor-made parent)."""
    gen = InductorGenerator(timeout_s=300)
    assert gen.propose(_parent("class ModelNew: pass  # the original, reworked by tune"), [], _ctx()) == []
    assert gen.captures == []  # not an inductor parent: no capture at all
    children = gen.propose(_parent(f'"""rms_norm: Triton ... {MARKER} ..."""'), [], _ctx())
    assert len(children) == 1, gen.reasons
    child = children[0]
    assert child.generator == "inductor" and "+no-persistent-reductions" in child.note
    assert "triton.persistent_reductions=False" in child.source and "def triton_red_" in child.source
    assert gen.captures[0]["options"] == {"triton.persistent_reductions": False}
    run_in_interpreter(child.source, gen.captures[0], tmp_path, seeds=(1,), task=TASK)
    # the next proposal takes the next variant; none is proposed twice for the op
    assert gen._tried[("vllm_torch", "rms_norm", "cpu", "small")] == {"no-persistent-reductions"}
