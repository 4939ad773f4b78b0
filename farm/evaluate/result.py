"""What an evaluation returns, and how a stage ends it: shared by the evaluator and its
comparison (farm.evaluate.rounds)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# What a verdict keeps of a candidate's words (its exception text, its log), after known
# secrets are masked: stored in reports and databases and put into repair prompts.
REASON_CHARS = 2000
LOG_CHARS = 4000


@dataclass
class EvalResult:
    verdict: str
    reason: str = ""
    log: str = ""
    outputs: list[dict] = field(default_factory=list)
    seeds_checked: int = 0
    cases_checked: int = 0  # cases of the op's shape space verified (farm.evaluate.space_cases)
    launches: int = 0
    kernels: list[str] = field(default_factory=list)
    timing: dict | None = None
    baseline: dict = field(default_factory=dict)
    speedup_vs_model: float | None = None
    speedup_vs_reference: float | None = None
    comparison: dict = field(default_factory=dict)  # how the speedups were measured, with their spread
    limit: dict | None = None  # the physical limit and the fraction of it reached
    suspicious: bool = False
    stage_s: dict = field(default_factory=dict)
    device: dict = field(default_factory=dict)
    # training ops (BACKWARD): how the backward was verified, forward+backward timing and speedups
    backward: dict | None = None
    timing_backward: dict | None = None
    speedup_fwd_bwd_vs_model: float | None = None
    speedup_fwd_bwd_vs_reference: float | None = None
    sandbox: str = "none"  # the runner's operating-system boundary: bwrap, or none (docs/evaluator.md)
    frontend: dict | None = None  # the target's frontend check: what ran, per kernel (or why not)
    # how the verdict was verified beyond the .pt: {"by": "reference" | "seed_sets", "sets": N,
    # "truth": ...}; "reference" = Reference run on the target on N secret fresh input sets,
    # "seed_sets" = N secret input sets of the original Model recorded on the reference platform
    verified: dict = field(default_factory=dict)
    # what bounded the runner besides time and memory: pids limit and how, tmpfs sizes (MB)
    runner_limits: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Stop(Exception):
    """Ends an evaluation with a verdict."""

    def __init__(self, verdict: str, reason: str, log: str = ""):
        super().__init__(reason)
        self.verdict, self.reason, self.log = verdict, reason, log


class NotCapturable(Exception):
    """The candidate's forward could not be captured in a CUDA graph."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def nbytes(values: list) -> list[int]:
    import torch

    return [v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor)]
