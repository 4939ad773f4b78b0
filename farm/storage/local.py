"""file:// store: a folder on a local or shared file system.

Each object is a plain file at <root>/<key>, so a reference folder stays readable by tools
that know nothing of the farm; its sha256 and size sit beside it in <root>/.farm-meta/.
Writes go to a temporary file in the same folder, are fsynced, then renamed over the
target: readers never see half an object. JSON updates take an flock on a lock file.
"""

from __future__ import annotations

import fcntl
import json
import os

import tempfile

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from farm.errors import IntegrityError, StorageError
from farm.storage.base import ObjectInfo, Store, dump_json, sha256_stream, validate_key

META_DIR = ".farm-meta"


class FileStore(Store):
    def __init__(self, root: Path, strip_prefix: str = ""):
        self.root = Path(root)
        self.strip_prefix = strip_prefix
        self.url = f"file://{self.root}"

    # ------------------------------------------------------------ paths

    def _rel(self, key: str) -> str:
        validate_key(key)
        if self.strip_prefix:
            if not key.startswith(self.strip_prefix):
                raise StorageError(f"{self.root} holds only {self.strip_prefix}* keys, not {key!r}")
            key = key[len(self.strip_prefix):]
        return key

    def _path(self, key: str) -> Path:
        return self.root / self._rel(key)

    def _meta_path(self, key: str) -> Path:
        return self.root / META_DIR / (self._rel(key) + ".json")

    def _key(self, rel: str) -> str:
        return self.strip_prefix + rel

    # ------------------------------------------------------------ writes

    @staticmethod
    def _atomic_write(target: Path, write: Callable[[object], None]) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _write_meta(self, key: str, sha: str, size: int) -> None:
        data = json.dumps({"sha256": sha, "size": size}).encode()
        self._atomic_write(self._meta_path(key), lambda f: f.write(data))

    def put_file(self, key: str, path: Path, sha256: str | None = None) -> ObjectInfo:
        target = self._path(key)
        try:
            with open(path, "rb") as src:
                holder = {}

                def copy(dst):
                    holder["sha"], holder["size"] = sha256_stream(src, dst)

                self._atomic_write(target, copy)
        except OSError as exc:
            raise StorageError(f"cannot write {target}: {exc}") from exc
        if sha256 and holder["sha"] != sha256:
            target.unlink(missing_ok=True)
            raise IntegrityError(f"{path} changed while it was stored (sha256 {holder['sha']} != {sha256})")
        self._write_meta(key, holder["sha"], holder["size"])
        return ObjectInfo(key, holder["size"], holder["sha"])

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        import hashlib

        target = self._path(key)
        try:
            self._atomic_write(target, lambda f: f.write(data))
        except OSError as exc:
            raise StorageError(f"cannot write {target}: {exc}") from exc
        sha = hashlib.sha256(data).hexdigest()
        self._write_meta(key, sha, len(data))
        return ObjectInfo(key, len(data), sha)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
        self._meta_path(key).unlink(missing_ok=True)

    # ------------------------------------------------------------ reads

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        if not path.is_file():
            return None
        sha = None
        try:
            meta = json.loads(self._meta_path(key).read_text())
            sha = meta.get("sha256")
        except (OSError, ValueError):
            pass
        return ObjectInfo(key, path.stat().st_size, sha)

    def _expect(self, key: str) -> ObjectInfo:
        info = self.head(key)
        if info is None:
            raise StorageError(f"{self.url}: no object {key}")
        return info

    def get_file(self, key: str, dest: Path) -> ObjectInfo:
        info = self._expect(key)
        holder = {}

        def copy(dst):
            with open(self._path(key), "rb") as src:
                holder["sha"], holder["size"] = sha256_stream(src, dst)
            if info.sha256 and holder["sha"] != info.sha256:
                raise IntegrityError(f"{self.url}/{key} is corrupt: sha256 {holder['sha']} != recorded {info.sha256}")

        self._atomic_write(Path(dest), copy)
        return ObjectInfo(key, holder["size"], holder["sha"])

    def get_bytes(self, key: str) -> bytes:
        import hashlib

        info = self._expect(key)
        data = self._path(key).read_bytes()
        if info.sha256 and hashlib.sha256(data).hexdigest() != info.sha256:
            raise IntegrityError(f"{self.url}/{key} is corrupt: its sha256 does not match the recorded one")
        return data

    def verify(self, key: str) -> str:
        info = self._expect(key)
        with open(self._path(key), "rb") as f:
            sha, _ = sha256_stream(f)
        if info.sha256 and sha != info.sha256:
            raise IntegrityError(f"{self.url}/{key} is corrupt: sha256 {sha} != recorded {info.sha256}")
        return sha

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if not self.root.is_dir():
            return
        for path in sorted(self.root.rglob("*")):
            rel = path.relative_to(self.root).as_posix()
            if not path.is_file() or any(part.startswith(".") for part in rel.split("/")):
                continue
            key = self._key(rel)
            if key.startswith(prefix):
                info = self.head(key)
                if info is not None:
                    yield info

    # ------------------------------------------------------------ JSON documents

    @contextmanager
    def _lock(self, key: str):
        lock_path = self.root / META_DIR / (self._rel(key) + ".lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def update_json(self, key: str, mutate: Callable[[dict], dict]) -> dict:
        with self._lock(key):
            current = self.read_json(key)
            new = mutate(current)
            self.put_bytes(key, dump_json(new))
            return new


