"""Runner side of farm.evaluate.builds: Triton's C helpers (its `knobs.build.impl` hook) come
from the evaluator's trusted builder over a socket of the runner's own, and from the
runner's own compiler when the builder refuses, fails or is not there. This code runs in the
runner, which a candidate can rewrite: it is a convenience for honest runners, never a check.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import sysconfig
import time

from farm.evaluate import wire

REPLY_S = 300.0  # a build on a loaded host; the command's own time limit still applies


def install(fd: int | None) -> bool:
    """Route the runner's builds through the builder on descriptor `fd`, where Triton offers
    the hook (Triton >= 3.4); False where it does not or no descriptor was given."""
    if fd is None:
        return False
    try:
        from triton import knobs
    except ImportError:
        return False
    if not hasattr(getattr(knobs, "build", None), "impl"):
        return False
    sock = socket.socket(fileno=fd)
    knobs.build.impl = _Impl(sock)
    return True


class _Impl:
    def __init__(self, sock: socket.socket):
        self.sock: socket.socket | None = sock

    def __call__(self, name, src, srcdir, library_dirs, include_dirs, libraries) -> str:
        so = os.path.join(srcdir, f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}")
        language = "c++" if src.endswith((".cc", ".cpp", ".cxx")) else "c"
        with open(src, encoding="utf-8") as f:
            source = f.read()
        output = self._ask({"name": name, "source": source, "language": language, "library_dirs": list(library_dirs),
                            "include_dirs": list(include_dirs), "libraries": list(libraries)})
        if output is None:
            return _own_build(name, src, srcdir, library_dirs, include_dirs, libraries, language)
        with open(so, "wb") as f:
            f.write(output)
        return so

    def _ask(self, request: dict) -> bytes | None:
        if self.sock is None:
            return None
        try:
            wire.send_frame(self.sock, json.dumps(request).encode())
            deadline = time.monotonic() + REPLY_S
            reply = json.loads(wire.recv_frame(self.sock, wire.MAX_HEADER, deadline))
            output = wire.recv_frame(self.sock, 1 << 30, deadline)
        except (OSError, EOFError, ValueError, wire.ProtocolError):
            self.sock = None  # the builder is gone: every later build is the runner's own
            return None
        return output if reply.get("ok") is True and output else None


def _own_build(name, src, srcdir, library_dirs, include_dirs, libraries, language) -> str:
    """Triton's own build, as if no hook were set."""
    from triton import knobs
    from triton.runtime import build

    hook, knobs.build.impl = knobs.build.impl, None
    try:
        extra = {"language": language} if "language" in inspect.signature(build._build).parameters else {}
        return build._build(name, src, srcdir, list(library_dirs), list(include_dirs), list(libraries), [], **extra)
    finally:
        knobs.build.impl = hook
