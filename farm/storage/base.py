"""The storage interface every backend implements, and the rules they share.

- Objects are written whole: a reader sees the old object or the new one, never a part.
- Every object carries the sha256 of its bytes, and every read verifies it.
- Keys are relative, '/'-separated, and cannot leave the store's prefix.
- JSON documents that several writers update (the manifest) change only through
  `update_json`, which merges under a compare-and-swap or a lock.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from farm.errors import IntegrityError, InvalidName, StorageError

CHUNK = 8 * 1024 * 1024  # bytes per read when streaming
_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # a leading "_": op names such as _compute_pid


def validate_key(key: str) -> str:
    """A key is segments of safe characters: no '..', no absolute path, no odd bytes."""
    if not isinstance(key, str) or not key or key.startswith("/") or len(key) > 1024:
        raise InvalidName(f"invalid storage key {key!r}")
    for seg in key.split("/"):
        if not _SEGMENT.match(seg) or seg in (".", "..") or ".." in seg:
            raise InvalidName(f"invalid storage key {key!r}: segment {seg!r}")
    return key


# The machine's, not the data's: the same write may well succeed on the next run.
TRANSIENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET,
                    errno.ESTALE, errno.EINTR}


def write_error(where: str, exc: OSError) -> StorageError:
    """An OSError from writing `where` as the StorageError the callers handle."""
    return StorageError(f"cannot write {where}: {exc.strerror or exc}", transient=exc.errno in TRANSIENT_ERRNOS)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_stream(stream: BinaryIO, sink: BinaryIO | None = None) -> tuple[str, int]:
    """Hash a stream chunk by chunk, optionally copying it; memory stays at one chunk."""
    h = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK):
        h.update(chunk)
        size += len(chunk)
        if sink is not None:
            sink.write(chunk)
    return h.hexdigest(), size


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    sha256: str | None  # as recorded when written; None for objects written by others


class Store(ABC):
    url: str

    @abstractmethod
    def put_file(self, key: str, path: Path, sha256: str | None = None) -> ObjectInfo:
        """Upload a local file whole, with its sha256 recorded (computed if not given)."""

    @abstractmethod
    def get_file(self, key: str, dest: Path) -> ObjectInfo:
        """Download to `dest` (atomically) after verifying the sha256; raises IntegrityError
        and leaves `dest` untouched if the bytes do not match."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Size and recorded sha256, or None if the object does not exist."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects under a key prefix (sha256 may be None where a listing cannot say)."""

    @abstractmethod
    def verify(self, key: str) -> str:
        """Re-read the object, streaming, and check it; returns the sha256 or raises."""

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> ObjectInfo: ...

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Small objects only (JSON documents); verified like every read."""

    @abstractmethod
    def update_json(self, key: str, mutate: Callable[[dict], dict]) -> dict:
        """Read-modify-write a JSON document so that concurrent writers all land:
        `mutate` gets the current document ({} if none) and returns the new one; it may be
        called more than once when another writer got in first."""

    def create_only(self, key: str, data: bytes) -> bool:
        """Write `data` only if no object `key` exists; False if one does (locks: farm.storage.locks).
        Backends make it atomic; this fallback is a check, then a write."""
        if self.head(key) is not None:
            return False
        self.put_bytes(key, data)
        return True

    def read_json(self, key: str) -> dict:
        if self.head(key) is None:
            return {}
        return parse_json(self.describe(key), self.get_bytes(key))

    def describe(self, key: str) -> str:
        """Where the object of `key` is, for messages."""
        return f"{self.url}/{key}"

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def require_present(self, named: str = "store") -> None:
        """For commands that only read: the store itself is there (a missing one would read as
        empty, and a typo in its URL as a green "0 objects"). `named` says where its URL came from.
        A store that cannot be missing (S3's bucket is checked on first use) has nothing to do."""
        return None


def parse_json(where: str, data: bytes) -> dict:
    """A stored JSON document, or IntegrityError naming it: a truncated or hand-edited
    document must stop its readers with a message, not a traceback."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{where} is corrupt: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise IntegrityError(f"{where} is corrupt: a JSON {type(doc).__name__}, not an object")
    return doc


def dump_json(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n").encode()
