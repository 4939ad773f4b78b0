"""The evaluator's side of a fork server (farm.evaluate.zygote says why a fork is as fresh as a
new interpreter): a runner process of its own, in a sandbox of its own, that forks one
candidate runner at a time. A warm pool (farm.evaluate.pool) keeps a few, one per runner it
has out, so no two candidates ever share a server's sandbox at once.

Servers are kept per process, for every evaluator of the same device, boundary and limits
(`lend`): an op's search of a few candidates would otherwise pay the imports of its own
servers and gain nothing. They are started by long-lived threads of their own, since
bubblewrap's --die-with-parent ends a server when the thread that started it ends; at most
IDLE_KEPT wait unused.

Nothing the server says is trusted further than it must be: its replies are capped and have a
deadline, the pid it names is looked up among its own sandbox's processes only, and a server
that fails to answer, to fork or to clean is killed with its sandbox and replaced.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from farm.evaluate import proctree, wire, zygote
from farm.evaluate.runner import Limits, Runner
from farm.evaluate.sandbox import Boundary
from farm.targets import DeviceSpec

log = logging.getLogger(__name__)

IDLE_KEPT = 4  # servers kept waiting, over all devices and limits (each holds torch: ~0.4 GB)
REPLY_BYTES = 4096
ASK_S = 30.0  # a fork, a reap or a clean takes milliseconds; a server this late is broken


class ServerGone(Exception):
    """The fork server did not do what it was asked: it has been killed."""


class ForkServer(Runner):
    """A runner process that forks runners: started like one, then asked to fork, reap, clean."""

    builds = False  # it never compiles; each child it forks gets its own socket to the builder

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.busy = False  # lent to a runner (its child in use, or not yet cleaned)
        self.idle_since = 0.0
        self.forks = 0
        self._ask_lock = threading.Lock()

    def _entry(self, fd: int, build_fd: int | None = None) -> str:
        return (f"from farm.evaluate.zygote import serve; serve({fd}, {self.spec.label!r}, "
                f"{self.limits.device_memory_fraction!r}, {str(self.scratch)!r})")

    def fork(self, env: dict[str, str], sock_fd: int, log_fd: int, build_fd: int | None = None) -> ForkedChild:
        fds = (sock_fd, log_fd) if build_fd is None else (sock_fd, log_fd, build_fd)
        reply = self._ask({"verb": "fork", "env": env}, fds=fds)
        nspid = reply.get("pid")
        if not isinstance(nspid, int) or isinstance(nspid, bool) or nspid <= 1:
            raise self._gone(f"it named no child ({nspid!r})")
        host = self._host_pid(nspid)
        if host is None:
            raise self._gone(f"its child {nspid} is not among its processes")
        self.forks += 1
        return ForkedChild(self, host)

    def reap(self, timeout: float) -> int | None:
        """The last child's exit status (Popen's returncode), once it has ended."""
        status = self._ask({"verb": "reap", "timeout": timeout}, wait_s=timeout + ASK_S).get("status")
        return status if isinstance(status, int) and not isinstance(status, bool) else None

    def clean(self) -> bool:
        """What the last child left removed; False (and the server killed) if that failed."""
        try:
            reply = self._ask({"verb": "clean"}, wait_s=zygote.CLEAN_S + ASK_S)
        except ServerGone:
            return False
        if reply.get("ok") is not True:
            log.warning("a fork server for %s is retired: %s", self.spec.label, str(reply.get("why"))[:300])
            self.kill()
            return False
        return True

    def release(self) -> None:
        """Back to the servers kept, clean, or killed if it could not be cleaned."""
        if self.alive:
            self.clean()
        with _LOCK:
            self.busy = False
            self.idle_since = time.monotonic()
            idle = sorted((s for s in _SERVERS if not s.busy), key=lambda s: s.idle_since)
            extra = idle[:max(0, len(idle) - IDLE_KEPT)]
            for server in extra:
                _SERVERS.remove(server)
        for server in extra:
            server.close()

    def _ask(self, msg: dict, fds: tuple[int, ...] = (), wait_s: float = ASK_S) -> dict:
        import json

        with self._ask_lock:
            sock = self.sock
            if sock is None or not self.alive:
                raise self._gone("it is not running")
            try:
                wire.send_frame(sock, json.dumps(msg).encode(), fds=fds)
                tree = wire.decode(wire.recv_frame(sock, REPLY_BYTES, time.monotonic() + wait_s))
            except (OSError, EOFError, wire.ProtocolError) as exc:
                raise self._gone(f"no answer to {msg['verb']}: {exc}") from None
        if not isinstance(tree, dict):
            raise self._gone(f"its answer to {msg['verb']} is not a mapping")
        return tree

    def _gone(self, why: str) -> ServerGone:
        self.kill()
        return ServerGone(f"the fork server for {self.spec.label} was killed: {why}")

    def _host_pid(self, nspid: int) -> int | None:
        """The host's pid of the server's child `nspid` (a pid inside its PID namespace)."""
        proc = self.proc
        if proc is None:
            return None
        for pid in proctree.tree(proc.pid)[1:]:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    if len(ids) > 1 and ids[-1] == str(nspid):
                        return pid
        return None


class ForkedChild:
    """What a runner holds of a forked child in place of a Popen: its pid on the host, whether
    it still runs (a pidfd, so a reused pid is never taken for it) and its exit status, which
    only its parent, the server, can read."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid = server, pid
        self.parent = proctree.parent(pid)  # the server's process
        self.returncode: int | None = None
        self._fd: int | None = os.pidfd_open(pid)

    def rss_mb(self) -> float:
        """Memory of everything in the sandbox but the server: the child's tree, and what it
        left to the sandbox's init (a daemon is no child of the child's any more)."""
        proc = self.server.proc
        if proc is None or self.parent is None:
            return proctree.rss_mb(self.pid)
        return proctree.rss_mb(proc.pid, skip=(self.parent,))

    def _ended(self, timeout: float) -> bool:
        fd = self._fd
        return fd is None or bool(select.select([fd], [], [], max(0.0, timeout))[0])

    def poll(self) -> int | None:
        if self.returncode is None and self._ended(0):
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            if not self._ended(3600.0 if timeout is None else timeout):
                raise subprocess.TimeoutExpired(f"forked runner {self.pid}", timeout or 0)
            self._finish()
        return self.returncode

    def _finish(self) -> None:
        try:
            status = self.server.reap(2.0)
        except ServerGone:
            status = None
        self.returncode = -9 if status is None else status
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_LOCK = threading.Lock()
_SERVERS: list[ForkServer] = []  # this process's, lent or idle


def starters(cpus: int | None) -> int:
    """Fork servers started at once: each start is a sandbox and `import torch` (a few
    CPU-seconds), so two on a small machine; a large host's pools (four ops at once, each
    wanting a server per runner) waited for two at a time at the start of every batch."""
    return min(8, max(2, (cpus or 2) // 8))


_STARTER = ThreadPoolExecutor(max_workers=starters(os.cpu_count()), thread_name_prefix="fork-server-start")  # threads that stay


def _same(server: ForkServer, spec: DeviceSpec, limits: Limits, boundary: Boundary, read_only: tuple) -> bool:
    return (server.spec.label == spec.label and server.boundary == boundary and server.limits == limits
            and server.read_only == read_only)


def lend(spec: DeviceSpec, limits: Limits, boundary: Boundary, start: bool = True,
         quiet: Any = None, read_only: tuple = ()) -> ForkServer | None:
    """An idle fork server for runners of `spec` under `limits`, lent until its runner releases
    it; with `start`, a new one where none is idle (seconds: the imports its children will not
    pay), else None. `quiet` (farm.evaluate.quiet) stops a start while the device is timed.
    `read_only`: what its sandbox shows besides the Python environment; candidates' servers
    show nothing more, a trusted runner's its task's folder, so the two never share one."""
    read_only = tuple(read_only)
    with _LOCK:
        _SERVERS[:] = [s for s in _SERVERS if s.busy or s.alive]
        for server in _SERVERS:
            if not server.busy and server.alive and _same(server, spec, limits, boundary, read_only):
                server.busy = True
                return server
        if not start:
            return None
        server = ForkServer(spec, limits, boundary, read_only=read_only)
        server.busy = True
        _SERVERS.append(server)
    if quiet is not None:
        quiet.add(server)
    try:
        _STARTER.submit(server.start).result()
        return server
    except Exception as exc:  # noqa: BLE001 - its runner starts afresh instead
        log.warning("a fork server for %s failed to start (%s); runners start afresh", spec.label, exc)
        with _LOCK:
            _SERVERS.remove(server)
        server.close()
        return None
    finally:
        if quiet is not None:
            quiet.remove(server)


def close_idle() -> None:
    """Close the servers waiting unused (tests; a worker that changes its sandbox settings)."""
    with _LOCK:
        idle = [s for s in _SERVERS if not s.busy]
        for server in idle:
            _SERVERS.remove(server)
    for server in idle:
        server.close()
