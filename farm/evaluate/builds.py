"""The trusted builder of a runner's C helpers: what Triton's driver compiles with the system
compiler in every new compiler cache (on CUDA its `cuda_utils` and one launcher per kernel
signature, about a second of gcc each), built once per evaluator process, outside every
candidate's process, and handed to each runner as bytes.

Why: each runner has a compiler cache of its own (a candidate could plant entries a later
runner would load), so without this every runner rebuilt the same helpers, and the fork server
(farm.evaluate.forkserver) lost its gain to gcc on a GPU. The cache here is one that only
trusted code writes: an entry is the output of the compiler run by this process, in a sandbox
of its own that no candidate shares (the same read-only view as a runner's, no device, no
scratch of anyone's), on exactly the source and options its key hashes. A candidate may ask
for anything; what it gets is the compile of what it asked, and a later runner gets an entry
only when its own request hashes the same, so nothing a candidate sends reaches anyone else.

The runner asks over a socket of its own (farm.evaluate.build_client, Triton's
`knobs.build.impl`); each request is size-checked and parsed here, each runner may ask
MAX_BUILDS times, and a refusal only sends the runner back to its own compiler.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sysconfig
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from farm.evaluate import sandbox, wire
from farm.runtime import scratch

log = logging.getLogger(__name__)

REQUEST_BYTES = 1 << 20  # a launcher's source is a few tens of kilobytes
OUTPUT_BYTES = 64 << 20
CACHE_BYTES = 256 << 20
MAX_BUILDS = 64  # per runner: an honest one asks once per kernel signature
BUILD_S = 120.0
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_LANGS = {"c": ".c", "c++": ".cpp"}
_ENV_KEPT = ("PATH", "LANG", "LC_ALL", "CC", "CXX", "TRITON_CUDACRT_PATH", "TRITON_CUDART_PATH")


class Refused(ValueError):
    """A request this builder does not take: said to the runner, which compiles for itself."""


@dataclass(frozen=True)
class Request:
    name: str
    source: str
    language: str
    library_dirs: tuple[str, ...]
    include_dirs: tuple[str, ...]
    libraries: tuple[str, ...]

    @classmethod
    def parse(cls, data: bytes) -> Request:
        try:
            tree = json.loads(data)
        except ValueError:
            raise Refused("not JSON") from None
        if not isinstance(tree, dict):
            raise Refused("not an object")
        name, source, language = tree.get("name"), tree.get("source"), tree.get("language", "c")
        if not isinstance(name, str) or not _NAME.match(name):
            raise Refused("name")
        if not isinstance(source, str) or "\0" in source:
            raise Refused("source")
        if language not in _LANGS:
            raise Refused("language")
        return cls(name, source, language, *(_paths(tree.get(k)) for k in ("library_dirs", "include_dirs", "libraries")))

    def key(self, compiler: str) -> str:
        body = json.dumps([self.name, self.source, self.language, self.library_dirs, self.include_dirs,
                           self.libraries, compiler], separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()


def _paths(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > 32:
        raise Refused("a list of at most 32 paths")
    if not all(isinstance(v, str) and 0 < len(v) <= 4096 and "\0" not in v for v in value):
        raise Refused("paths")
    return tuple(value)


class Builder:
    """Compiles requests in a sandbox of their own and keeps the outputs (at most CACHE_BYTES)."""

    def __init__(self, boundary: sandbox.Boundary, read_only: Sequence[str] = (), env: dict | None = None):
        self.boundary = boundary
        self.read_only = list(read_only)
        self.env = {k: v for k, v in (os.environ if env is None else env).items() if k in _ENV_KEPT}
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}
        self.builds = self.hits = 0

    def get(self, req: Request) -> bytes:
        compiler = self._compiler(req.language)
        key = req.key(compiler)
        with self._lock:
            lock = self._building.setdefault(key, threading.Lock())
        with lock:  # runners that ask for the same helper at once wait for one build
            with self._lock:
                if key in self._cache:
                    self.hits += 1
                    self._cache.move_to_end(key)
                    return self._cache[key]
            output = self._compile(req, compiler)
            with self._lock:
                self.builds += 1
                self._keep(key, output)
        return output

    def _keep(self, key: str, output: bytes) -> None:
        self._cache[key] = output
        total = sum(len(v) for v in self._cache.values())
        while total > CACHE_BYTES and len(self._cache) > 1:
            _, dropped = self._cache.popitem(last=False)
            total -= len(dropped)

    def _compiler(self, language: str) -> str:
        """The compiler Triton would pick in a runner (CC, else gcc, else clang), with its size
        and time in the key: a compiler replaced on the host gives new entries."""
        name = self.env.get("CXX" if language == "c++" else "CC") or ("g++" if language == "c++" else "gcc")
        found = shutil.which(name, path=self.env.get("PATH")) or shutil.which("clang", path=self.env.get("PATH"))
        if found is None:
            raise Refused("no compiler here")
        st = os.stat(found)
        return f"{os.path.realpath(found)}:{st.st_size}:{st.st_mtime_ns}"

    def _compile(self, req: Request, compiler: str) -> bytes:
        folder = scratch.new_folder()
        try:
            src = folder / f"{req.name}{_LANGS[req.language]}"
            src.write_text(req.source)
            out = folder / f"{req.name}{sysconfig.get_config_var('EXT_SUFFIX')}"
            argv = self._argv(req, compiler.rsplit(":", 2)[0], src, out, folder)
            if self.boundary.on:
                argv = sandbox.wrap(argv, scratch=folder, env=dict(self.env), read_only=self.read_only)
            try:
                done = scratch.run_capped(argv, BUILD_S, cap=64 << 10, env=self.env, cwd=folder,
                                          start_new_session=True)
            except subprocess.TimeoutExpired:
                raise Refused(f"the compiler took longer than {BUILD_S:.0f} s") from None
            if done.returncode != 0:
                raise Refused(f"the compiler failed: {(done.stderr or done.stdout)[-1500:]}")
            try:
                return scratch.read_capped(folder, out.name, OUTPUT_BYTES)
            except (OSError, scratch.UnsafeFile) as exc:
                raise Refused(f"no output: {exc}") from None
        finally:
            scratch.remove_tree(folder)

    def _argv(self, req: Request, cc: str, src: Path, out: Path, folder: Path) -> list[str]:
        # the command Triton's runtime.build._build runs, with this process's own folders
        include = [*req.include_dirs, str(folder), sysconfig.get_paths()["include"],
                   *(self.env[k] for k in ("TRITON_CUDACRT_PATH", "TRITON_CUDART_PATH") if self.env.get(k))]
        argv = [cc, str(src), "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", str(out)]
        if req.language == "c++":
            argv.insert(3, "-std=c++17")
        argv += [f"-l:{lib}" if re.search(r"\.so(\.\d+)*$", lib) or lib.endswith(".a") else f"-l{lib}"
                 for lib in req.libraries]
        argv += [f"-L{d}" for d in req.library_dirs]
        return argv + [f"-I{d}" for d in include]


_BUILDERS: dict[tuple, Builder] = {}
_BUILDERS_LOCK = threading.Lock()


def builder_for(boundary: sandbox.Boundary, read_only: Sequence[str]) -> Builder:
    """One builder (one cache) per boundary and view, for the evaluator process's life."""
    key = (boundary, tuple(read_only))
    with _BUILDERS_LOCK:
        if key not in _BUILDERS:
            _BUILDERS[key] = Builder(boundary, read_only)
        return _BUILDERS[key]


def serve(sock: socket.socket, builder: Builder, label: str = "") -> threading.Thread:
    """Answer one runner's requests on `sock` until it closes, or MAX_BUILDS of them (then the
    socket is closed and the runner compiles for itself): a thread of the evaluator."""
    thread = threading.Thread(target=_serve, args=(sock, builder.get), name=f"farm-builds-{label}", daemon=True)
    thread.start()
    return thread


def _serve(sock: socket.socket, get: Callable[[Request], bytes]) -> None:
    try:
        for _ in range(MAX_BUILDS):
            try:
                data = wire.recv_frame(sock, REQUEST_BYTES, time.monotonic() + 10 ** 9)
            except (EOFError, OSError, ValueError, wire.ProtocolError):  # ValueError: closed under the wait
                return
            try:
                output = get(Request.parse(data))
                reply: dict[str, object] = {"ok": True}
            except Refused as exc:
                output, reply = b"", {"ok": False, "why": str(exc)}
            except Exception as exc:  # noqa: BLE001 - this runner compiles for itself; the evaluator goes on
                log.warning("a helper build failed: %s", exc)
                output, reply = b"", {"ok": False, "why": f"{type(exc).__name__}"}
            wire.send_frame(sock, json.dumps(reply).encode())
            wire.send_frame(sock, output)
    except OSError:
        return
    finally:
        sock.close()
