"""The type check (pyproject.toml, [tool.mypy]) holds over the package: `python -m mypy` reports
nothing. mypy comes with the test extra; without it the test is skipped, except under CI
(CI=true), where that is a failure, as for the other tools (tests/tools.py)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_mypy_finds_nothing(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        message = "mypy is not installed: pip install -e '.[test]' (the test extra pins it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # the files and rules are pyproject's; a cache of its own, so that no earlier run's state counts
    res = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache")], cwd=REPO,
                         capture_output=True, text=True, timeout=540)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
