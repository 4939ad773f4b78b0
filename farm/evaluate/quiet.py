"""A quiet host while a device is timed (docs/evaluator.md, "A quiet host").

A per-call figure holds the host work of a forward that synchronises with the host, so it
should not depend on how many candidates the compile-ahead runners (farm.evaluate.ahead) are
compiling on the host's cores. While any process of the host holds a device for timing (the
exclusive phase of farm.evaluate.lease), the runners registered here for that device are
stopped with SIGSTOP, compilers included, and continued afterwards; their time limits do not
count the stop. Runners that are starting are stopped too, on a small host only. A timing in
this process stops them at once; one in another process of the host is seen within POLL_S
through the timing flag file the lease holds. Not stopped: the
search's own threads, a generator's child, anything outside the farm.

One core for the timers (`timing_cpu`): while the interleaved rounds of a ratio are timed, the
two runners taking turns run on one core, because a ratio of figures from two freely placed
processes carries their placement (bench/cross_process.py; the measurements are in
bench/results/truth_h100/NOTES-2026-11-24.md).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Protocol

from farm.evaluate import lease as device_lease

log = logging.getLogger(__name__)

POLL_S = 0.01  # how soon a timing in another process of the host stops this process's runners
TIMING_CPU_ENV = "FARM_TIMING_CPU"  # the core timing runners share: a number, or "off" (placement left to the OS)
# A candidate runner's start (a fork, a device context, the public input sets) is stopped beside a
# timing only on a host with fewer cores than this: on the 64-core H100 host, starts beside the
# timings changed no candidate's figure (medians within 1%), and stopping them left the pipelined
# ops' candidates waiting for runners (bench/results/issue33/NOTES-2026-11-27.md); on a small host
# a start takes the cores a timed forward's host work needs. Compiles are stopped everywhere.
STARTS_BESIDE_TIMING_CPUS = 16


class Pausable(Protocol):
    def pause(self) -> None: ...

    def resume(self) -> None: ...


class HostQuiet:
    """This process's pausable work for one device: stopped while the device is timed."""

    def __init__(self, label: str, host_wide: bool = True):
        self.label = label
        self.host_wide = host_wide
        self.members: list[Pausable] = []
        self.local = False  # a timing of this process holds the device
        self.remote = False  # a timing of any process of the host holds it (its flag file)
        self.paused = False
        self.pauses = 0  # how many times the members were stopped
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        device_lease.for_device(label, host_wide).listen(self._local)

    def add(self, member: Pausable) -> None:
        with self._lock:
            self.members.append(member)
            if self.host_wide and self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name=f"quiet-{self.label}", daemon=True)
                self._watcher.start()

    def remove(self, member: Pausable) -> None:
        with self._lock:
            if member in self.members:
                self.members.remove(member)
                if self.paused:
                    member.resume()

    def _local(self, timing: bool) -> None:
        with self._lock:
            self.local = timing
            self._apply()

    def _apply(self) -> None:
        """Members stopped exactly while a timing holds the device (under self._lock)."""
        want = (self.local or self.remote) and bool(self.members)
        if want == self.paused:
            return
        for member in self.members:
            try:
                member.pause() if want else member.resume()
            except Exception as exc:  # noqa: BLE001 - one member's failure must not keep the rest stopped
                log.warning("cannot %s %r: %s", "pause" if want else "resume", member, exc)
        self.paused = want
        self.pauses += want

    def _watch(self) -> None:
        fd = os.open(device_lease.timing_flag_path(self.label), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            while True:
                busy = device_lease.timing_elsewhere(fd)
                with self._lock:
                    if not self.members:
                        self.remote, self._watcher = False, None
                        return
                    if busy != self.remote:
                        self.remote = busy
                        self._apply()
                time.sleep(POLL_S)
        finally:
            os.close(fd)


_quiets: dict[str, HostQuiet] = {}
_lock = threading.Lock()


def stops_starts() -> bool:
    """Whether runner starts are stopped while their device is timed (STARTS_BESIDE_TIMING_CPUS)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)  # not Linux
    return cores < STARTS_BESIDE_TIMING_CPUS


def for_device(label: str, host_wide: bool = True) -> HostQuiet:
    """This process's HostQuiet of the device `label` (one per label, as leases are)."""
    with _lock:
        if label not in _quiets:
            _quiets[label] = HostQuiet(label, host_wide)
        return _quiets[label]


_warned: set[str] = set()  # FARM_TIMING_CPU values already said to be unusable


def timing_cpu(index: int) -> int | None:
    """The core on which device `index`'s timing runners run while timed: FARM_TIMING_CPU, else
    one of the cores this process may use, counted from the last (the first cores are where
    interrupts and the host's own services usually run), a different one per device. None:
    off, or a single core (nothing to choose)."""
    if not hasattr(os, "sched_getaffinity"):  # not Linux: placement stays the OS's
        return None
    cores = sorted(os.sched_getaffinity(0))
    raw = os.environ.get(TIMING_CPU_ENV, "").strip().lower()
    if raw in ("off", "none", "no"):
        return None
    if raw:
        if not raw.isdigit() or int(raw) not in cores:
            if raw not in _warned:  # once, not at every timing
                _warned.add(raw)
                log.warning("%s=%r is not one of this process's cores %s: timing runners are not pinned",
                            TIMING_CPU_ENV, raw, cores)
            return None
        return int(raw)
    if len(cores) < 2:
        return None
    return cores[-1 - index % len(cores)]
