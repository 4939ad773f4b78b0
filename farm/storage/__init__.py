"""Storage: one interface (`Store`), two backends chosen by URL.

    file:///path          FileStore (default ~/.farm/store)
    s3://bucket/prefix    S3Store (boto3; any S3-compatible server)
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

from farm.config import Settings
from farm.errors import FarmError
from farm.storage.base import ObjectInfo, Store, validate_key
from farm.storage.local import FileStore
from farm.storage.metered import MeteredStore
from farm.storage.owned import Owned

__all__ = ["ObjectInfo", "Store", "open_store", "open_folder", "validate_key"]


def open_store(url: str, settings: Settings | None = None) -> Store:
    """The store at `url`, counted in the storage metrics (farm.storage.metered)."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        path = (parsed.netloc + parsed.path) if parsed.netloc not in ("", "localhost") else parsed.path
        return MeteredStore(FileStore(Path(path).expanduser()), "file")
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise FarmError(f"store URL {url!r} names no bucket (s3://bucket/prefix)")
        from farm.storage.s3 import S3Store  # boto3 is an optional dependency

        return MeteredStore(S3Store(parsed.netloc, parsed.path.strip("/"), (settings or Settings()).s3), "s3")
    if parsed.scheme == "" and url:
        if _looks_like_url(url):
            raise FarmError(f"store URL {url!r} (--store) is neither a URL nor a folder: did you mean "
                            f"{url.replace('//', '://', 1)!r}? (file:///path or s3://bucket/prefix)")
        return MeteredStore(FileStore(Path(url).expanduser()), "file")
    raise FarmError(f"unsupported store URL {url!r} (--store): use file:///path or s3://bucket/prefix")


def _looks_like_url(text: str) -> bool:
    """`s3//bucket`, `http//host`: a URL missing its colon would otherwise become a relative
    folder in the current directory and fill up unnoticed."""
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*//", text))


# Where a reference folder keeps the secret input sets of reference-data-mode ops: a hidden
# folder, which the existing tools' loaders (they read <dir>/<source>/*.pt) never list.
FOLDER_SECRETS = ".secrets/"


def open_folder(path: str | Path, write_as: str | None = None, force: bool = False) -> FileStore:
    """A plain reference-cache folder as the existing tool chain lays it out:
    <dir>/<source>/<op>.pt and <dir>/manifest.json, seen as the store's refs/, plus the store's
    secrets/ in <dir>/.secrets/, and nothing else written there. `write_as` (the option that
    named it) opens it to be written: only files the farm wrote there change, and a non-empty
    folder the farm did not write needs `force` (farm.storage.owned)."""
    folder = Path(path).expanduser()
    return FileStore(folder, strip_prefix="refs/", sidecars=False, hidden={"secrets/": FOLDER_SECRETS},
                     owned=Owned(folder, write_as, force) if write_as else None)
