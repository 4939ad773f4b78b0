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
from typing import Any, BinaryIO, Callable, Iterator

from farm.errors import IntegrityError, StorageError
from farm.storage.base import ObjectInfo, Store, dump_json, sha256_stream, validate_key, write_error
from farm.storage.owned import Owned

META_DIR = ".farm-meta"
READ_ATTEMPTS = 5  # reads of one object overtaken by concurrent replacements before it is called corrupt


class _Overtaken(Exception):
    """The object changed while it was read (or it is corrupt): read again."""


class FileStore(Store):
    def __init__(self, root: Path, strip_prefix: str = "", sidecars: bool = True,
                 hidden: dict[str, str] | None = None, owned: Owned | None = None):
        self.root = Path(root)
        # a folder the user named to be written (farm.storage.owned): only the farm's files change
        self.owned = owned
        self.strip_prefix = strip_prefix
        # key prefixes kept in hidden folders of a plain folder ({"secrets/": ".secrets/"}):
        # tools that read the folder's layout never list them, and a copy of the folder keeps them
        self.hidden = dict(hidden or {})
        # False for a plain folder in another tool's layout: nothing but the objects is written
        # there (no .farm-meta/; sha256s live in its manifest, locks on the folder itself)
        self.sidecars = sidecars
        self.url = f"file://{self.root}"

    # ------------------------------------------------------------ paths

    def _rel(self, key: str) -> str:
        validate_key(key)
        for prefix, folder in self.hidden.items():
            if key.startswith(prefix):
                return folder + key[len(prefix):]
        if self.strip_prefix:
            if not key.startswith(self.strip_prefix):
                kept = ", ".join([self.strip_prefix, *self.hidden])
                raise StorageError(f"{self.root} holds only {kept}* keys, not {key!r}")
            key = key[len(self.strip_prefix):]
        return key

    def require_present(self, named: str = "store") -> None:
        if self.root.is_file():
            raise StorageError(f"store {self.url} ({named}) is a file, not a folder")
        if not self.root.is_dir():
            raise StorageError(f"store {self.url} ({named}) does not exist: nothing to read there (`farm reference` "
                               "or `farm run` makes one; --store names another)")

    def path_of(self, key: str) -> Path:
        """Where the object of `key` lives on disk."""
        return self._path(key)

    def describe(self, key: str) -> str:
        return str(self._path(key)) if self.strip_prefix else f"{self.url}/{key}"

    def _path(self, key: str) -> Path:
        return self.root / self._rel(key)

    def _meta_path(self, key: str) -> Path:
        return self.root / META_DIR / (self._rel(key) + ".json")

    def _key(self, rel: str) -> str | None:
        """The key of a file under the root; None for hidden files that hold no object."""
        for prefix, folder in self.hidden.items():
            if rel.startswith(folder):
                rel, key_prefix = rel[len(folder):], prefix
                break
        else:
            key_prefix = self.strip_prefix
        if any(part.startswith(".") for part in rel.split("/")):
            return None
        return key_prefix + rel

    # ------------------------------------------------------------ writes

    @staticmethod
    def _atomic_write(target: Path, write: Callable[[BinaryIO], object],
                      before_replace: Callable[[], None] | None = None) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            if before_replace is not None:
                before_replace()
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _write_meta(self, key: str, sha: str, size: int, replacing: str | None = None) -> None:
        if not self.sidecars:
            return
        meta = {"sha256": sha, "size": size}
        if replacing and replacing != sha:
            meta["replacing"] = replacing
        data = json.dumps(meta).encode()
        self._atomic_write(self._meta_path(key), lambda f: f.write(data))

    def _read_meta(self, key: str) -> dict:
        try:
            return json.loads(self._meta_path(key).read_text())
        except (OSError, ValueError):
            return {}

    def _put(self, key: str, write: Callable[[BinaryIO], tuple[str, int]], expect_sha: str | None, what: str) -> ObjectInfo:
        """Data and its sha256 live in two files, so the switch happens in three steps: the sidecar
        first accepts the old and the new sha256, then the data is renamed into place, then the
        sidecar names only the new one. A reader, or a process killed at any step, never sees
        whole data that its sidecar rejects."""
        target = self._path(key)
        if self.owned is not None:
            self.owned.check(target)
        holder: dict = {}

        def copy(dst):
            holder["sha"], holder["size"] = write(dst)

        def switch():
            if expect_sha and holder["sha"] != expect_sha:
                raise IntegrityError(f"{what} changed while it was stored (sha256 {holder['sha']} != {expect_sha})")
            self._write_meta(key, holder["sha"], holder["size"], replacing=self._read_meta(key).get("sha256"))

        try:
            self._atomic_write(target, copy, before_replace=switch)
            self._write_meta(key, holder["sha"], holder["size"])
            if self.owned is not None:
                self.owned.record(target)
        except OSError as exc:
            raise write_error(str(target), exc) from exc
        return ObjectInfo(key, holder["size"], holder["sha"])

    def put_file(self, key: str, path: Path, sha256: str | None = None) -> ObjectInfo:
        try:
            with open(path, "rb") as src:
                return self._put(key, lambda dst: sha256_stream(src, dst), sha256, str(path))
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        import hashlib

        def write(dst):
            dst.write(data)
            return hashlib.sha256(data).hexdigest(), len(data)

        return self._put(key, write, None, key)

    def create_only(self, key: str, data: bytes) -> bool:
        """O_EXCL: of two processes creating the same file, exactly one succeeds."""
        import hashlib

        target = self._path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as exc:
            raise write_error(str(target), exc) from exc
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self._write_meta(key, hashlib.sha256(data).hexdigest(), len(data))
        return True

    def delete(self, key: str) -> None:
        if self.owned is not None:
            self.owned.check(self._path(key))
            self.owned.forget(self._path(key))
        self._path(key).unlink(missing_ok=True)
        self._meta_path(key).unlink(missing_ok=True)

    # ------------------------------------------------------------ reads

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        if not path.is_file():
            return None
        return ObjectInfo(key, path.stat().st_size, self._read_meta(key).get("sha256"))

    def _accepted(self, key: str) -> set[str] | None:
        meta = self._read_meta(key)
        return {meta["sha256"], meta.get("replacing")} - {None} if meta.get("sha256") else None

    def _read_checked(self, key: str, read: Callable[[], Any]) -> Any:
        """read() returns (sha256, value). The sidecar is read before and after the data: a reader
        that overlaps one replacement sees data one of them accepts; one that a burst of writers
        overtakes reads again (a few times) before it calls the object corrupt."""
        self._expect(key)
        for _ in range(READ_ATTEMPTS):
            before = self._accepted(key)
            sha, value = read()
            after = self._accepted(key)
            if before is None or after is None or sha in before | after:
                return value
        assert after is not None  # every attempt that ends the loop read a recorded set
        raise IntegrityError(f"{self.describe(key)} is corrupt: sha256 {sha} != recorded {sorted(after)[0]}")

    def _expect(self, key: str) -> ObjectInfo:
        info = self.head(key)
        if info is None:
            raise StorageError(f"{self.url}: no object {key}")
        return info

    def get_file(self, key: str, dest: Path) -> ObjectInfo:
        """As _read_checked, with the check before the copy replaces `dest`: a corrupt object is
        never written out."""
        self._expect(key)
        for _ in range(READ_ATTEMPTS):
            before, holder = self._accepted(key), dict[str, Any]()

            def copy(dst, holder=holder):
                with open(self._path(key), "rb") as src:
                    holder["sha"], holder["size"] = sha256_stream(src, dst)

            def gate(holder=holder, before=before):
                holder["after"] = after = self._accepted(key)
                if not (before is None or after is None or holder["sha"] in before | after):
                    raise _Overtaken

            try:
                self._atomic_write(Path(dest), copy, before_replace=gate)
            except _Overtaken:
                continue
            except OSError as exc:  # the local copy: a full temp folder is the machine's failure
                raise write_error(str(dest), exc) from exc
            return ObjectInfo(key, holder["size"], holder["sha"])
        raise IntegrityError(f"{self.describe(key)} is corrupt: sha256 {holder['sha']} != recorded "
                             f"{sorted(holder['after'])[0]}")

    def get_bytes(self, key: str) -> bytes:
        import hashlib

        def read():
            data = self._path(key).read_bytes()
            return hashlib.sha256(data).hexdigest(), data

        return self._read_checked(key, read)

    def verify(self, key: str) -> str:
        def read():
            with open(self._path(key), "rb") as f:
                sha, _ = sha256_stream(f)
            return sha, sha

        return self._read_checked(key, read)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        start = self._list_root(prefix)
        if start is None or not start.is_dir():
            return
        for path in sorted(start.rglob("*")):
            key = self._key(path.relative_to(self.root).as_posix())
            if not path.is_file() or key is None:
                continue
            if key.startswith(prefix):
                info = self.head(key)
                if info is not None:
                    yield info

    def _list_root(self, prefix: str) -> Path | None:
        """The deepest folder that holds every key under `prefix`: a listing of one run walks
        that run's folder, not the whole store. None where no key can match."""
        hidden = next((f + prefix[len(k):] for k, f in self.hidden.items() if prefix.startswith(k)), None)
        if hidden is not None:
            rel = hidden
        elif not prefix.startswith(self.strip_prefix) and not self.strip_prefix.startswith(prefix):
            return None
        else:
            rel = prefix[len(self.strip_prefix):] if prefix.startswith(self.strip_prefix) else ""
        folder = rel.rpartition("/")[0]
        if folder and any(seg in ("", ".", "..") for seg in folder.split("/")):
            return self.root
        return self.root / folder if folder else self.root

    # ------------------------------------------------------------ JSON documents

    @contextmanager
    def _lock(self, key: str):
        if not self.sidecars:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root, os.O_RDONLY)  # flock works on a directory's descriptor
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        lock_path = self.root / META_DIR / (self._rel(key) + ".lock")
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            f = open(lock_path, "a+")  # noqa: SIM115 - opened apart, so its OSError gets a message
        except OSError as exc:
            raise write_error(f"{self.url} (lock file {lock_path})", exc) from None
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def update_json(self, key: str, mutate: Callable[[dict], dict]) -> dict:
        if self.owned is not None:  # before reading it: a file of someone else's is not ours to parse
            self.owned.check(self._path(key))
        with self._lock(key):
            current = self.read_json(key)
            new = mutate(current)
            self.put_bytes(key, dump_json(new))
            return new


