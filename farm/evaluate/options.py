"""What a search asks of its evaluators: the command's --flush, --profile, --timing-mode and
--compile-workers, the timing economy switch, and (library callers, tests, benchmarks) whole
evaluator settings to start from. The evaluator's own knobs, kept here rather than among the
search's (farm.search.controller.SearchConfig: budget, concurrency, chunks, seed); a
checkpoint and a report record both side by side, as one `config`, as before."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from farm.config import Settings

if TYPE_CHECKING:  # the evaluator imports torch: a run record (farm.distributed.runs) builds options without it
    from farm.evaluate.evaluator import EvalSettings
    from farm.targets import DeviceSpec


@dataclass(frozen=True)
class EvalOptions:
    flush: str = "write"  # the timer's cache flush: write (as do_bench) or clean (farm.evaluate.timing)
    profile: str = "farm"  # evaluation rules (farm.evaluate.profiles): farm or kernelbench
    timing_mode: str = "auto"  # auto (CUDA graph for short ops), events or graph (farm.evaluate.timing)
    compile_workers: int | None = None  # compile-ahead runners (farm.evaluate.ahead); None: evaluator.compile_workers
    full_timing: bool = False  # every candidate: the whole per-call pass and every round (the search before the timing economy)
    # the evaluator settings these options change (limits, sandbox); None: the device's defaults under `profile`
    base: EvalSettings | None = None

    def settings_for(self, spec: DeviceSpec) -> EvalSettings:
        """The settings of an evaluator on `spec`: the base, with this cache flush, timing mode and economy."""
        from farm.evaluate.evaluator import EvalSettings

        base = self.base or EvalSettings.for_device(spec, self.profile)
        if self.flush == "write" and self.timing_mode == "auto" and not self.full_timing:
            return base  # the evaluator's own timing (a base's timing mode kept)
        extra = {} if self.flush == "write" else {"flush": self.flush}
        full: dict[str, Any] = {"per_call_budget_ms": None, "out_of_running": None} if self.full_timing else {}
        return replace(base, timing={**base.timing, **extra}, mode=self.timing_mode, **full)

    def compile_runners(self, settings: Settings) -> int:
        """The compile-ahead runners asked for: --compile-workers, else the settings' (-1: automatic)."""
        return settings.evaluator.compile_workers if self.compile_workers is None else self.compile_workers

    def as_dict(self) -> dict[str, Any]:
        """The knobs as a checkpoint and a report record them, beside SearchConfig's (`base` is none of them)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "base"}
