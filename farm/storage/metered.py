"""A Store that counts what passes through it (farm.observe.metrics): bytes and objects moved each way,
by kind of object (reference data, run documents, other), and operations that failed.
open_store wraps every backend in it, so the counts hold for file:// and s3:// alike."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from farm.errors import StorageError
from farm.observe import metrics
from farm.storage.base import ObjectInfo, Store


class MeteredStore(Store):
    def __init__(self, inner: Store, backend: str):
        self.inner = inner
        self.backend = backend
        self.url = inner.url

    def __getattr__(self, name: str) -> Any:
        # backend-specific extras (conditional_writes, root, ...) pass through uncounted
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"MeteredStore({self.inner!r})"

    def require_present(self, named: str = "store") -> None:
        self.inner.require_present(named)

    def _call(self, operation: str, fn: Callable, *args):
        try:
            return fn(*args)
        except StorageError:
            metrics.STORAGE_ERRORS.labels(self.backend, operation).inc()
            raise

    def _moved(self, direction: str, key: str, size: int) -> None:
        kind = metrics.object_kind(key)
        metrics.STORAGE_BYTES.labels(self.backend, direction, kind).inc(size)
        metrics.STORAGE_OBJECTS.labels(self.backend, direction, kind).inc()

    def put_file(self, key: str, path: Path, sha256: str | None = None) -> ObjectInfo:
        info = self._call("put", self.inner.put_file, key, path, sha256)
        self._moved("put", key, info.size)
        return info

    def get_file(self, key: str, dest: Path) -> ObjectInfo:
        info = self._call("get", self.inner.get_file, key, dest)
        self._moved("get", key, info.size)
        return info

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        info = self._call("put", self.inner.put_bytes, key, data)
        self._moved("put", key, len(data))
        return info

    def get_bytes(self, key: str) -> bytes:
        data = self._call("get", self.inner.get_bytes, key)
        self._moved("get", key, len(data))
        return data

    def head(self, key: str) -> ObjectInfo | None:
        return self._call("head", self.inner.head, key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self._call("list", lambda: list(self.inner.list(prefix)))

    def verify(self, key: str) -> str:
        return self._call("verify", self.inner.verify, key)

    def delete(self, key: str) -> None:
        self._call("delete", self.inner.delete, key)

    def update_json(self, key: str, mutate: Callable[[dict], dict]) -> dict:
        return self._call("update", self.inner.update_json, key, mutate)
