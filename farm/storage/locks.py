"""One writer at a time: the writer lock, an object in the store, for a run (runs/<run>/writer.lock)
and for a store's kernels of an op (kernels/<target>/<source>/<op>/writer.lock).

The lock is a small JSON document created only if absent: O_CREAT|O_EXCL on a file store, a PUT
with If-None-Match: * on S3 (where the server ignores that header, a check before the write:
best effort, as Store.update_json's fallback). It names its holder (host, pid, started at) and
is refreshed by a heartbeat while held, so that:

- a second writer waits `wait_s`, then fails naming the holder and how to clear the lock;
- a holder that died is taken over: at once where it ran on this host and its pid is gone,
  else once its heartbeat is older than `STALE_S` (a crashed machine does not block forever).

Taking over a stale lock deletes it and creates ours; two processes taking over the same stale
lock in the same instant can both succeed on a store without compare-and-delete (a narrow
window: the heartbeat of the loser finds the lock is not its own and says so in the log).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

from farm.errors import FarmError, StorageError
from farm.storage.base import Store, dump_json

log = logging.getLogger(__name__)

STALE_S = 120.0  # a lock whose heartbeat is older than this is a dead holder's
HEARTBEAT_S = 20.0
LOCK_NAME = "writer.lock"


class Locked(FarmError):
    """Another process writes what this one was about to write."""


def run_lock_key(run: str) -> str:
    return f"runs/{run}/{LOCK_NAME}"


def kernel_lock_key(prefix: str) -> str:
    return f"{prefix}/{LOCK_NAME}"


def _alive_here(holder: dict) -> bool | None:
    """Whether the holder's process runs: None where it cannot be told (another host)."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return None
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(holder: dict, now: float | None = None) -> bool:
    """A dead process's lock, or one whose heartbeat stopped (a crashed host; a pid of this host
    reused by another process)."""
    if _alive_here(holder) is False:
        return True
    beat = holder.get("heartbeat_at")
    return not isinstance(beat, (int, float)) or (now or time.time()) - beat > STALE_S


def describe(holder: dict) -> str:
    return (f"{holder.get('what', 'a writer')} by pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
            f"started at {holder.get('started_at', '?')}")


class WriterLock:
    def __init__(self, store: Store, key: str, what: str, wait_s: float = 5.0):
        self.store, self.key, self.what, self.wait_s = store, key, what, wait_s
        self.token = uuid.uuid4().hex
        self.doc = {"what": what, "host": socket.gethostname(), "pid": os.getpid(), "token": self.token,
                    "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _data(self) -> bytes:
        return dump_json({**self.doc, "heartbeat_at": time.time()})

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.store.get_bytes(self.key))
        except StorageError:
            return None if self.store.head(self.key) is None else {}
        except ValueError:
            return {}  # a lock cut short: its writer died while writing it

    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            if self.store.create_only(self.key, self._data()):
                break
            holder = self._holder()
            if holder is not None and is_stale(holder):
                log.warning("taking over the stale lock %s (%s)", self.store.describe(self.key), describe(holder))
                self.store.delete(self.key)
                continue
            if time.monotonic() >= deadline:
                raise Locked(f"{self.what} is being written by another process ({describe(holder or {})}; lock "
                             f"{self.store.describe(self.key)}): wait for it to finish, or if that process is gone "
                             f"and the lock was left behind, delete {self.store.describe(self.key)} (it is taken "
                             f"over by itself once its heartbeat is {STALE_S:.0f} s old)")
            time.sleep(min(0.5, max(0.05, deadline - time.monotonic())))
        self._beat = threading.Thread(target=self._heartbeat, name=f"lock-{self.key}", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if (self._holder() or {}).get("token") != self.token:
                    log.warning("lost the lock %s to another writer", self.store.describe(self.key))
                    return
                self.store.put_bytes(self.key, self._data())
            except FarmError as exc:  # a store of the moment: the next beat tries again
                log.warning("heartbeat of %s: %s", self.key, exc)

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        try:
            if (self._holder() or {}).get("token") == self.token:
                self.store.delete(self.key)
        except FarmError as exc:  # left behind, it is taken over once stale
            log.warning("could not release %s: %s", self.key, exc)


@contextmanager
def held(store: Store, key: str, what: str, wait_s: float = 5.0) -> Iterator[WriterLock]:
    lock = WriterLock(store, key, what, wait_s)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
