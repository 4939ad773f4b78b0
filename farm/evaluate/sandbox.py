"""The candidate runner: a child process that loads candidate kernels and runs them on one
pinned device, serving many candidates until one kills it.

Parent side: `Sandbox` starts the child as a fresh interpreter (not a fork: a fork would
carry the parent's memory and /proc/self/environ, and with them the farm's secrets), with an
allow-listed environment, its stdout/stderr in a size-limited log file, and a memory
watchdog. Every command has a time limit; a timeout, a crash or an exceeded limit kills the
child, the evaluation gets its verdict, and the next command starts a new child.

Child side (`python -m farm.evaluate.sandbox FD`): executes candidate source, runs forward on inputs
the parent sends, and returns outputs. It never receives expected outputs. Replies are
serialised with torch.save and read by the parent with weights_only=True: the child is
untrusted and may only send tensors and plain values back.

Threat model: candidates are generated code that may game the metric (cached outputs, side
streams, PyTorch fallbacks, input mutation) or reach for what the worker holds (credentials
files, the farm's config, the network, the parent's /proc). Where a `Boundary` is given
(farm.evaluate.boundary: bubblewrap), the child runs inside it: loopback-only network, a
read-only view of the Python environment and its device, writes to its scratch folder and
the Triton cache only, its own /proc.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import pickle
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from farm.evaluate import boundary as os_boundary
from farm.evaluate.boundary import Boundary
from farm.runtime.isolation import trim
from farm.runtime.tensors import dumps, tensor_bytes
from farm.targets import DeviceSpec

log = logging.getLogger(__name__)

# Variables a candidate child may see; everything else (AWS_*, FARM_*, API keys) is dropped.
_ALLOWED_ENV = re.compile(
    r"^(PATH|LANG|LC_[A-Z]+|TZ|PYTHONPATH|PYTHONHASHSEED|LD_LIBRARY_PATH|CUDA_HOME|CUDA_PATH|"
    r"CUDA_[A-Z_]+|NVIDIA_[A-Z_]+|TRITON_[A-Z_]+|ASCEND_[A-Z_]+|ASCEND_HOME_PATH|TORCH_[A-Z_]+|"
    r"OMP_NUM_THREADS|MKL_NUM_THREADS|CC|CXX)$"
)
_SECRET_NAME = re.compile(r"(KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.I)


@dataclass
class Limits:
    """Per-candidate limits; seconds, megabytes."""

    start_s: float = 120.0  # interpreter + torch import + device init
    compile_s: float = 180.0  # load + first run (Triton JIT compiles here)
    run_s: float = 60.0  # one later forward
    time_s: float = 120.0  # the whole timing loop
    total_s: float = 600.0  # everything for one candidate
    host_memory_mb: int = 16384  # resident memory of the child
    device_memory_fraction: float = 0.9  # of the pinned GPU
    log_mb: int = 64  # stdout + stderr of the child


class SandboxDied(Exception):
    """The child timed out, crashed or broke a limit; it has been killed."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # "timeout" or "crash"


def candidate_env(spec: DeviceSpec, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if _ALLOWED_ENV.match(k) and not _SECRET_NAME.search(k)}
    env.update(spec.child_env())
    # the Triton compile cache survives child restarts, under the real home unless set
    env.setdefault("TRITON_CACHE_DIR", str(Path.home() / ".triton" / "cache"))
    env["HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the farm package
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# caches a runner may write besides its scratch folder: compiled kernels outlive a runner
_CACHE_VARS = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH")


def _tree(pid: int) -> list[int]:
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


def _rss_mb(pid: int) -> float:
    """Resident memory of `pid` and its descendants."""
    total = 0.0
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
                    break
        except (OSError, ValueError):
            continue
    return total


def _signal_tree(pid: int, sig: int) -> None:
    for p in _tree(pid):
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            continue


def _pin_tree(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` and its descendants on `cpus` (a thread's affinity is its own:
    pinning the process id alone leaves the threads it already started where they were)."""
    for p in _tree(pid):
        try:
            tids = [int(t.name) for t in Path(f"/proc/{p}/task").iterdir()]
        except (OSError, ValueError):
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:  # the thread ended meanwhile
                continue


FILE_MIN_BYTES = 16 << 20  # commands carrying this much tensor data go through a file (Sandbox._message)


class Sandbox:
    """Parent-side handle of one candidate child on one device."""

    def __init__(self, spec: DeviceSpec, limits: Limits | None = None, boundary: Boundary | None = None,
                 read_only: tuple = ()):
        self.spec = spec
        self.limits = limits or Limits()
        # None or kind "none": a plain child (said once, and recorded in every verdict)
        self.boundary = boundary or Boundary("none", "not requested")
        self.read_only = tuple(read_only)  # what the child may read besides the Python environment
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.workdir: Path | None = None
        self.starts = 0
        self.output_nbytes: list[int] | None = None  # sizes the runner poisons before each run
        self.extra_env: dict[str, str] = {}  # over the allow-listed environment (compile-ahead's runners)
        self._paused_since: float | None = None  # stopped by pause() since then
        self._paused_s = 0.0  # seconds stopped so far: time limits do not count them
        self._cpus: set[int] | None = None  # where pin() keeps the runner (None: where the OS puts it)

    # ------------------------------------------------------------ lifecycle

    def _preexec(self) -> None:
        limit = self.limits.log_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)

    @property
    def log_path(self) -> Path:
        return self.workdir / "child.log"

    def _fresh_workdir(self) -> None:
        """A new, empty working folder per runner: nothing a dead runner wrote is seen again."""
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        _OPEN.add(self)
        self.workdir = Path(tempfile.mkdtemp(prefix="farm-sandbox-"))

    def start(self) -> None:
        self.resume()  # closes a pause of the runner this one replaces
        self._fresh_workdir()
        parent_sock, child_sock = socket.socketpair()
        log_file = open(self.log_path, "wb")
        try:
            # -c, with the working folder taken off sys.path: a candidate cannot plant modules
            # that a runner would import
            launcher = ("import sys; sys.path.pop(0); from farm.evaluate.sandbox_child import main; "
                        f"main({child_sock.fileno()}, {self.spec.label!r}, {self.limits.device_memory_fraction!r})")
            env = {**candidate_env(self.spec, self.workdir), **self.extra_env}
            argv = self._argv([sys.executable, "-c", launcher], env)
            self.proc = subprocess.Popen(
                argv,
                pass_fds=(child_sock.fileno(),), env=env, cwd=self.workdir,
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                preexec_fn=self._preexec, start_new_session=True,
            )
        finally:
            child_sock.close()
            log_file.close()
        self.conn = Connection(os.dup(parent_sock.fileno()))
        parent_sock.close()
        self.starts += 1
        self.cached_inputs: set[str] = set()
        reply = self._receive(self.limits.start_s, "start")
        if not reply.get("ok"):
            self.kill()
            raise SandboxDied("crash", f"candidate runner failed to start: {reply.get('error')}")
        self.device_info = reply.get("device", {})
        if self._cpus is not None:
            _pin_tree(self.proc.pid, self._cpus)  # a runner started while pinned is pinned too

    def _argv(self, argv: list[str], env: dict[str, str]) -> list[str]:
        if not self.boundary.on:
            return argv
        target = self.spec.target
        caches = [Path(env[v]) for v in _CACHE_VARS if env.get(v)]
        return os_boundary.wrap(argv, scratch=self.workdir, env=env, devices=target.sandbox_nodes(self.spec.index),
                                read_only=[*self.read_only, *target.sandbox_paths()], writable=caches)

    def pause(self) -> None:
        """Stop the runner and everything it started (a compiler) with SIGSTOP, so that it takes
        no CPU while the host times a device (farm.evaluate.quiet). Its time limits do not run
        while it is stopped; a runner started during the pause is not stopped."""
        proc = self.proc  # another thread may be replacing the runner
        if proc is not None and proc.poll() is None and self._paused_since is None:
            self._paused_since = time.monotonic()
            _signal_tree(proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._paused_since is None:
            return
        proc = self.proc
        if proc is not None and proc.poll() is None:
            _signal_tree(proc.pid, signal.SIGCONT)
        self._paused_s += time.monotonic() - self._paused_since
        self._paused_since = None

    def pin(self, cpus: set[int] | None) -> None:
        """Run the runner (all its threads, and a runner started later) on `cpus` only, or with
        None wherever this process may run (farm.evaluate.quiet.timing_cpu says why)."""
        self._cpus = set(cpus) if cpus is not None else None
        proc = self.proc
        if proc is not None and proc.poll() is None:
            _pin_tree(proc.pid, self._cpus if self._cpus is not None else os.sched_getaffinity(0))

    def paused_s(self) -> float:
        since = self._paused_since
        return self._paused_s + (time.monotonic() - since if since is not None else 0.0)

    def ensure_started(self) -> None:
        """Start the runner now unless it runs: a start (a process, torch, a device context)
        takes seconds, which callers pay before they take the device lease, not inside it."""
        if not self.alive:
            self.start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        self.resume()  # SIGKILL ends a stopped process too; this closes the pause's account
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait(timeout=10)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    def close(self) -> None:
        self.resume()  # a stopped runner asked to exit would never answer
        try:
            if self.alive:
                try:
                    self.conn.send_bytes(pickle.dumps({"cmd": "exit"}))
                    self.proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        finally:  # Ctrl-C or SIGTERM during a wait: the runner and its folder still go
            try:
                self.kill()
            finally:
                if self.workdir is not None:
                    shutil.rmtree(self.workdir, ignore_errors=True)
                    self.workdir = None
                _OPEN.discard(self)

    def log_tail(self, n: int = 4000) -> str:
        if self.workdir is None:
            return ""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return trim(data[-n:].decode(errors="replace"), n)

    # ------------------------------------------------------------ commands

    def call(self, cmd: str, timeout_s: float, **args: Any) -> dict:
        self.ensure_started()
        self.conn.send_bytes(self._message({"cmd": cmd, **args}))
        reply = self._receive(timeout_s, cmd)
        if reply.get("restart"):  # the runner found itself tampered with and has exited
            self.kill()
        return reply

    def _message(self, message: dict) -> bytes:
        """The bytes that carry a command to the runner. Tensors of FILE_MIN_BYTES or more go
        through a file in the runner's working folder (written once, read once, then deleted
        by the runner) instead of being pickled into the socket: a 256 MB input set took 1.1 to
        1.3 s to reach a runner through the socket on the H100 host (docs/benchmarks.md). The
        file has a random name and is created exclusively, so a link the candidate planted in
        the folder is never written through."""
        if tensor_bytes(message) < FILE_MIN_BYTES:
            return dumps(message)  # unsigned tensors too (farm.runtime.tensors)
        import torch

        fd, path = tempfile.mkstemp(dir=self.workdir, prefix="message-", suffix=".pt")
        with os.fdopen(fd, "wb") as f:
            torch.save(message, f)
        return dumps({"cmd": "_file", "name": os.path.basename(path)})

    def with_inputs(self, cmd: str, timeout_s: float, key: str, inputs: list, **args: Any) -> dict:
        """Run a command on an input set the child keeps on its device: each set crosses the
        process boundary once per child, not once per candidate."""
        if not self.alive or key not in self.cached_inputs:
            reply = self.call("put_inputs", timeout_s, key=key, inputs=inputs, output_nbytes=self.output_nbytes)
            if not reply.get("ok"):
                return reply
            self.cached_inputs.add(key)
        return self.call(cmd, timeout_s, key=key, **args)

    def _receive(self, timeout_s: float, what: str) -> dict:
        deadline = time.monotonic() + timeout_s - self.paused_s()  # against the clock less the seconds stopped
        while True:
            if self.conn.poll(0.05):
                try:
                    data = self.conn.recv_bytes()
                except (EOFError, OSError):
                    raise self._died(what) from None
                return _decode(data)
            if not self.alive:
                raise self._died(what)
            rss = _rss_mb(self.proc.pid)
            if rss > self.limits.host_memory_mb:
                self.kill()
                raise SandboxDied("crash", f"candidate exceeded the memory limit ({rss:.0f} MB > "
                                           f"{self.limits.host_memory_mb} MB) during {what}")
            if time.monotonic() - self.paused_s() > deadline:
                self.kill()
                raise SandboxDied("timeout", f"no answer to {what} within {timeout_s:.0f} s")

    def _died(self, what: str) -> SandboxDied:
        code = self.proc.wait(timeout=10) if self.proc else None
        self.kill()
        if code is not None and code < 0:
            sig = -code
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            why = f"killed by {name}"
            if sig == signal.SIGXFSZ:
                why += f" (printed more than {self.limits.log_mb} MB)"
        else:
            why = f"exited with code {code}"
        return SandboxDied("crash", f"candidate runner {why} during {what}\n{self.log_tail(1500)}")


# runners with a folder, until closed: what a thread (re)started after its owner closed it
# (Ctrl-C or SIGTERM while candidates were in flight) goes when the process exits
_OPEN: "weakref.WeakSet[Sandbox]" = weakref.WeakSet()


@atexit.register
def _close_left_open() -> None:
    """At exit (after the interpreter joined its threads): no runner and no folder left behind."""
    for box in list(_OPEN):
        try:
            box.kill()
        except BaseException:  # noqa: BLE001 - the next one still goes
            pass
        if box.workdir is not None:
            shutil.rmtree(box.workdir, ignore_errors=True)
            box.workdir = None


def close_all(items) -> None:
    """Close each of `items` (runners, or what holds them), even when Ctrl-C or SIGTERM lands
    while one of them closes: the first error is raised once all are closed, so no runner or
    folder is left behind by the one before it."""
    error: BaseException | None = None
    for item in items:
        try:
            item.close()
        except BaseException as exc:  # noqa: BLE001 - raised again below
            error = error or exc
    if error is not None:
        raise error


def _decode(data: bytes) -> dict:
    """Replies come from untrusted code: tensors and plain values only."""
    import torch

    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever the runner sent, it was not plain data
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return {"ok": False, "kind": "cheat", "error": f"the runner replied with something other than plain "
                                                       f"tensors and values: {first[:300]}"}

