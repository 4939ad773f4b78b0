"""The chip's frontend check (Target.frontend_check): the evaluator calls it before any device
time with the candidate's source. A real chip compiles every launch with its own Triton here;
this one checks that the source parses and names its @triton.jit kernels."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

CHECK_NAME = "interp frontend check"


def configured_python(setting: str | None = None) -> Path | None:
    """The Python its compiler runs under (None: not configured, the check is skipped)."""
    return Path(setting or sys.executable)


def say_not_configured_once() -> None:
    pass


def not_configured_notice() -> str:
    return "the interp frontend is not configured"


@dataclass
class Failure:
    kernel: str
    message: str


@dataclass
class Report:
    kernels: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def first_failure(self) -> Failure:
        return self.failures[0]

    def summary(self) -> str:
        return f"{CHECK_NAME}: {self.failures[0].kernel}: {self.failures[0].message}"

    def as_dict(self) -> dict:
        return {"check": CHECK_NAME, "kernels": self.kernels, "ok": self.ok}


def check_source(python: Path, source: str, cls_name: str, init_inputs=None, inputs=None, wrap=None) -> Report:
    report = Report()
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        report.failures.append(Failure("<module>", str(exc)))
        return report
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            report.kernels.append(node.name)
    return report
