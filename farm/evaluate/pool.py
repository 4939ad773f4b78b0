"""A warm pool of candidate runners: each candidate gets a runner no candidate ran in before,
started ahead of time so that the device does not wait for it.

A runner is a process in a sandbox of its own (farm.evaluate.runner): whatever a candidate
did to it (patched the harness, its clock or its loader, tampered with the input sets it keeps,
filled its compiler cache, left processes or threads running) ends with it, because the next
candidate never sees that process, its folder or its cache. Starting one (an interpreter,
torch, Triton, a device context) takes seconds, so `size` runners are kept started by as many
starter threads, and taking one has its thread start the next. A runner waiting in the pool
has run no candidate code; it may already hold the op's public input sets (`prime`), which
every candidate is shown anyway. While the device is timed, runners that are starting or
waiting are stopped like compile-ahead runners (farm.evaluate.quiet), so a start never shares
a small host with a timing (a host with cores to spare lets it run: quiet.stops_starts).

Inside the sandbox, runners are forked by fork servers (farm.evaluate.forkserver,
farm.evaluate.zygote) where one is idle or can be started ahead: a start is then a fork and a device context
instead of an interpreter and `import torch`, which on a host of two cores cost as much CPU
as judging a candidate. Each runner is lent a server of its own (ready, in use, being closed),
so no two candidates share a server's sandbox at once; a server is cleaned when its runner
closes and replaced when it cannot be. The servers are the process's, shared by the pools of
every op on the device.

The starter threads live as long as the pool: bubblewrap's --die-with-parent ends a runner
when the thread that started it ends (PR_SET_PDEATHSIG follows the thread, not the process);
fork servers have threads of their own that live as long as the process.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Callable

from farm.evaluate import forkserver, quiet
from farm.evaluate.runner import Limits, Runner
from farm.evaluate.sandbox import Boundary
from farm.targets import DeviceSpec

log = logging.getLogger(__name__)

SIZE = 1  # runners kept started beside the one in use


class RunnerPool:
    def __init__(self, spec: DeviceSpec, limits: Limits, boundary: Boundary, size: int = SIZE,
                 configure: Callable[[Runner], None] | None = None,
                 prime: Callable[[Runner], None] | None = None, fork: bool = True):
        self.spec, self.limits, self.boundary = spec, limits, boundary
        self.size = max(0, size)
        self.configure = configure  # what every runner is given before it starts (its poison sizes, ...)
        self.prime = prime  # run on a started runner before it waits (the public input sets)
        self.ready: deque[Runner | BaseException] = deque()
        self.starting = 0
        self.started = 0  # runners this pool started (tests and benchmarks read it)
        self.taken = 0  # runners handed out
        self.closed = False
        self.fork = fork and boundary.on  # without the sandbox a fork would share the host's view
        self._inflight: set[Runner] = set()  # runners a starter thread is starting
        self._threads: list[threading.Thread] = []
        self._cv = threading.Condition()
        self._quiet = quiet.for_device(spec.label, host_wide=not spec.target.interpret)
        self._quiet_starts = quiet.stops_starts()

    def take(self) -> Runner:
        """A started runner that has run nothing; blocks while the next one starts. The first
        (and every one with size 0) is started in the calling thread, forked where an idle
        server waits; from the second on, the starter threads keep `size` ready. On an
        interpreted target the first starts a server where none is idle: the pool's next
        runners need one anyway, and on the host's own cores a server and a fork cost less than a
        new interpreter. On a compiled target it starts afresh at once, since there a server's
        start queued behind the other pools' (docs/evaluator.md, "Isolation")."""
        with self._cv:
            self.taken += 1
            inline = self.size == 0 or (self.taken == 1 and not self.ready)
        if inline:  # an evaluator's first candidate (farm eval has no second) waits, as it always did
            return self._start()
        with self._cv:
            self._spawn()
            while not self.ready:
                self._cv.wait()
            item = self.ready.popleft()
            self._cv.notify_all()  # a starter thread starts the next
        if isinstance(item, BaseException):
            # a start that failed ahead of time is the host's trouble, not the next candidate's
            # (an independent re-timing that took it would refuse a promotion): one more, here
            log.warning("a pool runner for %s failed to start ahead (%s); starting another", self.spec.label, item)
            return self._start()
        self._quiet.remove(item)
        return item

    def _spawn(self) -> None:
        """The starter threads, once (under the lock)."""
        while not self.closed and len(self._threads) < self.size:
            thread = threading.Thread(target=self._starter, name=f"runner-pool-{self.spec.label}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _starter(self) -> None:
        while True:
            with self._cv:
                while not self.closed and len(self.ready) + self.starting >= self.size:
                    self._cv.wait()
                if self.closed:
                    return
                self.starting += 1
            box = Runner(self.spec, self.limits, self.boundary)
            if self._quiet_starts:
                self._quiet.add(box)  # stopped while the device is timed, start included
            with self._cv:
                self._inflight.add(box)
            try:
                box.server = self._server(start=True)
                item: Runner | BaseException = self._start(box)
            except BaseException as exc:  # noqa: BLE001 - handed to the one who takes it
                self._quiet.remove(box)
                if not self.closed:  # a start that close() cut short is no failure
                    log.warning("a pool runner for %s failed to start: %r; its output: %s", self.spec.label, exc,
                                box.log_tail(1500) or "-")
                item = exc
            with self._cv:
                self._inflight.discard(box)
                self.starting -= 1
                if not self.closed:
                    self.ready.append(item)
                    self._cv.notify_all()
                    continue
            if isinstance(item, Runner):
                self._quiet.remove(item)
                item.close()
            return

    def _start(self, box: Runner | None = None) -> Runner:
        if box is None:  # the caller's own start: a server started for it only where that is cheaper
            box = Runner(self.spec, self.limits, self.boundary)
            box.server = self._server(start=self.spec.target.interpret)
        if self.configure is not None:
            self.configure(box)
        try:
            box.start()
            if self.prime is not None:
                self.prime(box)
        except BaseException:
            box.close()
            raise
        with self._cv:
            self.started += 1
        return box

    def _server(self, start: bool) -> forkserver.ForkServer | None:
        """A fork server lent to the runner about to start (with `start`, one more is started
        where none is idle); None: the runner starts afresh."""
        if not self.fork:
            return None
        return forkserver.lend(self.spec, self.limits, self.boundary, start=start,
                               quiet=self._quiet if self._quiet_starts else None)

    def drain(self) -> None:
        """Close the runners waiting here (started under another environment or configuration):
        the next take starts new ones."""
        with self._cv:
            items = list(self.ready)
            self.ready.clear()
            self._cv.notify_all()
        for item in items:
            if isinstance(item, Runner):
                self._quiet.remove(item)
                item.close()

    def close(self) -> None:
        with self._cv:
            self.closed = True
            inflight = list(self._inflight)
            self._cv.notify_all()
        self.drain()
        for box in inflight:  # a start in progress ends now
            box.close()

