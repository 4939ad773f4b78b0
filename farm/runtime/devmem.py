"""Device memory shared by the concurrent jobs of one host (`farm reference --jobs N`).

Each job measures what it will need (on the meta device) before it allocates anything, then
reserves it here: a job whose need fits what the device has now, beside what the other live
jobs reserved, goes on; one that would fit an idle device waits for the others to finish
instead of failing; one that could never fit fails at once. Without this, four KernelBench
ops of 48 GiB each checked the device's free memory at the same moment on an H100 and three
failed "over 90% of the 4.42 GiB free" although each fits the card alone.

Reservations live in one small JSON file per device under the temporary folder, guarded by
an advisory lock; a reservation ends with its process (dead pids are dropped), so a killed
job holds nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from farm.procs import pid_alive

POLL_S = 0.5


class DoesNotFit(Exception):
    """The need exceeds what the device can ever give (`never`), or what it had free after
    waiting `waited_s` for other jobs' reservations to end."""

    def __init__(self, message: str, never: bool):
        super().__init__(message)
        self.never = never


def _path(device: str) -> Path:
    masked = os.environ.get("CUDA_VISIBLE_DEVICES", "") + os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "")
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{device}-{masked}")
    return Path(tempfile.gettempdir()) / f"farm-devmem-{os.getuid()}-{name}.json"


@contextmanager
def _locked(path: Path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # closing drops the lock


def _read(fd: int) -> dict[int, int]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 1 << 20)
    try:
        held = {int(pid): int(n) for pid, n in json.loads(raw or b"{}").items()}
    except (ValueError, AttributeError, TypeError):
        held = {}  # a damaged file holds nothing worth waiting for
    return {pid: n for pid, n in held.items() if pid != os.getpid() and pid_alive(pid)}


def _write(fd: int, held: dict[int, int]) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps({str(k): v for k, v in held.items()}).encode())



def reserve(device: str, need: int, free_total, headroom: float, wait_s: float, release=None) -> None:
    """Reserve `need` bytes of `device` for this process until it exits. `free_total()` gives
    the device's (free, total) bytes now; at most `headroom` of either may be taken.
    `release()` hands this process's cached, unused device memory back before each look: a
    job waiting while its allocator keeps freed blocks makes the others wait for it."""
    path = _path(device)
    deadline = time.monotonic() + wait_s
    while True:
        if release is not None:
            release()
        free, total = free_total()
        if need > total * headroom:
            raise DoesNotFit(f"over {headroom:.0%} of the device's {total / 2**30:.2f} GiB", never=True)
        with _locked(path) as fd:
            others = _read(fd)
            if need <= free * headroom and sum(others.values()) + need <= total * headroom:
                _write(fd, {**others, os.getpid(): need})
                return
            if not others:
                raise DoesNotFit(f"over {headroom:.0%} of the {free / 2**30:.2f} GiB free (other processes hold "
                                 "the rest)", never=False)
        if time.monotonic() > deadline:
            raise DoesNotFit(f"over {headroom:.0%} of the {free / 2**30:.2f} GiB free after waiting {wait_s:.0f} s "
                             f"for {len(others)} other job(s) of this host holding {sum(others.values()) / 2**30:.2f} GiB",
                             never=False)
        time.sleep(POLL_S)
