"""The fork server, inside its sandbox: a process that has imported the runner (torch, Triton,
the harness) once and forks one candidate runner at a time from that state, so a candidate's
runner costs a fork instead of an interpreter and `import torch` (about 2 CPU-seconds each).

Why a fork is as fresh as a new interpreter here: the server never runs candidate code, never
touches the device (a device context does not survive fork) and keeps nothing secret; its
children get a copy of its memory that they cannot write back (copy on write), and it is not
dumpable, so a child, which holds no capabilities, can neither ptrace it nor open its
/proc/<pid>/mem. What a child could leave in the sandbox they share is removed before the
next fork (`clean`): every other process of the PID namespace is killed, /tmp, /dev/shm and the
runner's folder are emptied without following links, and a System V IPC object left behind (no
honest runner makes one) retires the server. A server that fails any of this, or does not
answer in time, is killed with its sandbox by the evaluator (farm.evaluate.forkserver).

Messages from the evaluator are JSON frames, a fork's with the child's socket and log
descriptors; replies are plain data (farm.evaluate.wire), read with a cap and a deadline.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import gc
import importlib
import json
import os
import random
import signal
import socket
import sys
import time
import traceback

from farm.evaluate import wire

WRITABLE = ("/tmp", "/dev/shm")
_SHRUGGED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)  # with the runner's folder (farm.evaluate.sandbox.SCRATCH)
_PR_SET_DUMPABLE = 4
CLEAN_S = 5.0  # a clean that takes longer (a child left a million files) retires the server


def serve(fd: int, device_label: str, memory_fraction: float, scratch: str) -> None:
    # everything a runner imports, imported here once; nothing that starts threads or a device
    from farm.evaluate import runner_child

    warm_triton()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    for sig in _SHRUGGED:  # a child may signal its server: only SIGKILL and SIGSTOP still reach it
        signal.signal(sig, signal.SIG_IGN)
    gc.collect()
    gc.freeze()  # the imported state stays shared with the children (no collector writes to it)
    _reply(sock, {"ok": True, "device": {}})
    child = 0
    while True:
        try:
            payload, fds = wire.recv_frame_fds(sock, max_fds=3)
        except (EOFError, OSError):
            os._exit(0)
        try:
            msg = json.loads(payload)
            verb = msg.get("verb")
        except (ValueError, AttributeError):  # the runner protocol's Exit (pickled), or nonsense
            os._exit(0)
        if verb == "fork" and len(fds) in (2, 3) and child == 0:
            sys.stdout.flush()
            sys.stderr.flush()
            child = os.fork()
            if child == 0:  # never back into this loop, whatever happens
                code = 0
                try:
                    sock.close()
                    _become_runner(fds, msg["env"], scratch)
                    runner_child.main(3, device_label, memory_fraction, 4 if len(fds) == 3 else None)
                except BaseException:  # noqa: BLE001 - said in the runner's log, as a fresh one would
                    traceback.print_exc()
                    code = 1
                finally:
                    os._exit(code)
            for f in fds:
                os.close(f)
            _reply(sock, {"ok": True, "pid": child})
        elif verb == "reap":
            _reply(sock, {"ok": True, "status": _reap(child, float(msg.get("timeout", 10.0)))})
        elif verb == "clean":
            why = clean(scratch)
            child = 0
            _reply(sock, {"ok": not why, "why": why})
        else:
            for f in fds:
                os.close(f)
            _reply(sock, {"ok": False, "why": f"unknown or out-of-turn message {verb!r}"})


# What a runner's first jit call imports (Triton's code generator and, with it, the gluon
# dialect; the interpreter under TRITON_INTERPRET): about 0.1 s of a fresh runner's first call
_FIRST_CALL = ("triton.compiler.code_generator",)
_FIRST_CALL_INTERPRETED = ("triton.runtime.interpreter",)


def warm_triton() -> None:
    """What Triton loads or computes once per process from its own files, done here so every
    fork has it: the modules of a first jit call, and the key of its build (a sha256 over
    libtriton, 400 MB in a CUDA wheel: about a second of every fresh runner's first compile;
    not under the interpreter, which compiles nothing). Files only, never the device."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    for name in _FIRST_CALL + (_FIRST_CALL_INTERPRETED if interpreted else ()):
        try:
            importlib.import_module(name)
        except ImportError:  # another Triton's layout: its first call imports what it needs
            pass
    if interpreted:
        return
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # a Triton that keys its cache otherwise
        return
    triton_key()


def _become_runner(fds: list[int], env: dict, scratch: str) -> None:
    """The forked child as a runner started afresh would be: its log on stdout and stderr, its
    socket on descriptor 3, the builder's (farm.evaluate.builds) on 4 and nothing else of the
    server's open, its environment, its folder."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 16) for fd in fds]  # out of the way of 1-4 first
    sock_fd, log_fd, *build = high
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for fd, at in ((sock_fd, 3), *((b, 4) for b in build)):
        os.dup2(fd, at, inheritable=False)
    os.closerange(5 if build else 4, 1 << 16)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in env.items()})

    os.chdir(scratch)
    for sig in _SHRUGGED:  # as a new interpreter has them
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    os.setpgid(0, 0)  # its own group: the evaluator kills the group
    random.seed()  # not the server's sequence


def _reap(pid: int, timeout: float) -> int | None:
    """The child's exit as Popen.returncode reads (-signal, or the code), or None if alive."""
    if pid <= 0:
        return None
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)


def clean(scratch: str) -> str:
    """Everything a child left removed; '' when done, else why the server must go."""
    deadline = time.monotonic() + CLEAN_S
    left = _kill_others(deadline)
    if left:
        return f"processes still alive after the kill: {left}"
    for folder in (*WRITABLE, scratch):
        why = _empty(folder, deadline)
        if why:
            return why
    return _ipc_left()


def _others() -> list[int]:
    """Processes of this PID namespace but init (bwrap's) and this one, zombies excluded."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z":
            found.append(int(name))
    return found


def _kill_others(deadline: float) -> list[int]:
    while True:
        try:
            os.kill(-1, signal.SIGKILL)  # all but init and this process
        except ProcessLookupError:
            pass
        while True:  # this server's own children: reaped here (orphans go to init)
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        left = _others()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.005)


def _empty(folder: str, deadline: float) -> str:
    """Everything in `folder` removed without following a link, except the read-only binds
    that the sandbox mounted there (a Python environment or the farm under /tmp): a mount
    point is skipped, and a folder that still holds one stays."""
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        return f"{folder} cannot be listed: {exc.strerror}"
    for entry in entries:
        if time.monotonic() > deadline:
            return f"{folder} took longer than {CLEAN_S:.0f} s to empty"
        try:
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
                continue
            if os.path.ismount(entry.path):
                continue
            why = _empty(entry.path, deadline)
            if why:
                return why
            os.rmdir(entry.path)
        except RecursionError:
            return f"{folder} is nested too deep to empty"
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EBUSY) and entry.is_dir(follow_symlinks=False):
                continue  # it holds a mount point
            return f"{entry.path} cannot be removed: {exc.strerror}"
    return ""


def _ipc_left() -> str:
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        if rows:
            return f"a System V {kind} object was left behind"
    return ""


def _reply(sock: socket.socket, payload: dict) -> None:
    wire.send_frame(sock, wire.encode(payload))
