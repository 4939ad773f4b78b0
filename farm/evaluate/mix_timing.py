"""Timing over a serving mix (issue 32): the candidate against the Model at each timed case of
the op's shape space (farm.evaluate.space_cases), after the comparison at the benchmark case.

A serving engine calls a kernel at a different token count on nearly every step; a kernel
faster at prefill sizes can be slower at decode sizes. Each timed case gets interleaved rounds
of its own (candidate, Model, candidate, ...: farm.evaluate.speedup), in the op's timing mode
with a graph size scaled to the case's bytes, its timed outputs checked against the case's
recorded truth and its rounds held to the evaluator's clock like the benchmark case's. The
result keeps one row per case in `timing["cases"]` ({case, label, shape, time_ms, model_ms,
speedup, ci_low, ci_high, mode, rounds}); with more than one case `comparison["mix"]` holds the
geometric mean of the per-case ratios with its interval (speedup.mix_summary) and the labels of
the cases where the kernel is slower than the Model (`slower`), and `speedup_vs_model` is that
geomean. A candidate out of the running (its comparison stopped early) is not timed further.
"""

from __future__ import annotations

import statistics

from farm.evaluate import speedup as speedups
from farm.evaluate import timing
from farm.evaluate.result import NotCapturable, nbytes
from farm.evaluate.space_cases import RUNNER_KEY, shapes_text
from farm.evaluate.timer import RoundClock


def bench_row(ev, result) -> dict:
    model = (result.comparison or {}).get("model") or {}
    time_ms = result.timing["median_ms"]
    shapes = [list(v.shape) for v in getattr(ev, "inputs", ()) if hasattr(v, "shape")]
    return _row("bench", "the benchmark case (.pt)", shapes, time_ms,
                time_ms * model["ratio"] if model.get("ratio") else None, model, result.timing.get("mode"))


def _row(label: str, text: str, shapes: list, time_ms, model_ms, summary: dict | None, mode) -> dict:
    summary = summary or {}
    return {"case": text, "label": label, "shape": shapes, "time_ms": time_ms, "model_ms": model_ms,
            "speedup": summary.get("ratio"), "ci_low": summary.get("ci_low"), "ci_high": summary.get("ci_high"),
            "mode": mode, "rounds": summary.get("rounds", 0)}


def time_mix(ev, result, mode: str, ready: list[str], rounds: int) -> None:
    """Every timed case after the benchmark one; the rows, the mix and its geomean into `result`."""
    rows = [bench_row(ev, result)]
    mix = getattr(ev, "mix", ())  # evaluators built without reference data (scripted tests) have none
    if mix and "Model" in ready and not ev._cut:
        for case in mix:
            summary, case_ms, model_ms, case_mode = _time_case(ev, case, mode, rounds)
            rows.append(_row(case.tag, case.label, shapes_text(case), case_ms, model_ms, summary,
                             timing.recorded_mode(case_mode, ev.spec.target)))
    result.timing["cases"] = rows
    summaries = [(r["label"], {"ratio": r["speedup"], "ci_low": r["ci_low"], "ci_high": r["ci_high"],
                               "rounds": r["rounds"]}) for r in rows]
    if len(rows) > 1 and all(s["ratio"] for _, s in summaries):
        mix = speedups.mix_summary([s for _, s in summaries])
        mix["slower"] = [label for label, s in summaries if s["ratio"] < 1.0]
        result.comparison["mix"] = mix
        result.speedup_vs_model = mix["ratio"]


def _time_case(ev, case, mode: str, rounds: int) -> tuple[dict | None, float | None, float | None, str]:
    """One case's interleaved rounds against the Model: (ratio summary, candidate ms, Model ms, timing mode)."""
    bench_bytes = max(1, ev._bytes_moved())
    case_bytes = max(1, sum(nbytes(case.inputs)) + sum(nbytes(case.expected)))
    calls = ev.op_timing()["graph_calls"]
    outer_clock = ev._clock
    ev._mix_case, ev._mix_calls = case, max(1, round(calls * bench_bytes / case_bytes)) if calls else 0
    ev._clock = RoundClock(lead_allowed=outer_clock.lead_allowed)
    try:
        ev.candidates.cached_inputs.discard(RUNNER_KEY)  # this case replaces the one the runner kept
        trusted = ev.trusted
        if getattr(trusted, "space_case", None) != (case.key, trusted.starts) or RUNNER_KEY not in trusted.cached_inputs:
            trusted.cached_inputs.discard(RUNNER_KEY)  # (its graphs of the last case go with it: runner_child)
            if trusted.call("put_inputs", ev.settings.limits.run_s, key=RUNNER_KEY, inputs=case.inputs).ok:
                trusted.cached_inputs.add(RUNNER_KEY)
                trusted.space_case = (case.key, trusted.starts)
        try:
            timed, _samples, outputs, failed = ev._interleave(mode, ["Model"], rounds)
        except NotCapturable:
            mode = "events"
            timed, _samples, outputs, failed = ev._interleave(mode, ["Model"], rounds)
        ev._check_timed_outputs(outputs, mode)
        ev._check_clock(mode, ["Model"], rounds)
    finally:
        ev._mix_case, ev._mix_calls, ev._clock = None, 0, outer_clock
    if "Model" in failed or not timed:
        return None, None, None, mode
    mine = [ms for who, ms in timed if who == speedups.CANDIDATE]
    model = [ms for who, ms in timed if who == "Model"]
    summary = speedups.summarize(speedups.round_ratios(timed, "Model"))
    return (summary, statistics.median(mine) if mine else None, statistics.median(model) if model else None, mode)
