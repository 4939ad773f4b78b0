"""The device lease: who may use a device now, so that timing is exclusive.

Since compile-ahead (farm.evaluate.ahead) and several evaluators per device (several ops of a
batch, several candidates in flight), more than one thing may want the device at once. The
rule is the one a timer needs: a timing (the per-call loop, the interleaved comparison, the
baselines, the re-timing before promotion) holds the device alone; verification runs (first
run, second run, fresh inputs, ghost replay, Reference on fresh inputs) may share it with each
other, never with a timing. So a reader-writer lock per device, with writers first: a timing
waits for the runs in progress to finish, and no new run starts while a timing waits, so a
stream of verifications can never starve the timer. Timings are served in the order they
asked (tickets): several ops' searches sharing a device (farm.search.batch) take turns.

One lease per device label per process, and across the processes of a host a lock file per
device (`flock`: shared for verification, exclusive for timing), taken when the process's
first holder arrives and let go when its last leaves: the in-process batch, several Celery
pool processes of `farm worker` on one device (queue.ops_per_device) and a `farm eval` beside
them all keep timings alone. Ticket order holds within a process; between processes the
kernel's lock decides. The lease also keeps
the seconds the device spent held in each phase, from which the search reports the share of
its time in timing, verification and idle (farm.search.controller, metric
farm_device_time_share).
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

TIMING = "timing"
VERIFICATION = "verification"
PHASES = (TIMING, VERIFICATION)


class DeviceLease:
    def __init__(self, label: str, host_wide: bool = True):
        self.label = label
        self.host_wide = host_wide  # also lock out the host's other processes (not for the interpreter)
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._next_ticket = 0  # timings are served in ticket order
        self._serving = 0
        self._since: float | None = None  # when the current busy phase began
        self._phase_s = {p: 0.0 for p in PHASES}
        self.timings_now = 0  # timings holding the device (never above 1: tests check it)
        self._mine = threading.local()  # what this thread holds: a verification inside one is already covered
        self._fd: int | None = None  # the host-wide lock file of this device (opened on first use)
        self._flag_fd: int | None = None  # held exclusively while this process times (farm.evaluate.quiet)
        self._listeners: list[Callable[[bool], None]] = []  # told when this process starts and ends a timing

    @contextmanager
    def hold(self, phase: str) -> Iterator[None]:
        """Hold the device for `phase`: TIMING alone, VERIFICATION with other verifications."""
        if phase not in PHASES:
            raise ValueError(f"unknown device phase {phase!r}")
        held = getattr(self._mine, "phase", None)
        if held == TIMING or (held == VERIFICATION and phase == VERIFICATION):
            yield  # nested in a hold that covers it (the first fresh-input cases, drawn inside a verification)
            return
        if held is not None:
            raise RuntimeError("a timing cannot start inside a verification's hold of the device")
        self._acquire(phase)
        self._mine.phase = phase
        try:
            if phase == TIMING:
                self._tell(True)
            yield
        finally:
            self._mine.phase = None
            self._release(phase)
            if phase == TIMING:
                self._tell(False)

    @property
    def timings_waiting(self) -> int:
        """Timings that asked for the device and have not had it yet (served in the order they asked)."""
        with self._cond:
            return self._next_ticket - self._serving

    def listen(self, listener: Callable[[bool], None]) -> None:
        """`listener(True)` when a timing of this process takes the device, `(False)` when it
        lets go (farm.evaluate.quiet pauses the host's other work meanwhile)."""
        with self._cond:
            self._listeners.append(listener)

    def _tell(self, timing: bool) -> None:
        with self._cond:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(timing)

    def _acquire(self, phase: str) -> None:
        with self._cond:
            if phase == TIMING:
                ticket = self._next_ticket
                self._next_ticket += 1
                while self._writer or self._readers or self._serving != ticket:
                    self._cond.wait()
                self._serving += 1
                self._host_lock(fcntl.LOCK_EX)  # no other thread of this process holds the device now
                self._timing_flag(fcntl.LOCK_EX)
                self._writer = True
                self.timings_now += 1
            else:
                while self._writer or self._next_ticket != self._serving:  # a timing holds or waits
                    self._cond.wait()
                if not self._readers:
                    self._host_lock(fcntl.LOCK_SH)
                self._readers += 1
            if self._since is None:
                self._since = time.monotonic()

    def _release(self, phase: str) -> None:
        with self._cond:
            if phase == TIMING:
                self._timing_flag(fcntl.LOCK_UN)
                self._writer = False
                self.timings_now -= 1
            else:
                self._readers -= 1
            if not self._writer and not self._readers:
                self._host_lock(fcntl.LOCK_UN)
                # the lock never lets both phases hold the device at once: the busy span is one phase's
                if self._since is not None:  # set by the first hold
                    self._phase_s[phase] += time.monotonic() - self._since
                self._since = None
            self._cond.notify_all()

    def _host_lock(self, how: int) -> None:
        """The device's lock file, for the other processes of this host (under self._cond)."""
        if not self.host_wide:
            return
        if self._fd is None:
            if how == fcntl.LOCK_UN:
                return
            self._fd = os.open(lock_path(self.label), os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self._fd, how)

    def _timing_flag(self, how: int) -> None:
        """The file the host's other processes watch to know that this device is being timed
        (farm.evaluate.quiet): apart from the device's lock file, so that watching it never
        delays a verification or a timing."""
        if not self.host_wide:
            return
        if self._flag_fd is None:
            self._flag_fd = os.open(timing_flag_path(self.label), os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self._flag_fd, how)

    def seconds(self) -> dict[str, float]:
        """Seconds held so far per phase (an ongoing hold counted up to now)."""
        with self._cond:
            out = dict(self._phase_s)
            if self._since is not None:
                out[TIMING if self._writer else VERIFICATION] += time.monotonic() - self._since
            return out


_leases: dict[str, DeviceLease] = {}
_lock = threading.Lock()
LOCK_DIR_ENV = "FARM_LEASE_DIR"  # where the lock files are (tests: their own folder); default: the host's temp folder


def lock_path(label: str) -> Path:
    folder = Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "farm-device-leases")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / (re.sub(r"[^A-Za-z0-9_.-]", "_", label) + ".lock")


def timing_flag_path(label: str) -> Path:
    lock = lock_path(label)
    return lock.with_name(lock.stem + ".timing")


def timing_elsewhere(fd: int) -> bool:
    """Whether a process of this host (this one included) is timing the device whose timing
    flag `fd` is open on: its exclusive lock refuses a shared one."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def for_device(label: str, host_wide: bool = True) -> DeviceLease:
    """This process's lease of the device `label` (cuda:0, ascend:1, ...). `host_wide`: also
    against the host's other processes; off for interpreted targets, whose timings rank only
    roughly and whose worker slots all share one label (cpu)."""
    with _lock:
        if label not in _leases:
            _leases[label] = DeviceLease(label, host_wide)
        return _leases[label]


def shares(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float]:
    """The share of `wall_s` in each phase between two `seconds()` readings, and idle."""
    if wall_s <= 0:
        return {TIMING: 0.0, VERIFICATION: 0.0, "idle": 1.0}
    out = {p: min(1.0, max(0.0, (after[p] - before.get(p, 0.0)) / wall_s)) for p in PHASES}
    out["idle"] = max(0.0, 1.0 - sum(out.values()))
    return out
