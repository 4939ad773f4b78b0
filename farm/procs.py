"""Small facts about processes that several stages need (rank 0: imports nothing of the farm)."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Running, not a zombie: an ended process its parent has not reaped yet holds nothing
    (no memory, no metrics, no scratch folder in use)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: kill(0) said it exists
