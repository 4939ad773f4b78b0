"""A reference folder as it arrives on the target host, read in place (no push step):

    <dir>/<source>/<op>.pt             the existing tools' layout (their loaders glob these)
    <dir>/manifest.json                one entry per source/op, with the sha256 of the .pt and
                                       of its secret input sets (seed_sets_sha256)
    <dir>/.secrets/<source>/<op>.pt    secret input sets of reference-data-mode ops

Everything is checked before a search trusts it: the .pt against the manifest, the secret input sets
against the sha256 the .pt records (and the manifest's). A mismatch (a copy of another
version, a truncated file, a copy that left the hidden folder behind) is an error that names
the file and the repair; nothing is rewritten here. A .pt that records no secret input sets (the
existing tools' generator made it) loads without them: the evaluator then checks on the .pt
alone and says so (farm.evaluate.verified).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.corpus.tasks import natural_sorted, validate_name
from farm.errors import FarmError, IntegrityError
from farm.reference import cases as ref_cases
from farm.reference import manifest, secret_inputs
from farm.reference.generate import load_pt
from farm.storage import FOLDER_SECRETS, Store, open_folder
from farm.storage.base import sha256_file


@dataclass(frozen=True)
class FolderOp:
    """One op a folder holds, or names in its manifest without holding it (`problem`)."""

    source: str
    op: str
    pt: Path
    problem: str = ""

    @property
    def key(self) -> str:
        return f"{self.source}/{self.op}"


def folder_of(pt: Path) -> Path | None:
    """The reference folder a .pt lies in (<dir>/<source>/<op>.pt), where <dir> shows it is one."""
    folder = pt.resolve().parent.parent
    return folder if (folder / "manifest.json").is_file() or (folder / FOLDER_SECRETS).is_dir() else None


def _regenerate(folder: Path, source: str | None, op: str | None) -> str:
    return f"`farm reference --source {source} --ops {op} --output-dir {folder} --force`"


def _entries(folder: Path) -> dict[str, dict]:
    """The farm manifest's entries (the existing tools' manifest has none: their .pt are unlisted)."""
    return manifest.entries(open_folder(folder))


def expected_sha(entry: dict | None) -> str | None:
    """The sha256 the manifest records for the .pt on disk: the last good one where a later
    regeneration failed (the folder kept the .pt that was there)."""
    if not entry:
        return None
    if entry.get("success"):
        return entry.get("sha256")
    return (entry.get("last_success") or {}).get("sha256")


def ops(folder: Path, sources: list[str] | None = None) -> list[FolderOp]:
    """Every .pt of <dir>/<source>/, as the existing tools' batch finds them, plus what the
    manifest lists that the folder lacks (a failed reference, a file lost on the way)."""
    found: dict[str, FolderOp] = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if sources and sub.name not in sources:
            continue
        for pt in sorted(sub.glob("*.pt")):
            try:
                validate_name(sub.name, "source"), validate_name(pt.stem, "op")
                found[f"{sub.name}/{pt.stem}"] = FolderOp(sub.name, pt.stem, pt)
            except FarmError as exc:
                found[f"{sub.name}/{pt.stem}"] = FolderOp(sub.name, pt.stem, pt, f"{pt}: {exc}")
    for name, entry in _entries(folder).items():
        source, op = entry["source"], entry["op_name"]
        if name in found or (sources and source not in sources):
            continue
        pt = folder / source / f"{op}.pt"
        if entry.get("success"):
            problem = (f"{pt}: listed in {folder / 'manifest.json'} but missing: copy the folder again whole "
                       f"(`scp -r`), or regenerate it on the reference host with {_regenerate(folder, source, op)}")
        else:
            last = (entry.get("error") or "no reason recorded").strip().splitlines()[-1]
            last = re.sub(r"^farm[.]errors[.]\w+: ", "", last)
            problem = f"no reference data: it failed on the reference host ({entry.get('stage') or '?'}): {last}"
        found[name] = FolderOp(source, op, pt, problem)
    return [found[k] for k in natural_sorted(found)]


def load(pt: Path, store: Store | None = None) -> dict[str, Any]:
    """The reference data of `pt` with its secret input sets attached, every part checked. They
    come from the folder the .pt lies in; from `store` where the folder holds none (a .pt made
    before folders carried them, or a lone .pt beside a shared store)."""
    pt = Path(pt)
    folder = folder_of(pt)
    entry = _entries(folder).get(f"{pt.parent.name}/{pt.stem}") if folder else None
    sha = _sha256(pt)
    want = expected_sha(entry)
    if folder is not None and want and sha != want:  # an entry, and so a sha, needs a folder
        raise IntegrityError(
            f"{pt} does not match {folder / 'manifest.json'} (sha256 {sha[:12]}..., the manifest records "
            f"{want[:12]}...): the folder holds another version of it or a damaged copy; copy it again from the "
            f"reference host, or, if this .pt is the one you mean, rebuild the manifest with "
            f"`farm cache repair --dir {folder}`")
    data = load_pt(pt)
    data["_sha256"] = sha
    pointer = secret_inputs.pointer_of(data, str(pt))
    if pointer is not None:
        data["_secret_inputs"] = _secret_inputs(pt, folder, entry, pointer, data, store)
    _check_cases(pt, data)
    pointer = data.get(ref_cases.POINTER)
    key = pointer.get("key") if isinstance(pointer, dict) else None
    from_store = store if key and store is not None and store.head(key) is not None else None
    return ref_cases.attach(from_store, data, beside=pt.with_suffix(ref_cases.SUFFIX))


def _check_cases(pt: Path, data: dict) -> None:
    """The cases beside the .pt (farm.reference.cases), where the folder holds them, are the
    ones it records: a copy that mixed two runs is named here, before anything is searched."""
    pointer = data.get(ref_cases.POINTER)
    path = pt.with_suffix(ref_cases.SUFFIX)
    if not isinstance(pointer, dict) or not pointer.get("sha256") or not path.is_file():
        return
    sha = _sha256(path)
    if sha != pointer["sha256"]:
        raise IntegrityError(f"{path} does not match {pt} (sha256 {sha[:12]}..., the .pt records "
                             f"{str(pointer['sha256'])[:12]}...): copy them together again from the reference host's "
                             f"folder, or regenerate them there with `farm reference --force`")


def _secret_inputs(pt: Path, folder: Path | None, entry: dict | None, pointer: dict, data: dict,
               store: Store | None) -> list[tuple[list, list]] | None:
    path = open_folder(folder).path_of(pointer["key"]) if folder else None
    if folder is None or path is None or not path.is_file():
        if store is not None and store.head(pointer["key"]) is not None:
            return secret_inputs.load_sets(store, data)
        source, op = data.get("source"), data.get("op_name")
        where = path or f"{pointer['key']} (no reference folder around {pt}, and {store.url if store else 'no store'} lacks it)"
        fix = (f"copy the reference folder whole (`scp -r DIR HOST:` or `rsync -a DIR/ HOST:DIR/` keep the hidden "
               f"{FOLDER_SECRETS} folder; `cp -r DIR/*` leaves it out)")
        raise IntegrityError(f"{pt} points at secret input sets {where}, which are missing: {fix}, or regenerate "
                             f"them on the reference host with {_regenerate(folder or Path('DIR'), source, op)}")
    sha = _sha256(path)
    recorded = {"the .pt": pointer["sha256"], "the manifest": (entry or {}).get("seed_sets_sha256")}
    for who, want in recorded.items():
        if want and sha != want:
            raise IntegrityError(
                f"{path} does not match {pt if who == 'the .pt' else folder / 'manifest.json'} (sha256 {sha[:12]}..., "
                f"{who} records {want[:12]}...): they come from different `farm reference` runs, or one is damaged; "
                f"copy the .pt and {FOLDER_SECRETS} together again from the reference host's folder, or regenerate "
                f"them there with {_regenerate(folder, data.get('source'), data.get('op_name'))}")
    return secret_inputs.read_sets(path, str(path))


def _sha256(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError as exc:
        raise FarmError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def sha256_of(pt: Path) -> str | None:
    """The sha256 of a folder's .pt, or None where it cannot be read (its load says why)."""
    try:
        return sha256_file(pt)
    except OSError:
        return None
