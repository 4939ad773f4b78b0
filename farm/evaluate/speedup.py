"""Speedups that hold: ratios measured in one place, their spread, the promotion rule and the
physical limit. Pure functions; the evaluator feeds them the per-round times it measured.

A speedup is never a division of two figures taken in different processes or moments. The
candidate and each baseline (the original Model, the PyTorch Reference) are timed in rounds,
in runners of the same kind, with the same flush and timing mode, in the order

    candidate, Model, candidate, Reference, candidate, Model, candidate, ...

so every baseline round sits between two candidate rounds and drift (clocks, a neighbour on
the host) hits both sides. Each baseline round gives one ratio: its median over the mean of
the medians of the candidate rounds either side. The speedup is the median of those ratios;
its spread is their min and max, and a confidence interval comes from the t distribution of
their logarithms.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable

CANDIDATE = "candidate"
CONFIDENCE = 0.95
# two-sided 95% quantiles of Student's t, by degrees of freedom (1..30); normal beyond
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def round_order(baselines: Iterable[str], rounds: int) -> list[str]:
    """Who is timed in which round: each baseline round between two candidate rounds."""
    baselines = list(baselines)
    order = [CANDIDATE]
    for _ in range(rounds):
        for name in baselines:
            order += [name, CANDIDATE]
    return order


def round_ratios(timed: list[tuple[str, float]], baseline: str) -> list[float]:
    """(who, round median ms) in the order they ran -> baseline/candidate ratio per baseline round,
    against the mean of the candidate rounds just before and just after it."""
    out = []
    for i, (who, ms) in enumerate(timed):
        if who != baseline:
            continue
        before = next((m for w, m in reversed(timed[:i]) if w == CANDIDATE), None)
        after = next((m for w, m in timed[i + 1:] if w == CANDIDATE), None)
        around = [m for m in (before, after) if m is not None]
        if around and ms > 0:
            out.append(ms / statistics.fmean(around))
    return out


def t_quantile(df: int) -> float:
    if df < 1:
        return math.inf
    return _T975[df - 1] if df <= len(_T975) else 1.96


def summarize(ratios: list[float]) -> dict | None:
    """Median ratio, min/max spread and a 95% confidence interval (t on the log ratios)."""
    ratios = [r for r in ratios if r > 0 and math.isfinite(r)]
    if not ratios:
        return None
    logs = [math.log(r) for r in ratios]
    if len(logs) > 1:
        half = t_quantile(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    else:
        half = math.inf
    centre = statistics.fmean(logs)
    return {"ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "rounds": len(ratios),
            "ci_low": math.exp(centre - half) if math.isfinite(half) else 0.0,
            "ci_high": math.exp(centre + half) if math.isfinite(half) else math.inf, "confidence": CONFIDENCE}


def mix_summary(cases: list[dict]) -> dict:
    """The serving mix's figure from per-case summaries (`summarize`): the geometric mean of their
    ratios, and an interval from their half-widths on the log scale (independent cases: the
    half-width of a mean of k logs is the root of the summed squares over k). One case with a
    single round (an open interval) leaves the mix's interval open."""
    logs = [math.log(c["ratio"]) for c in cases]
    centre = statistics.fmean(logs)
    halves = [(math.log(c["ci_high"]) - math.log(c["ci_low"])) / 2
              if c.get("ci_low") and c.get("ci_high") and math.isfinite(c["ci_high"]) else math.inf for c in cases]
    half = math.sqrt(sum(h * h for h in halves)) / len(cases) if all(map(math.isfinite, halves)) else math.inf
    return {"ratio": math.exp(centre), "min": min(c["ratio"] for c in cases), "max": max(c["ratio"] for c in cases),
            "cases": len(cases), "rounds": min(c.get("rounds", 0) for c in cases),
            "ci_low": math.exp(centre - half) if math.isfinite(half) else 0.0,
            "ci_high": math.exp(centre + half) if math.isfinite(half) else math.inf, "confidence": CONFIDENCE,
            "geomean": True}


def candidate_ms(timed: list[tuple[str, float]]) -> float:
    """The candidate's figure over the whole comparison: median of its round medians."""
    return statistics.median(ms for who, ms in timed if who == CANDIDATE)


# A re-timing whose interval is wider than this either side is timed again with WIDE_ROUNDS
# times the rounds: per-call figures of a forward that synchronises with the host spread by
# 20-40% from round to round on the H100 (AKG prefill_attention_fwd_kernel: 0.90-1.39 in 12
# rounds), and a median of 12 such ratios moved by more than the 10% another process must
# agree within (bench/retime.py's check). Intervals in the graph timing mode are a fraction of
# a percent: they never pay.
MAX_HALF_WIDTH = 0.05
WIDE_ROUNDS = 3


def too_wide(summary: dict | None) -> bool:
    """Whether a ratio's 95% interval is wider than +-MAX_HALF_WIDTH around its middle."""
    if not summary or not summary.get("ci_low"):
        return False
    return summary["ci_high"] / summary["ci_low"] > ((1 + MAX_HALF_WIDTH) / (1 - MAX_HALF_WIDTH))


# ---------------------------------------------------------------- promotion


# A ratio's interval says how far the rounds agree, not how far another process agrees: on the
# H100 a kernel's figure moved by up to 2% with the runner it was timed in while the Model
# against itself stayed inside a 0.1% interval (AKG get_mla_kv_buffer, 2026-11-24: promoted at
# 1.029x over a null check of 1.020x, 0.989x in an independent re-timing). A promoted ratio must
# clear the null check by this much more.
PROMOTION_MARGIN = 0.03
# The search's own figure for the best (its comparison, in the runner the candidate ran in) must
# agree with the independent re-timing: a claimed ratio above the re-timing's interval by more
# than this is not confirmed, and not promoted: a runner the candidate ran in may have been
# rewritten by it, so its figure counts only where a fresh one agrees.
CONFIRM_TOLERANCE = 0.15


def promotion(confirmation: dict | None, model_runs: bool, timed: bool = True) -> tuple[bool, str]:
    """Whether a re-timed best may be promoted as a speedup over the original, and why.

    `confirmation` is the independent re-timing (fresh runners, fresh secret inputs):
    {"model": summarize(...) or None, "null": summarize(...) of the Model against itself, or
    None, "claimed": the search's own figure, or None}. A claimed figure above the re-timing's
    interval by more than CONFIRM_TOLERANCE is not confirmed. Where the Model runs on the
    target, the kernel must be faster with 95% confidence (the interval's low end above 1),
    and faster than the Model measured against itself (the low end above the null check's
    high end), by PROMOTION_MARGIN: a ratio a copy of the original also reaches is no speedup.
    Where it cannot run, there is no ratio to the original:
    promotion says so and rests on the kernel being verified. `timed` is False where the
    target's timings are not kernel timings (cpu: the Triton interpreter): the same."""
    if not timed:
        return True, "interpreter timings (cpu target) are not kernel timings: promoted as verified, not as a speedup"
    if not model_runs:
        return True, "the original Model does not run on this target: no speedup over it can be measured"
    confirmation = confirmation or {}
    model = confirmation.get("model")
    if not model:
        return False, "not re-timed against the Model: no speedup to report"
    text = f"{model['ratio']:.3f}x (95% CI {model['ci_low']:.3f}-{model['ci_high']:.3f}, {model['rounds']} rounds)"
    mix = confirmation.get("mix")
    if mix:  # the serving mix decides (farm.evaluate.mix_timing); the benchmark case is one of its cases
        text = (f"geomean {mix['ratio']:.3f}x over {mix['cases']} timed cases (95% CI {mix['ci_low']:.3f}-"
                f"{mix['ci_high']:.3f}; benchmark case {text})")
        if mix.get("slower"):
            text += f"; slower than the Model at: {', '.join(mix['slower'])}"
    null = confirmation.get("null")
    bar = promotion_bar(null)
    if null:
        text += f"; the Model against itself {null['ratio']:.3f}x (CI {null['ci_low']:.3f}-{null['ci_high']:.3f})"
    for claimed, measured in ((confirmation.get("claimed"), model), (confirmation.get("claimed_mix"), mix)):
        if claimed and measured and claimed.get("ratio") and \
                claimed["ratio"] > measured["ci_high"] * (1 + CONFIRM_TOLERANCE):
            return False, (f"the search's figure {claimed['ratio']:.3f}x is not confirmed by the independent "
                           f"re-timing: {text}")
    if (mix or model)["ci_low"] > bar:
        return True, f"faster than the Model: {text}"
    return False, f"not faster than the Model with 95% confidence and a {PROMOTION_MARGIN:.0%} margin: {text}"


def promotion_bar(null: dict | None) -> float:
    """The ratio a kernel's interval must clear: the Model against itself (or 1), plus the margin."""
    return max(1.0, null["ci_high"] if null else 1.0) * (1.0 + PROMOTION_MARGIN)


def may_promote(model: dict | None) -> bool:
    """Whether a re-timed ratio could clear any null check's bar: if not, the null check (a
    fresh runner and the promotion's rounds, all holding the device) cannot change the verdict."""
    return model is not None and bool(model) and model["ci_low"] > promotion_bar(None)


# ---------------------------------------------------------------- the physical limit


def physical_limit(bytes_moved: int, copy_bw_bytes_s: float | None, empty_ms: float | None,
                   time_ms: float | None) -> dict | None:
    """farm.evaluate.limits.physical_limit (the one definition) for a bandwidth-or-launch op."""
    from farm.evaluate import limits

    floor = {"copy_bw_bytes_s": copy_bw_bytes_s, "empty_kernel_ms": {"any": empty_ms}} if empty_ms is not None else None
    return limits.physical_limit(bytes_moved, floor, "any", time_ms)
