"""Folders the user names (`farm fetch --out`, `farm export --out`, `farm report --out`, `farm
cache pull --to`, `farm reference --output-dir`): the farm writes there only what it owns.

A marker file in the folder, `.kfarm-owned.json`, lists every file the farm wrote there with
its sha256. From it follow the three rules every such command keeps:

- a folder that is not empty and has no marker is someone else's: refused unless `--force`
  (then the farm writes beside what is there);
- a file the marker does not list is never replaced or deleted: a write that would land on one
  fails, naming it, before anything is written (`install`) or at that file (`Owned.check`);
- a re-write deletes only files of the earlier write it does not write again, and only while
  they still hold the bytes the farm wrote (a file the user edited is theirs now).

Two ways to use it: a command that builds its output in one go writes it to a staging folder
and `install`s it (collisions are found before any file moves); a store kept in a folder
(open_folder) calls `check` before and `record` after each object it writes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from farm.errors import FarmError
from farm.storage.base import sha256_file

MARKER = ".kfarm-owned.json"


class ForeignFile(FarmError):
    """A file the farm did not write lies where it would write."""


def _listing(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink())


class Owned:
    """The farm's files in one folder the user named (`option` names it in messages)."""

    def __init__(self, folder: Path, option: str, force: bool = False):
        self.folder = Path(folder).expanduser()
        self.option = option
        self._lock = threading.Lock()  # reference jobs write from threads
        if self.folder.exists() and not self.folder.is_dir():
            raise FarmError(f"{self.folder} ({option}) is a file, not a folder")
        self.files: dict[str, str] = self._read_marker()
        if not self.files and not (self.folder / MARKER).exists():
            theirs = _listing(self.folder)
            if theirs and not force:
                shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
                raise FarmError(
                    f"{self.folder} ({option}) is not empty and was not written by farm (no {MARKER}; it holds "
                    f"{shown}): choose an empty or new folder, or give --force to write beside those files "
                    "(farm never replaces or deletes a file it did not write)")

    def _read_marker(self) -> dict[str, str]:
        path = self.folder / MARKER
        try:
            doc = json.loads(path.read_text())
        except (FileNotFoundError, NotADirectoryError):
            return {}  # a new folder (or one under a file: writing it says so)
        except OSError as exc:
            raise FarmError(f"cannot read {path} ({self.option}): {exc.strerror or exc}") from None
        except ValueError as exc:
            raise FarmError(f"{path} is damaged ({exc}): farm cannot tell its files from yours; delete {path} "
                            f"and write again with --force (files of yours are kept)") from None
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, dict):
            raise FarmError(f"{path} is damaged (no 'files' mapping): delete it and write again with --force")
        return {str(k): str(v) for k, v in files.items()}

    def _save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        doc = {"written_by": "farm", "files": dict(sorted(self.files.items()))}
        fd, tmp = tempfile.mkstemp(prefix=f"{MARKER}.", suffix=".tmp", dir=self.folder)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, self.folder / MARKER)

    def foreign(self, rel: str) -> bool:
        """Whether a file of someone else's lies at `rel`."""
        path = self.folder / rel
        return (path.exists() or path.is_symlink()) and rel not in self.files

    def check(self, path: Path) -> None:
        """Before writing `path` (inside the folder): refuse a file the farm did not write."""
        rel = Path(path).relative_to(self.folder).as_posix()
        if rel != MARKER and self.foreign(rel):
            raise ForeignFile(self._foreign_message([rel]))

    def record(self, path: Path) -> None:
        """After writing `path`: it is the farm's, with these bytes."""
        rel = Path(path).relative_to(self.folder).as_posix()
        with self._lock:
            self.files[rel] = sha256_file(self.folder / rel)
            self._save()

    def forget(self, path: Path) -> None:
        rel = Path(path).relative_to(self.folder).as_posix()
        with self._lock:
            if self.files.pop(rel, None) is not None:
                self._save()

    def _foreign_message(self, rels: list[str]) -> str:
        more = f" and {len(rels) - 3} more" if len(rels) > 3 else ""
        shown = ", ".join(str(self.folder / r) for r in rels[:3]) + more
        return (f"{shown} {'was' if len(rels) == 1 else 'were'} not written by farm ({self.folder / MARKER} does not "
                f"list {'it' if len(rels) == 1 else 'them'}): farm does not replace a file of yours; move it away or "
                f"choose another folder ({self.option})")

    def _unchanged(self, rel: str) -> bool:
        path = self.folder / rel
        try:
            return path.is_file() and not path.is_symlink() and sha256_file(path) == self.files[rel]
        except OSError:
            return False

    def install(self, staging: Path) -> list[str]:
        """Move every file of `staging` into the folder: first refuse if any would replace a
        file the farm did not write, then drop the earlier write's files not written again
        (unless edited since), then move. Returns what it kept of the earlier write (edited)."""
        new = _listing(staging)
        clash = [rel for rel in new if self.foreign(rel)]
        if clash:
            raise ForeignFile(self._foreign_message(clash))
        kept = []
        for rel in sorted(set(self.files) - set(new)):
            if self._unchanged(rel):
                (self.folder / rel).unlink()
                _drop_empty_parents(self.folder, (self.folder / rel).parent)
            elif (self.folder / rel).exists():
                kept.append(rel)
            self.files.pop(rel)
        for rel in new:
            dest = self.folder / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_dir() and not dest.is_symlink():
                raise ForeignFile(self._foreign_message([rel]))
            os.replace(staging / rel, dest)
            self.files[rel] = sha256_file(dest)
        self._save()
        return kept

    @contextmanager
    def staged(self) -> Iterator[Path]:
        """A staging folder beside the target (same file system, so files move by rename),
        installed when the block ends without error and removed either way."""
        parent = self.folder.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{self.folder.name}.kfarm-", dir=parent))
        except OSError as exc:
            raise FarmError(f"cannot write to {self.folder} ({self.option}): {exc.strerror or exc}") from None
        try:
            yield staging
            self.install(staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _drop_empty_parents(root: Path, folder: Path) -> None:
    """Folders the farm emptied go too; a folder holding anything of the user's stays."""
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


@contextmanager
def writing(folder: Path, option: str, force: bool = False) -> Iterator[Path]:
    """Write a command's whole output under the returned staging folder; on success it replaces
    the farm's earlier output in `folder` and nothing else (see the module's rules)."""
    with Owned(folder, option, force).staged() as staging:
        yield staging
