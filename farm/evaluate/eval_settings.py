"""What an Evaluator (farm.evaluate.evaluator) is told: the limits its runners run under, its
timing rules and the comparison's rounds. Apart from the Evaluator so that its parts (the
mixins farm.evaluate.trusted and .comparison) can name the type without importing it back."""

from __future__ import annotations

from dataclasses import dataclass, field

from farm.evaluate import profiles
from farm.evaluate.runner import Limits
from farm.evaluate.timing import GRAPH_THRESHOLD_MS
from farm.targets import DeviceSpec


@dataclass
class EvalSettings:
    fresh_inputs: int = 2
    timing: dict = field(default_factory=dict)  # options for farm.evaluate.timing.measure
    limits: Limits = field(default_factory=Limits)
    # where the target's events time only the device (Target.host_check: cuda): a call whose host
    # time is this many times its event time (and 2 ms more) did work the events did not see
    unseen_work_ratio: float = 4.0
    sandbox: str | None = None  # auto or off; None: the evaluator's settings' evaluator.sandbox
    # python of the target's frontend check environment (triton-ascend's virtualenv,
    # farm.ascend.frontend); None: its default lookup
    frontend_python: str | None = None
    profile: str = "farm"  # farm.evaluate.profiles: tolerances, trials, timing rules
    mode: str = "auto"  # timing mode of the comparison: auto, events or graph (farm.evaluate.timing)
    graph_threshold_ms: float = GRAPH_THRESHOLD_MS
    rounds: int = 4  # comparison rounds per baseline, per candidate
    round_reps: int = 20  # per-call figures (events) or graph replays in one round
    retime_rounds: int = 12  # the re-timing before promotion
    # a candidate's device time is mostly timing: the per-call pass beside a comparison gives checks and
    # a labelled figure, not the ratio (its budget, in ms; None: the profile's); a candidate whose
    # ratios after half the rounds all stay under this share of the op's best stops there (None: never)
    per_call_budget_ms: float | None = 100.0
    out_of_running: float | None = 0.9
    warm_runners: int = 1  # candidate runners kept started ahead (farm.evaluate.pool)
    # the cases of the op's shape space verified and timed (farm.evaluate.space_cases); None:
    # the evaluator's settings' evaluator.cases and evaluator.timed_cases
    cases: int | None = None
    timed_cases: str | None = None

    @classmethod
    def for_device(cls, spec: DeviceSpec, profile: str = "farm") -> EvalSettings:
        rules = profiles.get(profile)
        if spec.target.interpret:
            # the interpreter is slow and its timings only rank roughly: a few repetitions,
            # whatever the profile says about timing
            return cls(timing={"warmup_ms": 0.0, "budget_ms": 300.0, "min_reps": 3, "max_reps": 20,
                               "rse_target": 0.05}, fresh_inputs=rules.fresh_inputs, profile=profile,
                       rounds=1, round_reps=2, retime_rounds=3)
        return cls(timing=dict(rules.timing), fresh_inputs=rules.fresh_inputs, profile=profile)
