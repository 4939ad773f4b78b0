"""The sandbox, the operating-system boundary around a runner: bubblewrap (Debian package `bubblewrap`).

A runner started through `wrap()` lives in namespaces of its own:

- network: a namespace with loopback only, so no route to Redis, S3, the LLM endpoint or the
  metadata service (abstract Unix sockets are per network namespace too);
- mounts: an empty root with, read-only, the system's /usr (and /bin, /lib... as the host has
  them), a few files of /etc that the dynamic loader and the C library read, the Python
  environment (its prefixes and the folders on sys.path, never HOME itself), the farm package
  alone (not the checkout around it, which holds configs/), and what the caller names (a
  task's folder); read-write only its scratch folder (a size-limited tmpfs that exists only
  inside), a private size-limited /tmp and /dev/shm; a minimal /dev plus the device nodes of
  its one pinned device; /sys read-only;
- processes: a PID namespace with its own /proc, so no /proc/<parent>/environ or /mem;
  a user namespace in which no further one can be made (--disable-userns); all capabilities
  dropped; a new session (no terminal to inject into); killed with its parent.

Why bubblewrap rather than Landlock: see docs/evaluator.md ("Sandbox"). In short, one
well-kept setuid-free binary gives all three (network, files, processes) with namespaces that
the kernel has enforced for a decade; Landlock limits files and TCP ports but not UDP or /proc
of the parent's siblings, and its Python bindings are young.

Where bubblewrap is missing or namespaces are refused (macOS, a container whose seccomp
profile forbids unshare, a kernel without unprivileged user namespaces), `probe()` says why,
the farm logs it once, every verdict records `sandbox: none`, and `evaluator.require_sandbox`
turns that into an error.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from farm.errors import FarmError

log = logging.getLogger(__name__)

MODES = ("auto", "off")
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # farm/

# /etc: only what ld.so, the C library (user and group names, time zone) and gcc (Triton
# builds its launcher with the system compiler) read; never the whole folder, which holds
# the machine's secrets.
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf",
        "localtime", "timezone", "os-release")
_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True)
class Boundary:
    kind: str  # "bwrap" or "none"
    why: str = ""  # for "none": the reason, one line

    @property
    def on(self) -> bool:
        return self.kind != "none"


# ------------------------------------------------------------------ policy

_WARNED: set[str] = set()


def current(mode: str = "auto", require: bool = False) -> Boundary:
    """The boundary runners get under `mode` (evaluator.sandbox: auto or off); raises where
    `require` (evaluator.require_sandbox) holds and none can be set up. The caller passes its
    own settings' values: nothing here reads a process-wide setting. The first time none can
    be set up, says so in the log (once per process and reason)."""
    if mode not in MODES:
        raise FarmError(f"evaluator.sandbox must be one of {', '.join(MODES)}, not {mode!r}")
    found = Boundary("none", "turned off (evaluator.sandbox=off)") if mode == "off" else probe()
    if not found.on:
        if require:
            raise FarmError(f"candidates must run in a sandbox (evaluator.require_sandbox) but none can be set up: "
                            f"{found.why}")
        if found.why not in _WARNED:
            _WARNED.add(found.why)
            log.warning("sandbox: none (%s): candidates run without an operating-system boundary and can read "
                        "every file this user can and reach the network; docs/evaluator.md", found.why)
    return found


@functools.lru_cache(maxsize=1)
def probe() -> Boundary:
    """Can bubblewrap set up every namespace here? Tried once per process (about 10 ms)."""
    if not sys.platform.startswith("linux"):
        return Boundary("none", f"no bubblewrap on {sys.platform} (Linux namespaces only)")
    binary = shutil.which("bwrap")
    if binary is None:
        return Boundary("none", "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
    argv = [binary, *_base_args(), "--", "/bin/true" if Path("/bin/true").exists() else "/usr/bin/true"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Boundary("none", f"bwrap cannot run: {exc}")
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return Boundary("none", f"bwrap cannot create namespaces here: {first[:300]}")
    return Boundary("bwrap")


# ------------------------------------------------------------------ the command line


TMP_MB = 512  # the private /tmp and /dev/shm, each (tmpfs: memory, so bounded)


def _base_args(tmp_mb: int = TMP_MB) -> list[str]:
    # --unshare-user with --disable-userns: no nested user namespace (where a candidate would
    # hold every capability again) can be created inside
    size = str(int(tmp_mb) << 20)
    args = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm",
            "--size", size, "--tmpfs", "/tmp", "--ro-bind", "/usr", "/usr", "--ro-bind-try", "/sys", "/sys"]
    for name in _TOP_LEVEL:
        path = Path("/" + name)
        if path.is_symlink():  # merged /usr: /lib -> usr/lib
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for name in _ETC:
        if Path("/etc", name).exists():
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return args


def _home_or_above(path: Path) -> bool:
    home = Path.home().resolve()
    return path == home or path in home.parents or path == Path("/")


def python_paths(extra_pythonpath: str = "") -> list[Path]:
    """Folders the interpreter needs: its prefixes and sys.path (site-packages, .pth
    additions), less the current folder and anything that would expose HOME as a whole. The
    checkout holding the farm package is replaced by the package folder alone."""
    found: list[Path] = []
    prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    # Only the parent's sys.path entries that belong to the installation (site directories, .pth
    # additions inside a prefix): a test runner or a tool may have put arbitrary folders on
    # sys.path (pytest's temporary folders, a download), and the candidate must not see them.
    installed = [p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p
                                                or any(p.startswith(pre + os.sep) for pre in prefixes))]
    candidates = [*prefixes, *installed, *extra_pythonpath.split(os.pathsep)]
    for entry in candidates:
        if not entry or not os.path.isabs(entry):
            continue
        path = Path(entry).resolve()
        if path == PACKAGE_DIR.parent:
            path = PACKAGE_DIR
        if not path.is_dir() or _home_or_above(path) or path == Path.cwd().resolve():
            continue
        if str(path).startswith(("/usr/", "/proc/", "/dev/", "/sys/")) or path == Path("/usr"):
            continue  # already there
        if path not in found:
            found.append(path)
    found.append(PACKAGE_DIR)
    return list(dict.fromkeys(found))


def toolchain_paths(env: Mapping[str, str] | None = None) -> list[Path]:
    """Installation prefixes of the C compiler Triton builds its launcher with (`CC`, else gcc,
    cc or clang on PATH), where they lie outside /usr: a CUDA image with gcc in /opt/gcc made
    every candidate a runtime_error (no such file '/opt/gcc/bin/gcc') inside the boundary."""
    env = os.environ if env is None else env
    found: list[Path] = []
    names = [env.get("CC", ""), "gcc", "cc", "clang"]
    for name in filter(None, names):
        hit = shutil.which(name, path=env.get("PATH"))
        if hit is None:
            continue
        for binary in dict.fromkeys([Path(hit), Path(os.path.realpath(hit))]):
            prefix = binary.parent.parent if binary.parent.name == "bin" else binary.parent
            if str(prefix).startswith("/usr") or prefix == Path("/") or _home_or_above(prefix):
                continue
            if prefix.is_dir() and prefix not in found:
                found.append(prefix)
    return found


SCRATCH = Path("/scratch")  # a runner's folder inside the boundary (scratch_mb given to wrap)


def wrap(argv: list[str], *, scratch: Path, env: dict[str, str], devices: Sequence[str] = (),
         read_only: Sequence = (), writable: Sequence = (), scratch_mb: int | None = None,
         tmp_mb: int = TMP_MB) -> list[str]:
    """The bwrap command line that runs `argv` inside the boundary, in `scratch`: `devices`
    (device files) as they are, `read_only` and the Python environment read-only, `writable`
    read-write. With `scratch_mb`, `scratch` (SCRATCH) is a tmpfs of that size that exists only
    inside and goes with the sandbox: nothing a runner writes reaches the host's disk or
    outlives it. Without, the host folder `scratch` is bound read-write (the ascend frontend's
    children, whose result file the caller reads with farm.evaluate.scratch)."""
    binary = shutil.which("bwrap")
    if binary is None:
        raise FarmError("bubblewrap (bwrap) is no longer on PATH; the sandbox cannot start")
    args = [binary, *_base_args(tmp_mb)]
    ro = (python_paths(env.get("PYTHONPATH", "")) + toolchain_paths({**os.environ, **env})
          + [Path(p).resolve() for p in read_only])
    for path in dict.fromkeys(ro):
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    for path in writable:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(path), str(path)]
    if scratch_mb is not None:
        args += ["--size", str(int(scratch_mb) << 20), "--tmpfs", str(scratch)]
    else:
        Path(scratch).mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(scratch), str(scratch)]
    for node in devices:
        args += ["--dev-bind", node, node]
    args += ["--chdir", str(scratch), "--"]
    return args + list(argv)
