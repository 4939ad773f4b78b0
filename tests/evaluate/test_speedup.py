"""Speedups that hold (issue 19): timing-mode choice, interleaving, ratios with their spread,
the promotion rule and the physical limit. Pure logic, no device."""

import math

import pytest

from farm.errors import FarmError
from farm.evaluate import speedup, timing
from farm.evaluate.protocol import reply_for
from farm.evaluate.verifier import Verifier
from farm.search.database import Database, Record
from farm.targets import available

# ---------------------------------------------------------------- timing mode


@pytest.mark.parametrize("requested, target, graph_ms, capture_error, mode, why", [
    ("auto", "cuda", 0.005, "", "graph", "under 20 us"),
    ("auto", "cuda", 0.025, "", "events", "at or over 20 us"),
    ("auto", "cuda", None, "host_sync", "events", "not capturable (host_sync)"),
    ("graph", "cuda", 0.5, "", "graph", "requested"),
    ("graph", "cuda", None, "host_sync", "events", "not capturable (host_sync)"),
    ("events", "cuda", 0.001, "", "events", "requested"),
    ("auto", "cpu", None, "", "events", "host clock"),
    ("graph", "ascend", None, "", "events", "no CUDA graphs"),
])
def test_mode_is_chosen_by_duration_and_capturability_and_says_why(requested, target, graph_ms, capture_error,
                                                                     mode, why):
    got, reason = timing.choose_mode(requested, available()[target], graph_ms, capture_error)
    assert got == mode and why in reason


def test_a_host_bound_original_is_timed_in_a_graph_whatever_its_duration():
    # on the H100 the ops ran 25 us in a graph, yet every flushed per-call batch of the
    # original was host-bound (bench/results/issue19/baseline_h100.json): per call timed the host
    cuda = available()["cuda"]
    mode, reason = timing.choose_mode("auto", cuda, 0.025, "", per_call_host_bound=1.0)
    assert mode == "graph" and "host-bound" in reason
    assert timing.choose_mode("auto", cuda, 0.025, "", per_call_host_bound=0.1)[0] == "events"


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(FarmError, match="--timing-mode"):
        timing.choose_mode("fast", available()["cuda"])


def test_graph_calls_are_whole_rotations_of_the_input_sets():
    assert timing.graph_calls_for(0.005, 2) == 100  # 0.5 ms of 5 us calls
    assert timing.graph_calls_for(0.004, 3) % 3 == 0
    assert timing.graph_calls_for(10.0, 2) == 2  # long calls: one rotation
    assert timing.graph_calls_for(0.0001, 2) == timing.MAX_GRAPH_CALLS


def test_capture_failures_from_host_synchronisation_are_labelled():
    sync = RuntimeError("CUDA error: operation not permitted when stream is capturing")
    assert timing.classify_capture_error(sync) == "host_sync"
    assert timing.classify_capture_error(ValueError("shape mismatch")) == "capture_failed"


def test_host_bound_batches_are_detected():
    # 10 calls behind a 90 us flush: the device needs ~0.95 ms; a host that enqueued them in
    # 0.3 ms stayed ahead, one that took 1 ms did not
    assert not timing.host_bound(0.0003, 0.95)
    assert timing.host_bound(0.001, 0.95)


def test_graph_samples_divide_each_replay_by_its_calls():
    class Clock:
        t = 0.0

        def record(self):
            Clock.t += 1.0
            self.at = Clock.t

        def elapsed_time(self, other):
            return 0.2  # ms per replay

    class Timer:
        def event(self):
            return Clock()

        def synchronize(self):
            pass

    class Graph:
        replays = 0

        def replay(self):
            Graph.replays += 1

    samples = timing.graph_samples(Graph(), 40, 5, Timer())
    assert samples == [0.005] * 5 and Graph.replays == 5


# ---------------------------------------------------------------- interleaving and ratios


def test_every_baseline_round_sits_between_two_candidate_rounds():
    order = speedup.round_order(["Model", "Reference"], 2)
    assert order == ["candidate", "Model", "candidate", "Reference", "candidate", "Model", "candidate",
                     "Reference", "candidate"]
    for i, who in enumerate(order):
        if who != "candidate":
            assert order[i - 1] == order[i + 1] == "candidate"


def test_ratios_are_taken_against_the_neighbouring_candidate_rounds():
    # the device slows down by 2x halfway: a division of figures from different moments would
    # report 0.5x or 2x; the interleaved ratio stays 1.5x throughout
    timed = [("candidate", 1.0), ("Model", 1.5), ("candidate", 1.0), ("Model", 3.0), ("candidate", 2.0),
             ("Model", 3.0), ("candidate", 2.0)]
    ratios = speedup.round_ratios(timed, "Model")
    assert ratios[0] == pytest.approx(1.5) and ratios[2] == pytest.approx(1.5)
    assert ratios[1] == pytest.approx(2.0)  # the round across the step sees the mean of both sides
    assert speedup.candidate_ms(timed) == pytest.approx(1.5)


def test_summary_has_spread_and_a_confidence_interval():
    s = speedup.summarize([1.10, 1.12, 1.09, 1.11, 1.10])
    assert s["ratio"] == pytest.approx(1.10) and s["min"] == 1.09 and s["max"] == 1.12
    assert 1.0 < s["ci_low"] < s["ratio"] < s["ci_high"] < 1.2 and s["rounds"] == 5
    wide = speedup.summarize([0.8, 1.4, 0.9, 1.5])
    assert wide["ci_low"] < 1.0 < wide["ci_high"]
    single = speedup.summarize([1.3])
    assert single["ci_low"] == 0.0 and math.isinf(single["ci_high"])
    assert speedup.summarize([]) is None


# ---------------------------------------------------------------- promotion


def test_a_kernel_not_faster_than_the_model_is_never_promoted_as_a_speedup():
    slower = {"model": speedup.summarize([0.97, 0.99, 0.98, 0.99])}
    ok, why = speedup.promotion(slower, model_runs=True)
    assert not ok and "not faster than the Model" in why
    unsure = {"model": speedup.summarize([0.9, 1.2, 1.0, 1.15])}
    assert speedup.promotion(unsure, model_runs=True)[0] is False
    faster = {"model": speedup.summarize([1.20, 1.22, 1.19, 1.21])}
    ok, why = speedup.promotion(faster, model_runs=True)
    assert ok and "faster than the Model: 1.2" in why
    assert speedup.promotion({}, model_runs=True)[0] is False


def test_a_ratio_the_model_reaches_against_itself_is_no_speedup():
    # the H100 run: the Model against itself measured 1.038x for demo/row_sum
    null = speedup.summarize([1.036, 1.039, 1.038, 1.040])
    apparent = speedup.summarize([1.037, 1.040, 1.039, 1.038])
    ok, why = speedup.promotion({"model": apparent, "null": null}, model_runs=True)
    assert not ok and "against itself 1.03" in why
    real = speedup.summarize([1.20, 1.21, 1.19, 1.20])
    assert speedup.promotion({"model": real, "null": null}, model_runs=True)[0]


def test_a_ratio_within_the_margin_of_the_null_check_is_no_speedup():
    # the H100 run (AKG get_mla_kv_buffer): 1.029x over a null of 1.020x, 0.989x re-timed alone
    null = speedup.summarize([1.0195, 1.0197, 1.0199, 1.0196])
    close = speedup.summarize([1.0288, 1.0290, 1.0292, 1.0289])
    ok, why = speedup.promotion({"model": close, "null": null}, model_runs=True)
    assert not ok and "3% margin" in why
    assert speedup.promotion({"model": speedup.summarize([1.08, 1.09, 1.085, 1.08]), "null": null}, True)[0]
    assert not speedup.may_promote(speedup.summarize([1.01, 1.02, 1.015, 1.02]))
    assert speedup.may_promote(speedup.summarize([1.08, 1.09, 1.085, 1.08]))


def test_where_the_model_cannot_run_promotion_says_so_instead_of_a_ratio():
    ok, why = speedup.promotion({"model": None}, model_runs=False)
    assert ok and "does not run on this target" in why


# ---------------------------------------------------------------- the physical limit


def test_limit_is_the_larger_of_bandwidth_time_and_the_empty_kernel():
    # 3 MB at 3 TB/s = 1 us, under a 2 us empty kernel: launch-bound
    lim = speedup.physical_limit(3_000_000, 3e12, 0.002, 0.004)
    assert lim["bound"] == "launch" and lim["limit_ms"] == pytest.approx(0.002) and lim["fraction"] == pytest.approx(0.5)
    # 300 MB: 100 us of traffic, bandwidth-bound
    lim = speedup.physical_limit(300_000_000, 3e12, 0.002, 0.125)
    assert lim["bound"] == "bandwidth" and lim["fraction"] == pytest.approx(0.8)
    assert speedup.physical_limit(1, None, 0.001, 1.0) is None


# ---------------------------------------------------------------- ranking never mixes modes


def _rec(i, ms, mode, op_mode="graph"):
    return Record(id=f"c{i}", source=f"s{i}", generator="tune", note="", lineage=0, generation=0, parent=None,
                  source_hash=f"h{i}", verdict="pass", time_ms=ms, timing={"mode": mode, "op_mode": op_mode})


def test_a_per_call_figure_never_outranks_graph_figures():
    db = Database()
    db.add(_rec(1, 0.010, "graph"))
    db.add(_rec(2, 0.004, "events"))  # could not be captured: timed per call, not comparable
    db.add(_rec(3, 0.008, "graph"))
    assert [r.id for r in db.passing()] == ["c3", "c1", "c2"] and db.best().id == "c3"


def test_interpreter_timings_promote_as_verified_not_as_a_speedup():
    ok, why = speedup.promotion({"model": speedup.summarize([0.5, 0.6])}, model_runs=True, timed=False)
    assert ok and "not as a speedup" in why


# ---------------------------------------------------------------- the evaluator's comparison, scripted


def _scripted_evaluator(round_reply):
    """An Evaluator with its runners replaced by `round_reply(who, mode)`: the comparison logic
    alone, no device (the graph path itself ran on the H100, docs/results.md)."""
    from farm.evaluate.evaluator import EvalSettings, Evaluator
    from farm.targets import resolve_device

    ev = object.__new__(Evaluator)
    ev.spec = resolve_device("cuda:0")
    ev.settings = EvalSettings(rounds=3, round_reps=4)
    ev._null_run = False
    ev.space_cases, ev.cases_note, ev.mix = [], "", []  # no recorded shape-space cases
    ev._op_timing = {"mode": "graph", "reason": "original 2.0 us per call in a graph, under 20 us",
                     "graph_calls": 100, "flush": "none"}
    ev._baseline_slots = lambda: {"Model": "", "Reference": ""}
    ev._time_cases = lambda: (["seed0", "seed1"], [([], []), ([], [])])
    ev._put = lambda key, inputs: None
    ev._check_timed_outputs = lambda outputs, mode: None
    ev.baseline = lambda: {"model_ms": 0.05}
    ev.floor = lambda: {"copy_bw_bytes_s": 3e12, "empty_kernel_ms": {"graph": 0.001, "events": 0.003}}
    ev._bytes_moved = lambda: 3_000_000
    ev._round = lambda who, keys, mode, calls, reps, outputs=False, captures=False: reply_for(
        "time_round", round_reply(who, mode))
    return ev


def test_a_candidate_that_cannot_be_captured_is_timed_per_call_and_labelled():
    from farm.evaluate.evaluator import EvalResult

    def reply(who, mode):
        if who == "candidate" and mode == "graph":
            return {"ok": True, "capture_error": "host_sync", "detail": "operation not permitted when capturing"}
        ms = {"candidate": 0.010, "Model": 0.012, "Reference": 0.020}[who]
        return {"ok": True, "samples": [ms] * 4}

    ev = _scripted_evaluator(reply)
    result = EvalResult(verdict="pass", timing={"median_ms": 0.011})
    ev._compare_all(result)
    assert result.timing["mode"] == "events" and result.timing["op_mode"] == "graph"
    assert "not capturable (host_sync)" in result.timing["mode_reason"]
    assert result.comparison["model"]["mode"] == "events"  # the ratio is of per-call figures on both sides
    assert result.speedup_vs_model == pytest.approx(1.2)
    assert result.limit["mode"] == "events" and result.limit["empty_kernel_ms"] == 0.003
    assert result.timing["per_call_ms"] == 0.011


def test_a_baseline_that_cannot_be_captured_is_compared_per_call_on_its_own():
    from farm.evaluate.evaluator import EvalResult

    def reply(who, mode):
        if who == "Reference" and mode == "graph":
            return {"ok": True, "capture_error": "host_sync"}
        ms = {"candidate": 0.010, "Model": 0.015, "Reference": 0.030}[who]
        return {"ok": True, "samples": [ms] * 4}

    ev = _scripted_evaluator(reply)
    result = EvalResult(verdict="pass", timing={"median_ms": 0.011})
    ev._compare_all(result)
    assert result.timing["mode"] == "graph" and result.comparison["model"]["mode"] == "graph"
    assert result.comparison["reference"]["mode"] == "events"  # never mixed with the graph figures
    assert result.speedup_vs_model == pytest.approx(1.5) and result.speedup_vs_reference == pytest.approx(3.0)
    assert result.limit["fraction"] == pytest.approx(0.1)  # 1 us of traffic at 3 TB/s over 10 us


def test_a_graph_that_replays_outputs_cached_at_capture_fails_on_new_data_in_its_buffers():
    """A forward that computes during the eager warm-up and only copies a cached answer while
    being captured replays that answer: the last candidate round writes the second secret
    set into the graph's buffers and replays once, and the stale output is a cheat."""
    import types

    import torch

    from farm.evaluate.result import EvalResult, Stop
    from farm.runtime.tolerance import DEFAULT_TOLERANCE

    right0, right1 = torch.ones(4), torch.full((4,), 2.0)
    sent = []

    def call(cmd, timeout, **args):
        sent.append(args)
        replay = {"seed0": [right0]}
        if args.get("outputs"):
            replay["seed1"] = [right0]  # the cached answer, whatever the buffers hold
        return reply_for("time_round", {"ok": True, "samples": [0.002] * 4, "captured": True, "launches": 100,
                                        "side_stream": False, "foreign_thread": False, "outputs": replay,
                                        "swap_check": "replayed"})

    ev = _scripted_evaluator(lambda who, mode: None)
    del ev._round, ev._check_timed_outputs  # the real ones
    ev.task = types.SimpleNamespace(inplace_args=())
    ev.tolerance = DEFAULT_TOLERANCE
    ev.verifier = Verifier(DEFAULT_TOLERANCE)
    ev._time_cases = lambda: (["seed0", "seed1"], [([], [right0]), ([], [right1])])
    ev._call = call
    ev.trusted = types.SimpleNamespace(call=lambda cmd, timeout, **a: reply_for(
        "time_round", {"ok": True, "samples": [0.003] * 4}))
    with pytest.raises(Stop, match="input set seed1 \\(graph\\)"):
        ev._compare_all(EvalResult(verdict="pass"))
    assert [a["keys"] for a in sent] == [["seed0"]] * len(sent)  # timed on one set, as serving replays
    assert sent[-1]["swap_key"] == "seed1" and "swap_key" not in sent[0]
