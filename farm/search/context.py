"""What a search shares from the command down to each op's OpSearch (farm.search.batch,
farm.search.controller, the distributed chunk task): one frozen object in place of a dozen
parameters passed through every layer. Per op, a batch derives its own with
`dataclasses.replace` (its share of the budget, its cancel event).

`settings` are the command's own (its --config and --set; a worker's environment): the
evaluators read their sandbox policy, cases and secrets from there, never from a process-wide
"current" copy. `evaluator_factory` builds one evaluator per device; a benchmark that replays
recorded timings passes its own, which answers what `SearchEvaluator` lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from farm.config import Settings, environment_settings
from farm.evaluate.options import EvalOptions

if TYPE_CHECKING:
    import threading

    from farm.evaluate.ahead import CompileAhead
    from farm.evaluate.evaluator import EvalSettings
    from farm.evaluate.result import EvalResult
    from farm.generators import Generator
    from farm.storage import Store
    from farm.targets import DeviceSpec


@dataclass
class SearchConfig:
    """The search's own knobs; the evaluators' are EvalOptions (farm.evaluate.options)."""

    max_tasks: int = 40  # candidates evaluated, seeds included
    max_concurrent: int = 4  # candidates in flight per device
    chunk_size: int = 8  # candidates between two checkpoints
    generators: tuple[str, ...] = ("tune", "port")
    seed: int = 0
    early_stop: bool = True
    window: int = 5  # candidates per convergence window
    time_budget_s: float | None = None


class SearchEvaluator(Protocol):
    """What an OpSearch asks of each device's evaluator (farm.evaluate.evaluator.Evaluator)."""

    spec: DeviceSpec
    settings: EvalSettings  # part of the identity of the fixed costs kept with the checkpoint

    def fixed_costs(self) -> dict[str, Any]: ...  # paid once per op: {"baseline": ..., "cases": ...}
    def adopt(self, fixed: dict[str, Any]) -> None: ...  # another evaluator's fixed costs
    def verification(self) -> dict[str, Any]: ...  # how a pass is verified (farm.evaluate.verified)
    def device_info(self) -> dict[str, Any]: ...
    def compile_ahead(self, specs: list[DeviceSpec], size: int, target: str) -> CompileAhead: ...
    def evaluate(self, candidate_code: str, name: str = ..., best_so_far: float | None = ...,
                 runner: Any = ...) -> EvalResult: ...
    def retime(self, candidate_code: str, name: str = ...) -> dict[str, Any]: ...  # the re-timing before promotion
    def model_runs(self) -> bool: ...
    def close(self) -> None: ...


def _evaluator(*args: Any, **kwargs: Any) -> SearchEvaluator:
    from farm.evaluate.evaluator import Evaluator  # torch and the runners: only where a search runs

    return Evaluator(*args, **kwargs)


@dataclass(frozen=True)
class SearchContext:
    store: Store
    run: str
    target: str
    devices: Sequence[DeviceSpec]  # one evaluator each; a list given is kept as a tuple
    generators: Sequence[Generator]
    config: SearchConfig
    evaluation: EvalOptions = field(default_factory=EvalOptions)  # what the evaluators are asked
    settings: Settings = field(default_factory=environment_settings)
    on_event: Callable[[str, dict], None] | None = None  # ("candidate" | "chunk" | "retime", details)
    cancel: threading.Event | None = None  # set: stop at the next candidate, checkpoint kept (an interrupted batch)
    # (task_ref, ref_data, spec, EvalSettings, Settings) -> an evaluator
    evaluator_factory: Callable[..., SearchEvaluator] = _evaluator

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "generators", tuple(self.generators))

    def event(self, kind: str, info: dict) -> None:
        if self.on_event is not None:
            self.on_event(kind, info)

    def record(self) -> dict[str, Any]:
        """The search's and the evaluators' knobs, as one `config` in a checkpoint and a report."""
        return {**asdict(self.config), **self.evaluation.as_dict()}
