"""The verifier: a candidate's outputs against the truth, compared in the evaluator's process.

A runner only returns outputs (plain tensors, size-checked on the way: farm.evaluate.wire);
whether they are right is decided here, case by case. A case is one input set with its truth:
the reference data's (.pt), a fresh input set's (Reference run on the target by the trusted
runner), or a secret input set recorded with the reference data. A failure names the case: what
it is, its inputs' shapes and dtypes, and its seed where the seed is not a secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from farm.evaluate.result import Stop
from farm.runtime.tensors import describe_values, identical
from farm.runtime.tolerance import all_ok, compare_outputs


@dataclass
class Case:
    key: str  # the input set's name in a runner
    inputs: list
    expected: list
    label: str  # how a verdict names it
    seed: int | None = None
    secret: bool = False
    shapes: list = field(default_factory=list)
    tag: str = ""  # a case of the op's shape space: its label there (bench, low, prime, ...)

    def describe(self) -> str:
        shapes, dtypes = describe_values(self.inputs)
        tensors = ", ".join(f"{list(s)} {str(d).removeprefix('torch.')}"
                            for s, d in zip(shapes, dtypes) if s is not None)
        seed = "secret seed" if self.secret else (f"seed {self.seed}" if self.seed is not None else "")
        extra = "; ".join(x for x in (f"inputs {tensors}" if tensors else "", seed) if x)
        return f"{self.label} ({extra})" if extra else self.label


class Verifier:
    """Compares outputs with a case's truth under the op's tolerance policy."""

    def __init__(self, tolerance: dict):
        self.tolerance = tolerance

    def checks(self, got: list, case: Case) -> list:
        return compare_outputs(got, case.expected, self.tolerance)

    def check(self, got: list, case: Case, verdict: str = "mismatch", what: str = "") -> list:
        """The per-output checks; raises Stop(verdict) naming the case where any fails."""
        checks = self.checks(got, case)
        if not all_ok(checks):
            failures = "; ".join(f"output {c.index}: {c.reason}" for c in checks if not c.ok)
            raise Stop(verdict, f"{what or case.describe()}: {failures}")
        return checks

    def ok(self, got: list | None, case: Case) -> bool:
        return got is not None and all_ok(self.checks(got, case))

    def check_seed(self, got: list, case: Case, first: list) -> None:
        """A fresh case: wrong outputs equal to those of other inputs are cached or hard-coded."""
        try:
            self.check(got, case)
        except Stop:
            if identical(got, first):
                raise Stop("cheat", f"{case.describe()}: returned the same outputs as for different inputs: "
                                    "outputs are cached or hard-coded") from None
            raise
