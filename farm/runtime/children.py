"""Run one unit of untrusted or fragile work (a task file, a candidate) in a child process.

The child may raise, hang, segfault or exhaust memory: the caller gets a `ChildOutcome`
saying which, with the stage the child had reached, and goes on. Children come from a
forkserver that has already imported torch, so a child starts in milliseconds instead of
the seconds a fresh interpreter needs; the forkserver never touches a device, so a child can
still pin its own (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES) before first use.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger(__name__)

ERROR_TEXT_LIMIT = 4000  # characters of a child's traceback kept in records

_CONTEXT = None
# Ctrl-C or SIGTERM reach the main thread only, while the children run under worker threads
# waiting on them: `stop_children` ends every child at once and tells each waiter it was
# interrupted (not failed), so a batch stops in a second instead of finishing its work in flight.
_STOPPING = threading.Event()
_LIVE: set = set()
_LIVE_LOCK = threading.Lock()


SOCKET_PATH_ROOM = 60  # what multiprocessing adds to its temp dir for the forkserver's socket path


def _short_temp_dir() -> None:
    """The forkserver listens on a Unix socket under multiprocessing's temp dir, and a socket's
    path has at most 107 bytes: under a deep TMPDIR (a test's, a scheduler's job folder) every
    start failed with "AF_UNIX path too long". There, its temp dir is made under /tmp instead."""
    import tempfile
    from multiprocessing import process, util

    # the process's private settings, where multiprocessing keeps its temp dir (not in the stubs)
    config: dict = process.current_process()._config  # type: ignore[attr-defined]
    if len(tempfile.gettempdir()) + SOCKET_PATH_ROOM <= 107 or config.get("tempdir"):
        return
    short = tempfile.mkdtemp(prefix="farm-mp-", dir="/tmp")
    config["tempdir"] = short
    util.Finalize(None, shutil.rmtree, args=(short, True), exitpriority=-100)


def preload() -> list[str]:
    """What the forkserver imports for its children. torch; and where Triton's interpreter is
    already chosen in this process's environment (a cpu worker, CI), torch._dynamo: torch imports
    it on a task's first op on the meta device (the memory guard, farm.corpus.shapes), 1.7
    CPU-seconds in every child otherwise. It brings Triton along, which fixes its language at
    import: before TRITON_INTERPRET is set, a child's interpreted kernels would fail."""
    return ["torch", "torch._dynamo"] if os.environ.get("TRITON_INTERPRET") == "1" else ["torch"]


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _short_temp_dir()
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(preload())
        _CONTEXT = ctx
    return _CONTEXT


@dataclass
class ChildOutcome:
    status: str  # "ok", "raised", "timeout", "crash", "interrupted" (stop_children)
    stage: str  # last stage the child reported
    value: Any = None  # the target's return value when status == "ok"
    error: str = ""  # trimmed traceback or a description of the death
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def trim(text: str, limit: int = ERROR_TEXT_LIMIT) -> str:
    """Keep the head and the tail of a long error: the cause is usually at the end."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters cut] ...\n{text[-half:]}"


def stop_children() -> None:
    """End every child of run_in_child now (their waiters return "interrupted"), and start no
    new one until `allow_children`."""
    _STOPPING.set()
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _kill(proc, wait=False)
    _end_forkserver()


def _end_forkserver() -> None:
    """A thread may be waiting in Process.start for the forkserver to import torch (seconds):
    ended, it answers at once. Its children are sessions of their own, ended above; a later
    run_in_child starts a new forkserver (multiprocessing does when its server is gone)."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def allow_children() -> None:
    """After stop_children: the forkserver it ended is forgotten, so the next child starts a new one."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None):
        try:
            server._stop()  # closes its pipe and reaps it; a live one ends as it would at exit
        except OSError:
            server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
    _STOPPING.clear()


def stopping() -> bool:
    return _STOPPING.is_set()


def _die_with_parent() -> None:
    """Linux: the child is killed when the forkserver goes, which goes with the farm process,
    so a farm killed outright leaves no child running on."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child_main(conn, target: Callable, args: tuple, env: dict[str, str]) -> None:
    # A group of its own, so a timeout also ends whatever the child spawned (compilers, ...),
    # and a Ctrl-C at the terminal reaches the farm process alone, which ends its children.
    os.setsid()
    _die_with_parent()
    os.environ.update(env)

    def report(stage: str) -> None:
        conn.send(("stage", stage))

    try:
        try:
            value = target(report, *args)
        except BaseException:  # noqa: BLE001 - everything the child does wrong is reported
            conn.send(("raised", trim(traceback.format_exc())))
        else:
            conn.send(("ok", value))
        finally:
            conn.close()
    except OSError:  # the parent is gone (interrupted, killed): nobody to tell, nothing to print
        os._exit(1)


def run_in_child(
    target: Callable,
    args: tuple = (),
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    stage_timeout_s: float | None = None,
) -> ChildOutcome:
    """Run `target(report, *args)` in a fresh child; `report(stage)` marks progress. With
    `stage_timeout_s`, a stage that lasts longer is a timeout too (one file of many that hangs)."""
    ctx = _context()
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(child_conn, target, args, dict(env or {})), daemon=True)
    start = time.monotonic()
    stage = "start"
    try:
        if not _STOPPING.is_set():
            proc.start()  # the first one waits for the forkserver to import torch: seconds
    except Exception:
        if not _STOPPING.is_set():
            raise  # else stop_children ended the forkserver under it
    finally:
        child_conn.close()
    if _STOPPING.is_set() and not proc.pid:
        parent_conn.close()
        return _interrupted(stage, start)
    with _LIVE_LOCK:
        _LIVE.add(proc)
    stage_start = time.monotonic()
    try:
        while True:
            if _STOPPING.is_set():
                _kill(proc)
                return _interrupted(stage, start)
            left = timeout_s - (time.monotonic() - start)
            if stage_timeout_s is not None:
                left = min(left, stage_timeout_s - (time.monotonic() - stage_start))
            if left <= 0:
                _kill(proc)
                took = time.monotonic() - (start if stage_timeout_s is None else stage_start)
                limit = timeout_s if stage_timeout_s is None else stage_timeout_s
                return ChildOutcome("timeout", stage, error=f"no result after {took:.1f} s in stage {stage} "
                                                            f"(limit {limit:g} s)",
                                    elapsed_s=time.monotonic() - start)
            if parent_conn.poll(min(left, 0.5)):
                try:
                    kind, payload = parent_conn.recv()
                except (EOFError, OSError):
                    return _interrupted(stage, start) if _STOPPING.is_set() else _death(proc, stage, start)
                if kind == "stage":
                    stage, stage_start = payload, time.monotonic()
                    continue
                proc.join(timeout=10)
                if proc.is_alive():
                    _kill(proc)
                status = "ok" if kind == "ok" else "raised"
                return ChildOutcome(status, stage, value=payload if kind == "ok" else None,
                                    error="" if kind == "ok" else payload, elapsed_s=time.monotonic() - start)
            if not proc.is_alive() and not parent_conn.poll(0):
                return _interrupted(stage, start) if _STOPPING.is_set() else _death(proc, stage, start)
    except BaseException:  # Ctrl-C in the thread that waits: the child goes with it
        _kill(proc, wait=False)
        raise
    finally:
        parent_conn.close()
        with _LIVE_LOCK:
            _LIVE.discard(proc)


def _interrupted(stage: str, start: float) -> ChildOutcome:
    return ChildOutcome("interrupted", stage, error=f"interrupted (Ctrl-C or SIGTERM) in stage {stage}",
                        elapsed_s=time.monotonic() - start)


def _death(proc, stage: str, start: float) -> ChildOutcome:
    proc.join(timeout=5)
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            why = f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            why = f"killed by signal {-code}"
    else:
        why = f"exited with code {code} without a result"
    return ChildOutcome("crash", stage, error=f"child process {why} in stage {stage}",
                        elapsed_s=time.monotonic() - start)


def _kill(proc, wait: bool = True) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, TypeError):  # TypeError: not started yet
        pass
    try:
        proc.kill()
    except (AttributeError, ValueError):  # not started, or already closed
        return
    if wait:
        proc.join(timeout=5)
