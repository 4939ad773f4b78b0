"""Verification and timing over the cases of an op's shape space (issue 32 items 3 and 4): a
candidate passes only if it is right at every recorded case, a failure names the case (label,
values, input shapes, dtype, seed), and the op's speedup is the geomean over a timed mix whose
per-case figures are kept, with the cases where the kernel is slower listed."""

from __future__ import annotations

import math

import pytest

from farm.corpus.tasks import ref_from_file
from farm.errors import ConfigError
from farm.evaluate import space_cases
from farm.evaluate import speedup as speedups
from farm.evaluate.evaluator import EvalSettings, Evaluator
from farm.evaluate.verifier import Case
from farm.reference.generate import generate_references
from farm.search.batch import load_reference
from farm.search.results import figures_of
from farm.storage import open_store
from tests.evaluate.test_evaluator import CPU, LIMITS, TASK, variant

# right at the benchmark case (7 rows), wrong wherever the row count differs
HARD_CODED = variant("m, k = x.shape", "m, k = 7, x.shape[1]")
# seven rows per program and a grid of m // 7: the benchmark's 7 rows are covered, a tail is dropped
NO_TAIL = variant("rows = 2", "rows = 7", variant("(triton.cdiv(m, rows),)", "(m // rows,)"))
# right everywhere, but forty launches (the same rows, written again) at decode sizes
SLOW_AT_DECODE = variant(
    "        _rows_kernel[(triton.cdiv(m, rows),)](x, out, m, k, x.stride(0), ROWS=rows, BLOCK=128)\n",
    "        for _ in range(40 if m < 4 else 1):\n"
    "            _rows_kernel[(triton.cdiv(m, rows),)](x, out, m, k, x.stride(0), ROWS=rows, BLOCK=128)\n")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """demo/row_sum at small shapes ([7, 300]) with 4 cases of its space (M 1..64) beside the .pt,
    read back the way a search reads it."""
    root = tmp_path_factory.mktemp("store")
    store = open_store(f"file://{root}")
    [entry] = generate_references([ref_from_file(TASK, "demo")], store, CPU, 0, "small", 120, cases=4)
    assert entry["success"], entry.get("error")
    loaded = load_reference(store, "demo", "row_sum")
    assert len(loaded["_case_sets"]) == 4
    return loaded


@pytest.fixture(scope="module")
def ev(data):
    settings = EvalSettings.for_device(CPU)
    settings.limits, settings.timed_cases, settings.cases = LIMITS, "bench,low", -1
    evaluator = Evaluator(ref_from_file(TASK, "demo"), data, CPU, settings)
    yield evaluator
    evaluator.close()


def test_a_correct_kernel_passes_at_every_case_and_is_timed_over_the_mix(ev):
    # correct at every case, and slower than the Model at decode sizes: the mix lists that case
    result = ev.evaluate(SLOW_AT_DECODE, "slow_at_decode")
    assert result.passed, result.reason
    assert result.cases_checked == 4 and result.verified["cases"] == 4
    assert result.verified["case_labels"] == ["low", "pow2+1", "high", "random"]
    rows = result.timing["cases"]
    assert [r["label"] for r in rows] == ["bench", "low"]
    assert [r["shape"] for r in rows] == [[[7, 300]], [[1, 300]]]
    for row in rows:
        assert row["time_ms"] > 0 and row["model_ms"] > 0 and row["speedup"] > 0
    mix = result.comparison["mix"]
    geomean = math.exp(sum(math.log(r["speedup"]) for r in rows) / 2)
    assert mix["cases"] == 2 and mix["ratio"] == pytest.approx(geomean)
    assert result.speedup_vs_model == mix["ratio"]  # the op's speedup is the mix's
    assert mix["slower"] == [r["label"] for r in rows if r["speedup"] < 1] and "low" in mix["slower"]
    # best.json's figures: every timed case, and the slower ones an export can route to the original
    shown = figures_of({"time_ms": 1.0, "timing": result.timing, "mix": mix}, {})
    assert [r["label"] for r in shown["slower_cases"]] == mix["slower"] and len(shown["timed_cases"]) == 2
    assert shown["speedup_vs_model"] == mix["ratio"]


def test_a_hard_coded_size_fails_at_the_case_it_gets_wrong(ev):
    result = ev.evaluate(HARD_CODED, "hard_coded")
    assert result.verdict == "mismatch"
    assert result.reason.startswith("low case of the shape space (M=1, dtype=float32) (inputs [1, 300] float32; seed ")
    assert "shape [7], expected [1]" in result.reason


def test_a_grid_that_drops_the_tail_fails_at_the_case_it_gets_wrong(ev):
    result = ev.evaluate(NO_TAIL, "no_tail")
    assert result.verdict == "mismatch"
    assert "case of the shape space (M=" in result.reason and "seed " in result.reason
    assert "elements outside" in result.reason


def test_the_interpreter_times_the_benchmark_case_alone_by_default(data):
    settings = EvalSettings.for_device(CPU)
    with Evaluator(ref_from_file(TASK, "demo"), data, CPU, settings) as evaluator:
        assert evaluator.mix == [] and len(evaluator.space_cases) == 4


# ---------------------------------------------------------------- units


def _case(key: str, tag: str) -> Case:
    return Case(key, [], [], f"{tag} case", tag=tag)


def test_the_mix_comes_from_the_setting_per_source():
    cases = [_case("case0", "low"), _case("case1", "prime"), _case("case2", "pow2+1"), _case("case3", "high")]
    assert [c.tag for c in space_cases.timed(cases, "auto", "demo", interpret=False)] == ["low", "prime", "pow2+1"]
    assert space_cases.timed(cases, "auto", "demo", interpret=True) == []
    text = "sglang:bench,high;vllm_torch:auto;bench,low"
    assert [c.tag for c in space_cases.timed(cases, text, "sglang", interpret=True)] == ["high"]
    assert [c.tag for c in space_cases.timed(cases, text, "vllm_torch", interpret=False)] == ["low", "prime", "pow2+1"]
    assert [c.tag for c in space_cases.timed(cases, text, "demo", interpret=False)] == ["low"]
    # a typo in any source's entry is named, not silently ignored
    with pytest.raises(ConfigError, match=r"evaluator\.timed_cases: unknown case label\(s\) huge"):
        space_cases.timed(cases, "demo:bench;sglang:bench,huge", "demo", interpret=False)


def test_the_count_of_verified_cases_keeps_the_timed_ones():
    cases = [_case(f"case{i}", t) for i, t in enumerate(("low", "prime", "pow2+1", "high"))]
    assert [c.key for c in space_cases.verified(cases, 1, [cases[3]])] == ["case0", "case3"]
    assert len(space_cases.verified(cases, -1, [])) == 4 and space_cases.verified(cases, 0, []) == []


def test_the_mix_geomean_and_its_interval():
    a = {"ratio": 2.0, "ci_low": 1.9, "ci_high": 2.1, "rounds": 4}
    b = {"ratio": 0.5, "ci_low": 0.45, "ci_high": 0.55, "rounds": 4}
    mix = speedups.mix_summary([a, b])
    assert mix["ratio"] == pytest.approx(1.0) and mix["ci_low"] < 1.0 < mix["ci_high"]
    assert speedups.mix_summary([a, {**b, "ci_low": 0.0, "ci_high": math.inf}])["ci_high"] == math.inf


def test_promotion_needs_the_mix_faster_and_names_the_slower_cases():
    model = {"ratio": 1.5, "ci_low": 1.45, "ci_high": 1.55, "rounds": 12}
    slow = {"ratio": 0.97, "ci_low": 0.9, "ci_high": 1.05, "cases": 3, "slower": ["low"]}
    allowed, why = speedups.promotion({"model": model, "mix": slow}, model_runs=True)
    assert not allowed and "geomean 0.970x over 3 timed cases" in why and "slower than the Model at: low" in why
    fast = {**slow, "ratio": 1.3, "ci_low": 1.2, "ci_high": 1.4}
    allowed, why = speedups.promotion({"model": model, "mix": fast}, model_runs=True)
    assert allowed and "slower than the Model at: low" in why
    # the search's own mix figure must agree with the re-timing's, as its benchmark figure must
    claimed = {**fast, "ratio": 2.0}
    assert not speedups.promotion({"model": model, "mix": fast, "claimed_mix": claimed}, model_runs=True)[0]
