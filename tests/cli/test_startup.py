"""What `farm --help` (and every command that needs no tensor) costs to start: importing torch
is about 1.6 CPU-seconds, more than the rest of the CLI together, so no module the CLI loads
to build its commands imports torch, Triton or numpy at its top; the commands that use them
import them when they run."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HELP_ALONE = """
import contextlib, io, sys
sys.argv = ["farm", "--help"]
from farm.cli.main import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main()
    except SystemExit:
        pass
heavy = sorted(m for m in ("torch", "triton", "numpy") if m in sys.modules)
print("commands" if "run" in out.getvalue() else "no help", *heavy)
"""


def test_farm_help_builds_every_command_without_importing_torch():
    done = subprocess.run([sys.executable, "-c", HELP_ALONE], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, check=True)
    assert done.stdout.split() == ["commands"], (done.stdout, done.stderr[-2000:])
