"""Commands that run no kernel start without torch and triton: `farm --version`, `--help`,
`status`, `workers`, `cancel`, `scale` and `config` answer in a fraction of a second (torch
alone costs about 2 s of start-up); the commands that run kernels import it when they run."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

# The command runs as `farm ...` does; at exit the child says which heavy packages it loaded.
HARNESS = """
import atexit, sys
atexit.register(lambda: sys.stderr.write("LOADED:" + ",".join(
    m for m in ("torch", "triton", "matplotlib") if m in sys.modules) + "\\n"))
from farm.cli.main import main
sys.argv = ["farm", *sys.argv[1:]]
main()
"""


def loaded(tmp_path, *args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path), "FARM_STORE": f"file://{tmp_path}/store",
           "FARM_QUEUE_BROKER_URL": "redis://127.0.0.1:1/0"}  # nothing listens: the commands fail fast
    done = subprocess.run([sys.executable, "-c", HARNESS, *args], env=env, capture_output=True, text=True, timeout=60)
    line = [s for s in done.stderr.splitlines() if s.startswith("LOADED:")][-1]
    return set(filter(None, line[len("LOADED:"):].split(","))), done


@pytest.mark.parametrize("args", [("--version",), ("--help",), ("status",), ("status", "some-run", "--json"), ("workers",),
                                  ("cancel", "some-run"), ("scale", "search-cpu", "2", "--dry-run"),
                                  ("scale", "search-cpu", "2", "--via", "local", "--dry-run"), ("config", "show")])
def test_light_commands_do_not_import_torch(tmp_path, args):
    heavy, done = loaded(tmp_path, *args)
    assert not heavy, f"farm {' '.join(args)} imported {heavy}: {done.stderr[-800:]}"
    assert "Traceback" not in done.stderr

