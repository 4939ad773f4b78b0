"""The candidate runner: a child process that loads candidate code and runs it on one pinned
device, for one candidate (farm.evaluate.pool starts them ahead of time).

Parent side: `Runner` starts the child as a fresh interpreter (never a fork of the evaluator,
whose memory and /proc/self/environ hold the farm's secrets; or a fork of a fork server that is
such an interpreter, farm.evaluate.forkserver), with an allow-listed environment, inside the operating-system boundary where there is one
(farm.evaluate.sandbox: bubblewrap), with a pids limit (farm.evaluate.pids) and a memory
watchdog. Every command has a time limit; a timeout, a crash or an exceeded limit kills the
child and the evaluation gets its verdict.

Nothing the child sends is trusted as a path, a size or a time: its stdout and stderr go to an
unlinked file the parent holds open (read through that descriptor, the tail only); its replies
are frames of at most the size the command can need, complete before the command's deadline,
decoded as plain data (farm.evaluate.wire) and parsed into the command's reply type
(farm.evaluate.protocol). Large commands travel as anonymous memory files, so the parent never
writes or reads a path in the child's folder, which inside the sandbox is a size-limited tmpfs
that no one outside sees and that goes with the child.

Child side: farm.evaluate.runner_child. It never receives expected outputs.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

from farm.evaluate import builds, pids, protocol, sandbox, wire
from farm.evaluate.proctree import pin_tree, rss_mb, signal_tree
from farm.evaluate.protocol import Command, Failure, Reply
from farm.evaluate.sandbox import Boundary
from farm.runtime import scratch
from farm.runtime.children import trim
from farm.runtime.tensors import dumps, tensor_bytes
from farm.targets import DeviceSpec

log = logging.getLogger(__name__)

# Variables a candidate child may see, with those its target's driver reads (Target.driver_env:
# CUDA_*, NVIDIA_*; ASCEND_*); everything else (AWS_*, FARM_*, API keys) is dropped.
_ALLOWED_ENV = re.compile(
    r"^(PATH|LANG|LC_[A-Z]+|TZ|PYTHONPATH|PYTHONHASHSEED|LD_LIBRARY_PATH|TRITON_[A-Z_]+|TORCH_[A-Z_]+|"
    r"OMP_NUM_THREADS|MKL_NUM_THREADS|CC|CXX)$"
)
_SECRET_NAME = re.compile(r"(KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)


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
    # tmpfs inside the sandbox (memory, beside host_memory_mb): the runner's folder (its HOME and
    # compiler caches) and its private /tmp and /dev/shm, each
    scratch_mb: int = 1024
    tmp_mb: int = 512
    tasks: int = pids.MAX_TASKS  # processes and threads at once (farm.evaluate.pids)


class RunnerDied(Exception):
    """The child timed out, crashed or broke a limit; it has been killed."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # "timeout" or "crash"


def candidate_env(spec: DeviceSpec, home: Path) -> dict[str, str]:
    driver = spec.target.driver_env
    env = {k: v for k, v in os.environ.items() if (_ALLOWED_ENV.match(k) or _named(k, driver))
           and not _SECRET_NAME.search(k)}
    env.update(spec.child_env())
    env["HOME"] = str(home)
    # compiler caches of the runner's own, in its folder: no runner loads what another compiled
    # (a candidate could plant entries a later candidate or the trusted runner would load)
    for var, sub in _CACHE_VARS.items():
        env[var] = str(home / sub)
    env["PYTHONUNBUFFERED"] = "1"
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the farm package
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _named(name: str, names: tuple[str, ...]) -> bool:
    """`name` is one of `names`, or starts with one that ends in '_' (a prefix)."""
    return any(name == n or (n.endswith("_") and name.startswith(n)) for n in names)


_CACHE_VARS = {"TRITON_CACHE_DIR": ".triton/cache", "TORCHINDUCTOR_CACHE_DIR": ".inductor",
               "CUDA_CACHE_PATH": ".nv/ComputeCache"}


FILE_MIN_BYTES = 16 << 20  # commands carrying this much tensor data travel as a memory file (Runner._send)
REPLY_BASE_BYTES = 4 << 20  # a reply without outputs: stats, samples, texts


class Runner:
    """Parent-side handle of one runner on one device (restarted on demand after it died)."""

    builds = True  # the runner gets Triton's C helpers from the trusted builder (farm.evaluate.builds)

    def __init__(self, spec: DeviceSpec, limits: Limits | None = None, boundary: Boundary | None = None,
                 read_only: tuple = ()):
        self.spec = spec
        self.limits = limits or Limits()
        # None or kind "none": a plain child (said once, and recorded in every verdict)
        self.boundary = boundary or Boundary("none", "not requested")
        self.read_only = tuple(read_only)  # what the child may read besides the Python environment
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.workdir: Path | None = None  # the host folder of a runner without the sandbox
        self.log: IO[bytes] | None = None  # the runner's stdout and stderr: an unlinked file only this handle holds
        self.cgroup: Path | None = None
        self.starts = 0
        self.output_nbytes: list[int] | None = None  # sizes the runner poisons before each run
        self.output_cap = 1 << 20  # bytes one output set may take in a reply (2x the expected, at least)
        self.extra_env: dict[str, str] = {}  # over the allow-listed environment (compile-ahead's runners)
        self.cached_inputs: set[str] = set()
        self.primed_for: object = None  # the case sets a pool primed it with (farm.evaluate.trusted)
        self.device_info: dict = {}
        self.build_sock: socket.socket | None = None  # to the trusted builder (farm.evaluate.builds)
        self.server: Any = None  # the fork server (farm.evaluate.forkserver) lent for the next start
        # where a start finds no server lent, one to ask for (the trusted runner's: farm.evaluate.trusted)
        self.fork_from: Callable[[], Any] | None = None
        self.closed = False  # closed for good: never started again (a pool closing under a start)
        self._paused_since: float | None = None  # stopped by pause() since then
        self._paused_s = 0.0  # seconds stopped so far: time limits do not count them
        self._cpus: set[int] | None = None  # where pin() keeps the runner (None: where the OS puts it)

    # ------------------------------------------------------------ lifecycle

    def _preexec(self) -> None:
        limit = self.limits.log_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        if self.cgroup is not None:
            pids.join(self.cgroup)

    @property
    def scratch(self) -> Path:
        """The runner's folder as the runner sees it."""
        if self.boundary.on:
            return sandbox.SCRATCH
        assert self.workdir is not None, "made by _fresh_folder, before the runner starts"
        return self.workdir

    def _fresh_folder(self) -> None:
        """A new, empty folder per runner: inside the sandbox a tmpfs that exists only there;
        without it a host folder, removed without following anything a runner left in it."""
        self._release_folder()
        _OPEN.add(self)
        _sweep_once()
        if not self.boundary.on:
            self.workdir = scratch.new_folder()

    def _release_folder(self) -> None:
        scratch.remove_tree(self.workdir)
        self.workdir = None

    def start(self) -> None:
        if self.closed:  # a pool closed while this start waited for a fork server
            server, self.server = self.server, None
            if server is not None:
                server.release()
            raise RunnerDied("crash", "the runner was closed")
        self.resume()  # closes a pause of the runner this one replaces
        self.kill()
        self._fresh_folder()
        if self.log is not None:
            self.log.close()
        self.log = tempfile.TemporaryFile(prefix="farm-runner-log-")
        self.cgroup = None
        parent_sock, child_sock = socket.socketpair()
        build_parent, build_child = socket.socketpair() if self.builds else (None, None)
        try:
            self.proc = self._spawn({**candidate_env(self.spec, self.scratch), **self.extra_env}, child_sock,
                                    build_child)
        except BaseException:
            parent_sock.close()
            if build_parent is not None:
                build_parent.close()
            raise
        finally:
            child_sock.close()
            if build_child is not None:
                build_child.close()
        if build_parent is not None:
            self.build_sock = build_parent
            builds.serve(build_parent, builds.builder_for(self.boundary, self.spec.target.sandbox_paths()),
                         self.spec.label)
        self.sock, proc = parent_sock, self.proc
        self.starts += 1
        self.cached_inputs = set()
        self.primed_for = None
        reply = self._receive(None, self.limits.start_s, "start")
        if not reply.ok:
            self.kill()
            raise RunnerDied("crash", f"candidate runner failed to start: {reply.get('error')}")
        self.device_info = reply["device"]
        if self._cpus is not None:
            pin_tree(proc.pid, self._cpus)  # a runner started while pinned is pinned too

    def _spawn(self, env: dict[str, str], child_sock: socket.socket, build_sock: socket.socket | None = None) -> Any:
        """The runner's process: forked by its fork server where the pool lent one (the server
        gone: started afresh), else a new interpreter. `build_sock`: its end of the socket to
        the trusted builder of Triton's C helpers (farm.evaluate.builds)."""
        server, self.server = self.server, None
        if server is None and self.fork_from is not None:
            server = self.fork_from()
        build_fd = build_sock.fileno() if build_sock is not None else None
        if server is not None:
            env.update(self.spec.target.sandbox_env(self.spec.index))
            try:
                proc = server.fork(env, child_sock.fileno(), self.log.fileno(), build_fd)  # type: ignore[union-attr]
                self.server = server
                return proc
            except Exception as exc:  # noqa: BLE001 - the server is killed; this runner starts afresh
                log.warning("%s; starting a runner afresh", exc)
                server.release()
        self.cgroup = pids.new_group(self.limits.tasks) if self.boundary.on else None
        argv = self._argv([sys.executable, "-c", self._launcher(child_sock.fileno(), build_fd)], env)
        fds = (child_sock.fileno(),) if build_fd is None else (child_sock.fileno(), build_fd)
        return subprocess.Popen(argv, pass_fds=fds, env=env, cwd=self.workdir or "/",
                                stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                preexec_fn=self._preexec, start_new_session=True)

    def _launcher(self, fd: int, build_fd: int | None = None) -> str:
        # -c, with the working folder taken off sys.path: a candidate cannot plant modules that
        # a runner would import. Inside the sandbox the runner caps its own tasks first
        # (RLIMIT_NPROC counts the sandbox's user namespace; farm.evaluate.pids)
        nproc = (f"import resource; resource.setrlimit(resource.RLIMIT_NPROC, ({self.limits.tasks}, "
                 f"{self.limits.tasks})); ") if self.boundary.on and self.cgroup is None else ""
        return f"import sys; sys.path.pop(0); {nproc}{self._entry(fd, build_fd)}"

    def _entry(self, fd: int, build_fd: int | None = None) -> str:
        return (f"from farm.evaluate.runner_child import main; "
                f"main({fd}, {self.spec.label!r}, {self.limits.device_memory_fraction!r}, {build_fd!r})")

    def _argv(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """The command inside the OS boundary; `env` takes the target's pin for inside it."""
        if not self.boundary.on:
            return argv
        target = self.spec.target
        env.update(target.sandbox_env(self.spec.index))
        return sandbox.wrap(argv, scratch=self.scratch, env=env, devices=target.sandbox_nodes(self.spec.index),
                                read_only=[*self.read_only, *target.sandbox_paths()],
                                scratch_mb=self.limits.scratch_mb, tmp_mb=self.limits.tmp_mb)

    def pause(self) -> None:
        """Stop the runner and everything it started (a compiler) with SIGSTOP, so that it takes
        no CPU while the host times a device (farm.evaluate.quiet). Its time limits do not run
        while it is stopped; a runner started during the pause is not stopped."""
        proc = self.proc  # another thread may be replacing the runner
        if proc is not None and proc.poll() is None and self._paused_since is None:
            self._paused_since = time.monotonic()
            signal_tree(proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._paused_since is None:
            return
        proc = self.proc
        if proc is not None and proc.poll() is None:
            signal_tree(proc.pid, signal.SIGCONT)
        self._paused_s += time.monotonic() - self._paused_since
        self._paused_since = None

    def pin(self, cpus: set[int] | None) -> None:
        """Run the runner (all its threads, and a runner started later) on `cpus` only, or with
        None wherever this process may run (farm.evaluate.quiet.timing_cpu says why)."""
        self._cpus = set(cpus) if cpus is not None else None
        proc = self.proc
        if proc is not None and proc.poll() is None:
            pin_tree(proc.pid, self._cpus if self._cpus is not None else os.sched_getaffinity(0))

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
        """The runner and everything it started, wherever it went: its session, its process
        tree, its pids cgroup. Its log stays readable until the next start or close."""
        self.resume()  # SIGKILL ends a stopped process too; this closes the pause's account
        # read once: another thread (a timeout, close) may kill it at the same moment and clear them
        proc, sock, cgroup = self.proc, self.sock, self.cgroup
        if proc is not None:
            signal_tree(proc.pid, signal.SIGKILL)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout=10)
        pids.kill_all(cgroup)
        self.cgroup = None
        if sock is not None:
            sock.close()
        build_sock, self.build_sock = self.build_sock, None
        if build_sock is not None:  # wakes the builder thread blocked on it
            try:
                build_sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.proc = self.sock = None
        server = self.server
        if server is not None and proc is not None:  # its child is gone: cleaned, for the next one
            self.server = None
            server.release()

    def close(self) -> None:
        self.closed = True
        self.resume()  # a stopped runner asked to exit would never answer
        try:
            proc, sock = self.proc, self.sock
            if self.alive and proc is not None and sock is not None:
                try:
                    wire.send_frame(sock, dumps(protocol.Exit()))
                    proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        finally:  # Ctrl-C or SIGTERM during a wait: the runner and its folder still go
            try:
                self.kill()
            finally:
                self._release_folder()
                if self.log is not None:
                    self.log.close()
                    self.log = None
                _OPEN.discard(self)
                if self.server is not None:  # lent, never forked on
                    self.server.release()
                    self.server = None

    def log_tail(self, n: int = 4000) -> str:
        """The end of what the runner printed, read through the descriptor this handle holds."""
        if self.log is None:
            return ""
        return trim(scratch.tail(self.log.fileno(), n).decode(errors="replace"), n)

    # ------------------------------------------------------------ commands

    def call(self, cmd: str | Command, timeout_s: float, reply_cap: int | None = None, **args: Any) -> Reply:
        """Run a command (a protocol.Command, or its name and fields) and return its typed reply."""
        if isinstance(cmd, str):
            cmd = protocol.command(cmd, **args)
        self.ensure_started()
        self._send(cmd)
        reply = self._receive(cmd, timeout_s, cmd.verb, reply_cap)
        if not reply.ok and reply.get("restart"):  # the runner found itself tampered with, or broke the protocol
            self.kill()
        return reply

    def _send(self, cmd: Command) -> None:
        """Tensors of FILE_MIN_BYTES or more travel as an anonymous memory file whose descriptor
        goes with the frame: pickled into the socket, a 256 MB input set took 1.1 to 1.3 s to
        reach a runner on the H100 host (bench/results/training_h100/NOTES-2026-11-24.md); no path is ever
        written."""
        sock = self.sock
        if sock is None:  # killed from another thread since it was started
            raise self._died(cmd.verb)
        if tensor_bytes(cmd.arguments()) < FILE_MIN_BYTES:
            wire.send_frame(sock, dumps(cmd))  # unsigned tensors too (farm.runtime.tensors)
            return
        import torch

        fd = wire.memfile(lambda f: torch.save(cmd, f))
        try:
            wire.send_frame(sock, b"", fds=(fd,))
        finally:
            os.close(fd)

    def reply_cap(self, cmd: Command | None) -> int:
        """The most bytes a reply to `cmd` may take: what its output sets can need, and no more."""
        sets = getattr(cmd, "output_sets", None)
        count: int = getattr(cmd, "carries_outputs", 0) if sets is None else sets
        return REPLY_BASE_BYTES + count * self.output_cap

    def with_inputs(self, cmd: str, timeout_s: float, key: str, inputs: list | None, **args: Any) -> Reply:
        """Run a command on an input set the child keeps on its device: each set crosses the
        process boundary once per child."""
        if not self.alive or key not in self.cached_inputs:
            reply = self.call("put_inputs", timeout_s, key=key, inputs=inputs, output_nbytes=self.output_nbytes)
            if not reply.ok:
                return reply
            self.cached_inputs.add(key)
        return self.call(cmd, timeout_s, key=key, **args)

    def _receive(self, cmd: Command | None, timeout_s: float, what: str, cap: int | None = None) -> Reply:
        """The reply to `cmd`: read within `timeout_s` (less the seconds the runner was stopped),
        at most `cap` bytes, while the watchdog checks the runner's memory."""
        def clock() -> float:  # against the clock less the seconds stopped
            return time.monotonic() - self.paused_s()

        cap = cap or self.reply_cap(cmd)
        sock = self.sock  # another thread may kill the runner, and take the socket, meanwhile
        try:
            if sock is None:
                raise EOFError
            data = wire.recv_frame(sock, cap, clock() + timeout_s, wait=lambda: self._watch(what), clock=clock)
        except (EOFError, OSError, ValueError):  # closed: the runner died, or was killed from another thread
            raise self._died(what) from None
        except wire.FrameTooLarge as exc:
            self.kill()  # the stream is out of step: this runner is finished
            kind = "mismatch" if cmd is not None and self.reply_cap(cmd) > REPLY_BASE_BYTES else "cheat"
            return Failure(kind=kind, error=f"the runner's reply to {what} is larger than its outputs can be: {exc}")
        except wire.FrameTimeout:
            self.kill()
            raise RunnerDied("timeout", f"no answer to {what} within {timeout_s:.0f} s") from None
        try:
            tree = wire.decode(data)
        except wire.ProtocolError as exc:
            self.kill()
            return Failure(kind="cheat", error=f"the runner replied to {what} with something other than plain "
                                               f"tensors and values: {exc}")
        return protocol.parse_reply(cmd, tree)

    def _watch(self, what: str) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:  # not alive
            raise self._died(what)
        rss = proc.rss_mb() if hasattr(proc, "rss_mb") else rss_mb(proc.pid)
        if rss > self.limits.host_memory_mb:
            self.kill()
            raise RunnerDied("crash", f"candidate exceeded the memory limit ({rss:.0f} MB > "
                                       f"{self.limits.host_memory_mb} MB) during {what}")

    def _died(self, what: str) -> RunnerDied:
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
        return RunnerDied("crash", f"candidate runner {why} during {what}\n{self.log_tail(1500)}")


_swept = False


def _sweep_once() -> None:
    """Folders (and pids groups) of evaluators that were killed go at the next one's first runner."""
    global _swept
    if not _swept:
        _swept = True
        scratch.sweep_stale()
        pids.sweep()


# runners with a folder, until closed: what a thread (re)started after its owner closed it
# (Ctrl-C or SIGTERM while candidates were in flight) goes when the process exits
_OPEN: weakref.WeakSet[Runner] = weakref.WeakSet()


@atexit.register
def _close_left_open() -> None:
    """At exit (after the interpreter joined its threads): no runner and no folder left behind."""
    for box in list(_OPEN):
        try:
            box.kill()
        except BaseException:  # noqa: BLE001 - the next one still goes
            pass
        box._release_folder()


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
