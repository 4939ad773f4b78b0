"""Folders an untrusted process could write, handled as hostile wherever the evaluator reads,
copies or deletes in them: no name is followed as a link, no open blocks (a FIFO), no read is
unbounded (a link to /dev/zero, a file grown while read), and a runner's own output is read
through a descriptor the evaluator opened, never through a path.

Inside the sandbox a runner's folder is a tmpfs that goes with it (farm.evaluate.sandbox), so
the host keeps a folder of its own only where the sandbox is off; such folders carry the
evaluator's pid in their name, and the next evaluator to start removes those of a dead one.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

from farm.procs import pid_alive

PREFIX = "farm-sandbox-"
_OWNED = re.compile(rf"^{PREFIX}(\d+)-")


class UnsafeFile(Exception):
    """A name in a hostile folder is not a plain file of a bounded size."""


def read_capped(folder: Path, name: str, cap: int) -> bytes:
    """The bytes of `folder/name`, which must be a regular file with one link, at most `cap`
    bytes long; anything else (a link, a FIFO, a socket, a folder, a device, a hard link to a
    file elsewhere, a file too large) raises UnsafeFile."""
    if "/" in name or name in ("", ".", ".."):
        raise UnsafeFile(f"{name!r} is not a plain file name")
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    dir_fd = os.open(folder, flags | os.O_DIRECTORY)
    try:
        try:
            fd = os.open(name, flags | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dir_fd)
        except FileNotFoundError:
            raise
        except OSError as exc:  # ELOOP for a link
            raise UnsafeFile(f"{name} cannot be opened as a plain file: {exc.strerror}") from None
    finally:
        os.close(dir_fd)
    try:
        return read_fd(fd, cap, name)
    finally:
        os.close(fd)


def read_fd(fd: int, cap: int, what: str = "the file") -> bytes:
    """At most `cap` bytes of an open regular file, or UnsafeFile."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(f"{what} is not a regular file")
    if st.st_nlink > 1:
        raise UnsafeFile(f"{what} has {st.st_nlink} links: a file from elsewhere")
    data = os.pread(fd, cap + 1, 0)
    if len(data) > cap:
        raise UnsafeFile(f"{what} is larger than {cap} bytes")
    return data


def tail(fd: int, n: int) -> bytes:
    """The last `n` bytes of a file the evaluator holds open (a runner's log)."""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, n, max(0, size - n)) if size else b""
    except OSError:
        return b""


def new_folder() -> Path:
    """A host folder for a runner without the sandbox, named for this process."""
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))


def remove_tree(path: Path | None) -> None:
    """Remove a hostile folder without following any link in it (shutil.rmtree works on
    descriptors on Linux), folders its writer made unreadable included."""
    if path is None:
        return

    def retry(func, name, _exc):  # a folder its writer made unwritable: open it up once, try again
        try:
            os.chmod(os.path.dirname(name), 0o700)
            func(name)
        except OSError:
            pass

    if os.path.islink(path) or not os.path.isdir(path):
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    shutil.rmtree(path, onerror=retry)


def sweep_stale(root: Path | None = None) -> list[Path]:
    """Remove the runner folders of evaluators that died without removing them (killed): folders
    named for a pid that no longer runs. Returns what was removed."""
    root = Path(root or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        m = _OWNED.match(entry.name)
        if not m or int(m.group(1)) == os.getpid() or pid_alive(int(m.group(1))):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                remove_tree(Path(entry.path))
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed



def run_capped(argv: list[str], timeout_s: float, cap: int = 16 << 20, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run for an untrusted child: its stdout and stderr go to unlinked files of at
    most `cap` bytes each (RLIMIT_FSIZE: a child that prints more is killed), of which the last
    `cap` bytes come back as text; never an unbounded read into memory."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        done = subprocess.run(argv, stdout=out, stderr=err, timeout=timeout_s, preexec_fn=limit, check=False, **kwargs)
        text = [tail(f.fileno(), cap).decode(errors="replace") for f in (out, err)]
    return subprocess.CompletedProcess(argv, done.returncode, text[0], text[1])
