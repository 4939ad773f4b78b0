"""How many processes and threads a runner may have at once.

Bubblewrap has no such option, so the limit comes from one of two places:

- a pids cgroup of its own (`pids.max`), where this process may create one: as root with the
  cgroup file system writable (cgroup v1's `pids` hierarchy, or v2 where the pids controller is
  enabled for children of the root). The runner joins it before bwrap starts, so everything in
  the sandbox counts, and killing the runner kills every process in it.
- otherwise RLIMIT_NPROC, set by the runner inside its user namespace before any candidate code
  runs (farm.evaluate.runner's launcher). Since Linux 5.14 that limit counts the tasks of the
  namespace's user, so it bounds the sandbox alone; it is not enforced for root (the kernel
  exempts uid 0), which is why root needs the cgroup.

`mechanism()` says which one applies here; every verdict records it (`EvalResult.runner_limits`).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import signal
import time
from pathlib import Path

# processes and threads (torch starts a pool of threads per core)
MAX_TASKS = max(512, 4 * (os.cpu_count() or 1))
_NAME = re.compile(r"^farm-(\d+)-\d+$")
_counter = itertools.count()


@functools.lru_cache(maxsize=1)
def _root() -> Path | None:
    """A folder under which this process may make pids cgroups, or None."""
    for base in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if base == Path("/sys/fs/cgroup") and "pids" not in _read(base / "cgroup.subtree_control"):
            continue
        if not (base / "cgroup.procs").exists():
            continue
        folder = base / "farm"
        try:
            folder.mkdir(exist_ok=True)
            if base.name == "cgroup":  # v2: the controller must reach the farm folder's children
                (folder / "cgroup.subtree_control").write_text("+pids")
            probe = folder / f"farm-{os.getpid()}-probe"
            probe.mkdir(exist_ok=True)
            ok = (probe / "pids.max").exists()
            probe.rmdir()
        except OSError:
            continue
        if ok:
            return folder
    return None


def mechanism() -> str:
    if _root() is not None:
        return "cgroup"
    return "rlimit" if os.geteuid() != 0 else "none (root, and no pids cgroup can be made here)"


def new_group(limit: int = MAX_TASKS) -> Path | None:
    """A pids cgroup for one runner, or None where none can be made (RLIMIT_NPROC applies)."""
    root = _root()
    if root is None:
        return None
    sweep(root)
    path = root / f"farm-{os.getpid()}-{next(_counter)}"
    try:
        path.mkdir()
        (path / "pids.max").write_text(str(limit))
    except OSError:
        return None
    return path


def join(path: Path) -> None:
    """In the child between fork and exec (subprocess's preexec_fn): into the group."""
    fd = os.open(path / "cgroup.procs", os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


def kill_all(path: Path | None) -> None:
    """SIGKILL whatever is in the group (a process that left the runner's session or tree),
    then remove the group once it is empty."""
    if path is None:
        return
    for _ in range(50):
        pids = [int(p) for p in _read(path / "cgroup.procs").split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    try:
        path.rmdir()
    except OSError:
        pass


def sweep(root: Path | None = None) -> None:
    """Remove the groups of evaluators that died (killed) without removing theirs."""
    root = root or _root()
    if root is None:
        return
    for entry in root.glob("farm-*"):
        m = _NAME.match(entry.name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue
        except ProcessLookupError:
            kill_all(entry)
        except PermissionError:
            continue


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
