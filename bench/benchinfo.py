"""What a benchmark's output records about the code it ran: the commit. On a GPU host the tree
arrives as a copy whose .git may be older than the tree, so the commit is given by whoever sends
it there (FARM_BENCH_COMMIT), and read from git only where none is given."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def commit() -> str:
    given = os.environ.get("FARM_BENCH_COMMIT")
    if given:
        return given
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return "?"
    return out.stdout.strip() or "?"
