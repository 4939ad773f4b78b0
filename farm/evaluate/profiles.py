"""Evaluation profiles: the farm's own rules (the default) and KernelBench's.

| rule | farm (default) | kernelbench |
|---|---|---|
| fp32 tolerance (atol, rtol) | 1e-5, 1e-4 | 1e-4, 1e-4 |
| fp16 / bf16 tolerance | 1e-3, 2e-3 / 1e-2, 1.6e-2 | 1e-2, 1e-2 / 1e-2, 1e-2 |
| correctness input sets | the .pt's + 2 secret fresh input sets | the .pt's + 5 trials, seeds derived from the .pt's seed |
| timing | warm-up, flushed reps until 3% RSE or budget; median | 1 warm-up call, 100 flushed event-timed reps; mean |
| summary | speedups per op | speedups per op and fast_p (p = 0, 1, 2) |

KernelBench's rules are those of its `src/eval.py` at its current head (its checkout here,
/work/ext/kb, holds only the problem files): `get_tolerance_for_precision` gives 1e-4 for
fp32 and 1e-2 for fp16/bf16, used as both atol and rtol of `torch.allclose`;
`num_correct_trials=5`, each trial with a seed drawn from a fixed base seed;
`num_perf_trials=100` timed with CUDA events (L2 cache thrashed before each); the reported
runtime is the mean. `fast_p` is the fraction of tasks that are correct and faster than the
PyTorch reference by more than a factor p.

A task's own TOLERANCE (docs/task-format.md) still overrides either profile: it is what the
task's author knows about its numerics.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Profile:
    name: str
    tolerance: dict[str, tuple[float, float]] = field(default_factory=dict)  # over compare.DEFAULT_TOLERANCE
    fresh_inputs: int = 2
    derived_seeds: bool = False  # trial seeds derived from the .pt's seed (KernelBench) or secret (farm)
    timing: dict = field(default_factory=dict)  # over the target's timing options
    statistic: str = "median_ms"  # of the timing stats, for speedups
    fast_p: tuple[float, ...] = ()  # thresholds reported in the run summary


PROFILES = {
    "farm": Profile("farm"),
    "kernelbench": Profile(
        "kernelbench",
        tolerance={"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (1e-2, 1e-2)},
        fresh_inputs=5,
        derived_seeds=True,
        timing={"warmup_ms": 0.0, "min_reps": 100, "max_reps": 100, "rse_target": 0.0, "budget_ms": 60_000.0},
        statistic="mean_ms",
        fast_p=(0.0, 1.0, 2.0),
    ),
}


def get(name: str) -> Profile:
    from farm.config_checks import did_you_mean
    from farm.errors import FarmError

    if name not in PROFILES:
        raise FarmError(f"unknown evaluation profile '{name}' (--profile{did_you_mean(name, PROFILES)}); use one of "
                        f"{', '.join(PROFILES)}")
    return PROFILES[name]


def trial_seed(base: int, trial: int) -> int:
    """KernelBench-style trial seeds: fixed, derived from one base seed (here the .pt's)."""
    digest = hashlib.sha256(f"kernelbench-trial:{base}:{trial}".encode()).digest()
    return int.from_bytes(digest[:4], "little") % (2**31 - 1) + 1


def fast_p(rows: list[dict], p: float) -> float:
    """Fraction of ops that passed and beat PyTorch (the Model) by more than a factor p;
    ops that failed or found nothing count as not fast."""
    if not rows:
        return 0.0
    fast = sum(1 for r in rows if r.get("status") == "succeeded" and (r.get("speedup_vs_model") or 0.0) > p)
    return fast / len(rows)
