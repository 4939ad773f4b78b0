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
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger(__name__)

ERROR_TEXT_LIMIT = 4000  # characters of a child's traceback kept in records

_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch"])
        _CONTEXT = ctx
    return _CONTEXT


@dataclass
class ChildOutcome:
    status: str  # "ok", "raised", "timeout", "crash"
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


def _child_main(conn, target: Callable, args: tuple, env: dict[str, str]) -> None:
    # A group of its own, so a timeout also ends whatever the child spawned (compilers, ...).
    os.setsid()
    os.environ.update(env)

    def report(stage: str) -> None:
        conn.send(("stage", stage))

    try:
        value = target(report, *args)
    except BaseException:  # noqa: BLE001 - everything the child does wrong is reported
        conn.send(("raised", trim(traceback.format_exc())))
    else:
        conn.send(("ok", value))
    finally:
        conn.close()


def run_in_child(
    target: Callable,
    args: tuple = (),
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> ChildOutcome:
    """Run `target(report, *args)` in a fresh child; `report(stage)` marks progress."""
    ctx = _context()
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(child_conn, target, args, dict(env or {})), daemon=True)
    start = time.monotonic()
    proc.start()
    child_conn.close()
    stage = "start"
    try:
        while True:
            left = timeout_s - (time.monotonic() - start)
            if left <= 0:
                _kill(proc)
                return ChildOutcome("timeout", stage, error=f"no result after {timeout_s:g} s in stage {stage}",
                                    elapsed_s=time.monotonic() - start)
            if parent_conn.poll(min(left, 0.5)):
                try:
                    kind, payload = parent_conn.recv()
                except (EOFError, OSError):
                    return _death(proc, stage, start)
                if kind == "stage":
                    stage = payload
                    continue
                proc.join(timeout=10)
                if proc.is_alive():
                    _kill(proc)
                status = "ok" if kind == "ok" else "raised"
                return ChildOutcome(status, stage, value=payload if kind == "ok" else None,
                                    error="" if kind == "ok" else payload, elapsed_s=time.monotonic() - start)
            if not proc.is_alive() and not parent_conn.poll(0):
                return _death(proc, stage, start)
    finally:
        parent_conn.close()


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


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.kill()
    proc.join(timeout=5)
