"""A process and everything it started, found through /proc from the outside (a runner inside
the sandbox is a grandchild of the bwrap process the evaluator started, in a session of its
own; compilers are children of it): to signal, pin or measure them all."""

from __future__ import annotations

import os
from pathlib import Path


def tree(pid: int) -> list[int]:
    """`pid` and its descendants, parents first (inside the sandbox the interpreter is a
    grandchild of the bwrap process the parent started, in a session of its own; compilers
    are children of it)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        if p in out:
            continue
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def rss_mb(pid: int, skip: tuple[int, ...] = ()) -> float:
    """Resident memory of `pid` and its descendants (less the processes in `skip`, not their
    descendants)."""
    total = 0.0
    for p in tree(pid):
        if p in skip:
            continue
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
                    break
        except (OSError, ValueError):
            continue
    return total


def parent(pid: int) -> int | None:
    """The parent of `pid` as this process's PID namespace numbers it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def signal_tree(pid: int, sig: int) -> None:
    for p in tree(pid):
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            continue


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` and its descendants on `cpus` (a thread's affinity is its own:
    pinning the process id alone leaves the threads it already started where they were)."""
    for p in tree(pid):
        try:
            tids = [int(t.name) for t in Path(f"/proc/{p}/task").iterdir()]
        except (OSError, ValueError):
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:  # the thread ended meanwhile
                continue
