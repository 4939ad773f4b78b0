"""The chosen lint rules (pyproject.toml, [tool.ruff.lint]) hold over the whole repository."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    res = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
