"""docs/tutorial.md's commands, read from the page itself and run in order in a fresh HOME and
store (the `pip install` into a throwaway virtualenv), so the tutorial cannot drift from the
code: each must exit 0, and the words of the output the page shows must be in what it prints."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGE = REPO / "docs" / "tutorial.md"
FILE_HEADER = re.compile(r"# (?P<name>[\w.]+\.py): ")
WORD = re.compile(r"(?<![\w/.-])[A-Za-z_]{4,}(?![\w/.-])")


def steps(page: Path) -> list[tuple[str, str, str]]:
    """("file", name, text) for a ```python block that starts with `# name.py: ...`, and ("run",
    command, output shown) for each `$ command` of a ```console block, in page order."""
    out, fence, block = [], None, []
    for line in page.read_text(encoding="utf-8").splitlines():
        if fence is None and line.startswith("```"):
            fence, block = line[3:].strip(), []
        elif fence is not None and line.startswith("```"):
            if fence == "python" and block and FILE_HEADER.match(block[0]):
                out.append(("file", FILE_HEADER.match(block[0])["name"], "\n".join(block) + "\n"))
            fence = None
        elif fence == "console" and line.startswith("$ "):
            out.append(("run", line[2:], ""))
        elif fence == "console" and out and out[-1][0] == "run":
            out[-1] = ("run", out[-1][1], out[-1][2] + line + "\n")
        elif fence is not None:
            block.append(line)
    return out


def shown_words(output: str) -> set[str]:
    """The words of the output the page shows, leaving out lines it trimmed (`...`)."""
    return {w for line in output.splitlines() if "..." not in line for w in WORD.findall(line)}


def test_the_page_has_the_flow_in_order():
    commands = [text for kind, text, _ in steps(PAGE) if kind == "run"]
    order = ["farm ops check", "farm reference", "farm run", "farm export", "pip install", "python model.py"]
    found = [next(i for i, c in enumerate(commands) if part in c) for part in order]
    assert found == sorted(found), commands
    assert ("file", "model.py") in [(k, n) for k, n, _ in steps(PAGE)]


@pytest.mark.slow
def test_the_tutorial_runs_as_written(tmp_path):
    work, home, bin_dir, venv = (tmp_path / name for name in ("work", "home", "bin", "venv"))
    for folder in (work, home, bin_dir):
        folder.mkdir()
    # `pip install ./kf` goes into a throwaway virtualenv that sees this Python's torch and triton
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    (bin_dir / "farm").write_text('#!/bin/sh\nexec python -m farm "$@"\n')
    (bin_dir / "pip").write_text('#!/bin/sh\nexec python -m pip "$@"\n')
    for shim in ("farm", "pip"):
        (bin_dir / shim).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_", "KFARM_", "PIP_", "TRITON_INTERPRET"))}
    env.update(HOME=str(home), PYTHONPATH=str(REPO), COLUMNS="250", PATH=f"{bin_dir}:{venv / 'bin'}:{env['PATH']}",
               PIP_NO_DEPS="1", PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
    for kind, text, shown in steps(PAGE):
        if kind == "file":
            (work / text).write_text(shown, encoding="utf-8")
            continue
        done = subprocess.run(["bash", "-c", text], cwd=work, env=env, capture_output=True, text=True, timeout=600)
        printed = done.stdout + done.stderr
        assert done.returncode == 0, f"$ {text}\n{printed}"
        missing = shown_words(shown) - set(WORD.findall(printed))
        assert not missing, f"$ {text}: the page shows {sorted(missing)}, the command printed:\n{printed}"
    assert (work / "kf" / "pyproject.toml").is_file() and (home / ".farm" / "store" / "kernels" / "cpu").is_dir()
