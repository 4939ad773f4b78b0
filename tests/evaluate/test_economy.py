"""A candidate's device time (issue 17): the task's own classes built once per runner, a
runner's start-up objects out of the collector's sight, a per-call pass sized for its checks,
a comparison that stops for a candidate out of the running, and a null check without the
Reference's rounds."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from farm.evaluate import runner_child, sandbox
from farm.evaluate.evaluator import EvalSettings
from farm.evaluate.protocol import reply_for
from farm.evaluate.result import EvalResult
from farm.evaluate.rounds import Comparison
from farm.evaluate.runner import Limits, Runner
from farm.targets import resolve_device

CPU = resolve_device("cpu")
ROW_SUM = Path(__file__).resolve().parents[2] / "tasks" / "demo" / "row_sum.py"


def test_a_runner_builds_each_of_the_tasks_classes_once_and_hands_them_out_again():
    runner = runner_child.ChildRunner(CPU)
    builds = []
    build = runner._build
    runner._build = lambda *a: builds.append(a[3]) or build(*a)
    path = str(ROW_SUM)
    assert runner.load_task(path, "demo", "small", "Reference", [])["ok"]
    reference = runner.model
    for _ in range(3):  # the fresh inputs' runs: one build
        assert runner.load_task(path, "demo", "small", "Reference", [])["ok"] and runner.model is reference
    assert runner.load_task(path, "demo", "small", "Model", [])["ok"]
    model = runner.model
    assert model is not reference and type(model).__name__ == "Model"
    assert runner.load_task(path, "demo", "small", "Reference", [])["ok"] and runner.model is reference
    assert runner.load_task(path, "demo", "small", "Model", [], slot="Model")["ok"]
    assert runner.models["Model"] is model and runner.model is reference  # a slot: the same module, kept apart
    assert builds == ["Reference", "Model"]
    assert runner.load_task(path, "demo", "bench", "Model", [])["ok"] and builds[-1] == "Model"  # other shapes
    assert len(builds) == 3
    # candidate code never runs beside the task's kept modules
    source = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    assert runner.load_source(source, [])["ok"] and runner.built == {}


FREEZE_PEEK = '''
import gc
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.tensor([float(gc.get_freeze_count())])
'''


def test_a_runner_keeps_what_it_started_with_out_of_the_collectors_sight(tmp_path):
    """Torch, Triton and the harness outlive every candidate: frozen at start, a candidate's
    unload (a full collection) walks only what came after them."""
    sb = Runner(CPU, Limits(start_s=60), sandbox.current())
    try:
        assert sb.call("load_source", 60, source=FREEZE_PEEK, init_inputs=[]).ok
        import torch

        reply = sb.with_inputs("run", 60, "pt", [torch.zeros(2)], poison=False)
        assert reply.ok, reply
        assert float(reply["outputs"][0][0]) > 10_000  # torch alone is tens of thousands of objects
    finally:
        sb.close()


@pytest.mark.parametrize("profile, cap, budget, expected", [
    ("farm", 100.0, 400.0, 100.0),  # checks need tens of calls, not the RSE chase
    ("farm", None, 400.0, 400.0),  # the whole pass (issue 17's before)
    ("farm", 100.0, 50.0, 50.0),  # never longer than the profile asks
    ("kernelbench", 100.0, 60_000.0, 60_000.0),  # its 100 repetitions are its rule
])
def test_the_candidates_per_call_pass_is_sized_for_its_checks(profile, cap, budget, expected):
    settings = EvalSettings(timing={"budget_ms": budget, "min_reps": 10}, profile=profile, per_call_budget_ms=cap)
    options = Comparison._per_call_options(SimpleNamespace(settings=settings))
    assert options["budget_ms"] == expected and options["min_reps"] == 10
    assert settings.timing["budget_ms"] == budget  # the baselines' pass keeps the profile's


class Rounds(Comparison):
    """A comparison whose rounds are scripted: each `who` takes a fixed time per call."""

    def __init__(self, times: dict, share: float | None = 0.9):
        self.settings = EvalSettings(out_of_running=share, round_reps=3, rounds=4)
        self.spec, self.times, self.asked = CPU, times, []
        self.task = SimpleNamespace(inplace_args=())
        self._null_run = False

    def _put_time_cases(self):
        pass

    def _time_cases(self):
        return ["seed0"], [None]

    def op_timing(self):
        return {"mode": "events", "reason": "scripted", "graph_calls": 0, "flush": "write"}

    def _baseline_slots(self):
        return {"Model": "", "Reference": ""}

    def baseline(self):
        return {}

    def _limit(self, time_ms, mode):
        return None

    def _check_timed_outputs(self, outputs, mode):
        assert outputs == {"seed0": ["answer"]}  # the outputs of the last round that ran

    def _round(self, who, keys, mode, calls, reps, outputs=False, captures=False):
        self.asked.append((who, outputs))
        return reply_for("time_round", {"ok": True, "samples": [self.times[who]] * reps,
                                        **({"outputs": {"seed0": ["answer"]}} if outputs else {})})


FULL = 1 + 4 * 4  # candidate, then (Model, candidate, Reference, candidate) x 4
HALF = 1 + 2 * 4


@pytest.mark.parametrize("best_so_far, share, rounds_run", [
    (2.0, 0.9, HALF),  # 1.0x the Model against a best of 2.0x: out of the running
    (1.05, 0.9, FULL),  # near the best: every round
    (None, 0.9, FULL),  # no best yet
    (2.0, None, FULL),  # economy off (issue 17's before)
])
def test_a_candidate_out_of_the_running_stops_after_half_its_rounds(best_so_far, share, rounds_run):
    cmp = Rounds({"candidate": 1.0, "Model": 1.0, "Reference": 2.0}, share)
    result = EvalResult(verdict="pass")
    cmp._compare_all(result, best_so_far=best_so_far)
    assert len(cmp.asked) == rounds_run
    assert [o for _, o in cmp.asked] == [False] * (rounds_run - 1) + [True]  # outputs checked once, at the end
    assert cmp.asked[-1][0] == "candidate"
    model = result.comparison["model"]
    assert model["ratio"] == pytest.approx(1.0) and model["rounds"] == (rounds_run - 1) // 4  # one per cycle
    stopped = result.comparison.get("stopped", "")
    assert ("out of the running after 4 of 8 baseline rounds" in stopped) == (rounds_run == HALF)
    assert result.timing["median_ms"] == pytest.approx(1.0)


def test_the_null_check_compares_the_model_only():
    cmp = Rounds({"candidate": 1.0, "Model": 1.0, "Reference": 2.0})
    result = EvalResult(verdict="pass")
    cmp._compare_all(result, rounds=12, only=("Model",))
    assert {who for who, _ in cmp.asked} == {"candidate", "Model"} and len(cmp.asked) == 1 + 2 * 12
    assert result.comparison["model"]["rounds"] == 12 and "reference" not in result.comparison
