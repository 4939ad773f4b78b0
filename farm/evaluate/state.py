"""What an Evaluator (farm.evaluate.evaluator) holds, declared once for its parts: the trusted
side (farm.evaluate.trusted) and the comparison (farm.evaluate.rounds) are mixins that use
the Evaluator's state and each other's methods. Declarations only, for the type check: the
Evaluator's __init__ sets every attribute, and each method is defined in the part named beside
it. Nothing here exists at run time but the class."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # names for the type check only: importing this module imports nothing
    from contextlib import AbstractContextManager

    from farm.corpus.tasks import Task, TaskRef
    from farm.evaluate.backward import BackwardCheck
    from farm.evaluate.eval_settings import EvalSettings
    from farm.evaluate.lease import DeviceLease
    from farm.evaluate.pool import RunnerPool
    from farm.evaluate.profiles import Profile
    from farm.evaluate.protocol import Reply
    from farm.evaluate.result import EvalResult
    from farm.evaluate.runner import Runner
    from farm.evaluate.sandbox import Boundary
    from farm.evaluate.verifier import Case, Verifier
    from farm.targets import DeviceSpec


class EvaluatorState:
    settings: EvalSettings
    spec: DeviceSpec
    ref: TaskRef
    data: dict  # the reference data (.pt)
    task: Task
    profile: Profile
    shapes: str
    secret_inputs: list | None  # reference-data mode's recorded secret input sets
    pt_only: bool
    init_inputs: list
    inputs: list
    expected: list
    cases_note: str
    space_cases: list[Case]
    boundary: Boundary
    verifier: Verifier
    pool: RunnerPool
    candidates: Runner | None  # the current candidate's runner, during evaluate()
    trusted: Runner  # the trusted runner
    lease: DeviceLease
    backward: BackwardCheck | None
    _cases: list[tuple[list, list]] | None  # the secret cases: (inputs, truth)
    _seeds: list[int | None]
    _baseline: dict | None

    if TYPE_CHECKING:
        # farm.evaluate.evaluator.Evaluator
        def _clean(self, text: str, limit: int) -> str: ...
        def _call(self, cmd: str, timeout: float, key: str | None = None, inputs: list | None = None,
                  **args: Any) -> Reply: ...
        def _compile(self, candidate_code: str, name: str) -> Reply: ...
        def _verify(self, first: Reply, result: EvalResult) -> None: ...
        def _put(self, key: str, inputs: list) -> None: ...
        def _retire(self) -> None: ...

        # farm.evaluate.rounds.Comparison
        def _device(self, phase: str, pin: bool = False) -> AbstractContextManager[None]: ...

        # farm.evaluate.trusted.TrustedSide
        def _new_trusted(self) -> Runner: ...
        def _take_runner(self) -> Runner: ...
        def draw_cases(self, n: int, fresh: bool = False, prefix: str = "seed") -> tuple[list, list]: ...
        def fresh_cases(self) -> list[tuple[list, list]]: ...
        def baseline(self) -> dict: ...
        def _probe_count(self) -> int: ...

        @property
        def uses_secret_inputs(self) -> bool: ...

