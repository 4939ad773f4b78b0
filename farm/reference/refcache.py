"""The reference cache as a whole: list it, re-verify it, copy it between stores.

`push`/`pull` replace the scp step of the existing tool chain: a folder laid out as
<dir>/<source>/<op>.pt (+ manifest.json) goes to S3 and back, every object verified on the
way and the destination's manifest merged, never overwritten.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

from farm.corpus.tasks import natural_sorted
from farm.errors import FarmError, IntegrityError, StorageError
from farm.reference import manifest, secret_inputs
from farm.reference.generate import load_pt
from farm.reference.ptfile import load_pt_file
from farm.storage import Store


def _source_op(key: str) -> tuple[str, str] | None:
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == "refs" and parts[2].endswith(".pt"):
        return parts[1], parts[2][:-3]
    return None


def known_entries(store: Store, sources: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Manifest entries, plus objects that no manifest lists (e.g. a folder made by other tools)."""
    found = dict(manifest.entries(store))
    for info in store.list("refs/"):
        so = _source_op(info.key)
        if so and f"{so[0]}/{so[1]}" not in found:
            found[f"{so[0]}/{so[1]}"] = {"source": so[0], "op_name": so[1], "key": info.key, "success": True,
                                         "sha256": info.sha256, "size_bytes": info.size, "unlisted": True}
    return {k: found[k] for k in natural_sorted(found) if not sources or found[k]["source"] in sources}


def inventory(store: Store, sources: list[str] | None = None) -> list[dict[str, Any]]:
    rows = []
    for name, entry in known_entries(store, sources).items():
        info = store.head(entry["key"]) if entry.get("key") else None
        if not entry.get("success"):
            status = "failed"
        elif info is None:
            status = "missing"
        elif entry.get("unlisted"):
            status = "unlisted"
        else:
            status = "ok"
        rows.append({"name": name, "source": entry["source"], "op": entry["op_name"], "status": status,
                     "size_bytes": info.size if info else entry.get("size_bytes"), "sha256": entry.get("sha256"),
                     "created_at": entry.get("created_at"), "device": entry.get("device"),
                     "error": entry.get("error")})
    return rows


def verify(store: Store, sources: list[str] | None = None,
           on_done: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Stream every stored .pt and check it against the manifest and its own metadata."""
    rows = []
    for name, entry in known_entries(store, sources).items():
        if not entry.get("success"):
            continue
        row = {"name": name, "source": entry["source"], "op": entry["op_name"], "key": entry["key"]}
        try:
            sha = store.verify(entry["key"])
            expected = entry.get("sha256")
            if expected and sha != expected:
                row.update(status="corrupt", error=f"sha256 {sha[:12]}... != manifest {expected[:12]}...")
            else:
                row.update(status="ok", sha256=sha)
                _verify_cases(store, entry, row)
        except IntegrityError as exc:
            row.update(status="corrupt", error=str(exc))
        except StorageError as exc:
            row.update(status="missing" if store.head(entry["key"]) is None else "error", error=str(exc))
        rows.append(row)
        if on_done:
            on_done(row)
    return rows


def _verify_cases(store: Store, entry: dict, row: dict) -> None:
    """The .pt's cases companion (farm.reference.cases) is checked with it: present, and the
    sha256 its .pt and manifest entry record."""
    key = entry.get("cases_key")
    if not key:
        return
    if store.head(key) is None:
        row.update(status="missing", error=f"its cases {key} are missing: `farm reference --force` makes them again")
        return
    sha = store.verify(key)
    if entry.get("cases_sha256") and sha != entry["cases_sha256"]:
        row.update(status="corrupt", error=f"{key}: sha256 {sha[:12]}... != recorded {entry['cases_sha256'][:12]}...")


def copy_refs(src: Store, dst: Store, sources: list[str] | None = None,
              on_done: Callable[[dict], None] | None = None, force: bool = False) -> list[dict[str, Any]]:
    """Copy every good .pt from src to dst, with the secret input sets it points at; objects
    already there with the same sha256 are skipped.

    Each object is checked before it is written (sha256, then loaded as reference data:
    weights_only, every key present; its secret input sets against the sha256 it records), so a
    truncated or foreign file, or a .pt whose secret input sets are missing or of another version, is
    refused and never replaces what dst holds. Secret input sets go first: dst never holds a .pt
    without the sets it points at. A .pt that dst's manifest says was made later than src's is
    kept (a stale folder pushed over a store), unless `force`."""
    rows, copied = [], []
    there = manifest.entries(dst)
    with tempfile.TemporaryDirectory(prefix="farm-copy-") as tmp:
        for name, entry in known_entries(src, sources).items():
            if not entry.get("success"):
                continue
            row = {"name": name, "source": entry["source"], "op": entry["op_name"]}
            try:
                found, metadata = _copy_one(src, dst, entry, there.get(name, {}), Path(tmp), force)
                row.update(found)
                if found["status"] == "copied":
                    copied.append(_clean({**entry, **metadata, "key": manifest.ref_key(entry["source"], entry["op_name"]),
                                          "sha256": row["sha256"], "size_bytes": row["size_bytes"]}))
                row["cases"] = _copy_cases(src, dst, {**entry, **metadata}, Path(tmp))
            except IntegrityError as exc:
                row.update(status="corrupt", error=str(exc))
            except FarmError as exc:  # not reference data: refused, dst keeps what it had
                row.update(status="refused", error=str(exc))
            rows.append(row)
            if on_done:
                on_done(row)
        if copied:
            manifest.record(dst, copied)
    return rows


def seed_set_fields(entry: dict) -> dict[str, Any]:
    return {k: entry[k] for k in ("seed_sets_key", "seed_sets_sha256") if entry.get(k)}


def _copy_secret_inputs(src: Store, dst: Store, fields: dict, tmp: Path) -> str:
    """A reference-data-mode op's secret input sets go with its .pt, between stores and folders
    alike (a folder keeps them in its hidden .secrets/)."""
    key, sha = fields.get("seed_sets_key"), fields.get("seed_sets_sha256")
    if not key:
        return "-"
    there = dst.head(key)
    if there is not None and sha and (there.sha256 or dst.verify(key)) == sha:
        return "up to date"
    if src.head(key) is None:
        if there is not None and not sha:
            return "up to date"
        raise IntegrityError(f"{src.describe(key)}: the secret input sets its .pt points at are missing, so the .pt "
                             "is not copied without them: copy the reference folder whole (its hidden .secrets/ "
                             "too) or regenerate the op with `farm reference --force`")
    if there is not None and not sha:
        return "up to date"
    local = tmp / "seed_sets.pt"
    info = src.get_file(key, local)
    if sha and info.sha256 != sha:
        raise IntegrityError(f"{src.describe(key)} does not match the sha256 its .pt records ({str(info.sha256)[:12]}... "
                             f"!= {sha[:12]}...): another version or a damaged copy; the op is not copied: copy the "
                             "reference folder again whole, or regenerate the op with `farm reference --force`")
    dst.put_file(key, local, sha256=info.sha256)
    local.unlink(missing_ok=True)
    return "copied"


def _copy_cases(src: Store, dst: Store, entry: dict, tmp: Path) -> str:
    """The cases beside a .pt go where it goes (a plain folder too: they are public), checked
    against the sha256 the .pt records and loaded weights_only before they are written."""
    key = entry.get("cases_key")
    if not key:
        return "-"
    info = src.head(key)
    if info is None:
        return "not in source"
    there = dst.head(key)
    if there is not None and there.sha256 and there.sha256 == entry.get("cases_sha256"):
        return "up to date"
    local = tmp / "cases.pt"
    got = src.get_file(key, local)
    if entry.get("cases_sha256") and got.sha256 != entry["cases_sha256"]:
        raise IntegrityError(f"{src.url}/{key}: sha256 does not match the one its .pt records")
    load_pt_file(local)  # weights_only: a foreign file is refused here, never written
    dst.put_file(key, local, sha256=got.sha256)
    local.unlink(missing_ok=True)
    return "copied"


def _newer(dst_entry: dict, entry: dict) -> bool:
    """dst's .pt was made after src's (both manifests say when; the same clock format, UTC)."""
    made, theirs = entry.get("created_at"), dst_entry.get("created_at")
    return bool(dst_entry.get("success") and made and theirs and str(theirs) > str(made))


def _clean(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "unlisted"}


def _copy_one(src: Store, dst: Store, entry: dict, dst_entry: dict, tmp: Path,
              force: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    key = manifest.ref_key(entry["source"], entry["op_name"])
    there = dst.head(key)
    if there is not None and entry.get("sha256") and (there.sha256 or dst.verify(key)) == entry["sha256"]:
        fields = seed_set_fields(entry) or seed_set_fields(dst_entry)
        return {"status": "up to date", "sha256": entry["sha256"], "size_bytes": there.size,
                "seed_sets": _copy_secret_inputs(src, dst, fields, tmp)}, {}
    if there is not None and not force and _newer(dst_entry, entry):
        raise FarmError(f"{dst.describe(key)} was made {dst_entry['created_at']}, later than {src.describe(entry['key'])} "
                        f"({entry['created_at']}): the newer one is kept; --force replaces it")
    local = tmp / f"{entry['source']}__{entry['op_name']}.pt"
    info = src.get_file(entry["key"], local)  # verified against the source's own record
    if entry.get("sha256") and info.sha256 != entry["sha256"]:
        raise IntegrityError(f"{src.describe(entry['key'])}: sha256 does not match the manifest")
    try:
        metadata = pt_metadata(load_pt(local))
    except FarmError as exc:
        raise FarmError(f"{src.describe(entry['key'])}: {str(exc).split(': ', 1)[-1]}") from None
    seed_sets = _copy_secret_inputs(src, dst, metadata, tmp)
    stored = dst.put_file(key, local, sha256=info.sha256)
    local.unlink(missing_ok=True)
    return {"status": "copied", "sha256": stored.sha256, "size_bytes": stored.size, "seed_sets": seed_sets}, metadata


# What a .pt says about itself (the extras generate_reference writes), for its manifest entry.
PT_METADATA = ("seed", "shapes", "task_sha256", "device", "device_name", "reference_time_s")


def pt_metadata(data: dict) -> dict[str, Any]:
    """The manifest fields a .pt gives, its secret input sets' and cases' keys and sha256s included
    (checked: the .pt is untrusted)."""
    found = {k: data[k] for k in PT_METADATA if k in data}
    pointer = secret_inputs.pointer_of(data, f"{data.get('source')}/{data.get('op_name')}")
    if pointer is not None:
        found.update(seed_sets_key=pointer["key"], seed_sets_sha256=pointer["sha256"], seed_sets=pointer.get("count"))
    pointer = data.get("cases")
    if isinstance(pointer, dict) and pointer.get("key"):
        found.update(cases=pointer.get("count"), cases_key=pointer["key"], cases_sha256=pointer.get("sha256"))
    return found


def repair(store: Store, on_done: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Rebuild refs/manifest.json from the stored objects (farm cache repair).

    Every refs/<source>/<op>.pt is read (sha256 against its record) and loaded as reference
    data; a good one gets an entry with its sha256 and the metadata it carries, a bad one a
    failed entry (so `farm reference` regenerates it; the object itself is left in place).
    Entries of the old manifest are kept where it is still readable and agrees."""
    try:
        old = manifest.entries(store)
    except IntegrityError:
        old = {}
    rows, new = [], []
    with tempfile.TemporaryDirectory(prefix="farm-repair-") as tmp:
        for info in store.list("refs/"):
            so = _source_op(info.key)
            if not so:
                continue
            source, op = so
            name = f"{source}/{op}"
            row: dict[str, Any] = {"name": name, "source": source, "op": op, "key": info.key, "size_bytes": info.size}
            entry: dict[str, Any] = {"source": source, "op_name": op, "key": info.key, "created_at": manifest.now()}
            try:
                got = store.get_file(info.key, Path(tmp) / "ref.pt")
                metadata = pt_metadata(load_pt(Path(tmp) / "ref.pt"))
                _check_secret_inputs(store, metadata)
            except FarmError as exc:
                # a plain folder (a FileStore with a prefix, perhaps behind MeteredStore) is named by its root
                folder = f" --output-dir {getattr(store, 'root', '')}" if getattr(store, "strip_prefix", "") else ""
                fix = f"farm reference --source {source} --ops {op}{folder} --force"
                row.update(status="corrupt", error=f"{exc}; regenerate it with `{fix}`")
                entry.update(success=False, stage="stored", error=row["error"])
            else:
                previous = old.get(name, {})
                kept = previous if previous.get("sha256") == got.sha256 else {}
                entry.update({**kept, **metadata, "success": True, "stage": "done", "error": None,
                              "sha256": got.sha256, "size_bytes": got.size})
                row.update(status="ok", sha256=got.sha256)
            new.append(entry)
            rows.append(row)
            if on_done:
                on_done(row)
    manifest.replace(store, new)
    return rows


def _check_secret_inputs(store: Store, metadata: dict) -> None:
    """A .pt is good only with the secret input sets it points at, of the sha256 it records."""
    key = metadata.get("seed_sets_key")
    if not key:
        return
    if store.head(key) is None:
        raise IntegrityError(f"the secret input sets it points at, {store.describe(key)}, are missing")
    sha = store.verify(key)
    if sha != metadata["seed_sets_sha256"]:
        raise IntegrityError(f"{store.describe(key)} does not match the sha256 it records ({sha[:12]}... != "
                             f"{metadata['seed_sets_sha256'][:12]}...)")
