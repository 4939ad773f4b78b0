"""The reference cache as a whole: list it, re-verify it, copy it between stores.

`push`/`pull` replace the scp step of the existing tool chain: a folder laid out as
<dir>/<source>/<op>.pt (+ manifest.json) goes to S3 and back, every object verified on the
way and the destination's manifest merged, never overwritten.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

from farm import manifest
from farm.errors import IntegrityError, StorageError
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
    return {k: v for k, v in sorted(found.items()) if not sources or v["source"] in sources}


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
        except IntegrityError as exc:
            row.update(status="corrupt", error=str(exc))
        except StorageError as exc:
            row.update(status="missing" if store.head(entry["key"]) is None else "error", error=str(exc))
        rows.append(row)
        if on_done:
            on_done(row)
    return rows


def copy_refs(src: Store, dst: Store, sources: list[str] | None = None,
              on_done: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Copy every good .pt from src to dst; objects already there with the same sha256 are skipped."""
    rows, copied = [], []
    with tempfile.TemporaryDirectory(prefix="farm-copy-") as tmp:
        for name, entry in known_entries(src, sources).items():
            if not entry.get("success"):
                continue
            row = {"name": name, "source": entry["source"], "op": entry["op_name"]}
            try:
                row.update(_copy_one(src, dst, entry, Path(tmp)))
                copied.append({**entry, "key": manifest.ref_key(entry["source"], entry["op_name"]),
                               "sha256": row["sha256"], "size_bytes": row["size_bytes"]})
            except IntegrityError as exc:
                row.update(status="corrupt", error=str(exc))
            rows.append(row)
            if on_done:
                on_done(row)
        if copied:
            manifest.record(dst, [{k: v for k, v in e.items() if k != "unlisted"} for e in copied])
    return rows


def _copy_one(src: Store, dst: Store, entry: dict, tmp: Path) -> dict[str, Any]:
    key = manifest.ref_key(entry["source"], entry["op_name"])
    there = dst.head(key)
    if there is not None and entry.get("sha256") and there.sha256 == entry["sha256"]:
        return {"status": "up to date", "sha256": there.sha256, "size_bytes": there.size}
    local = tmp / f"{entry['source']}__{entry['op_name']}.pt"
    info = src.get_file(entry["key"], local)  # verified against the source's own record
    if entry.get("sha256") and info.sha256 != entry["sha256"]:
        raise IntegrityError(f"{src.url}/{entry['key']}: sha256 does not match the manifest")
    stored = dst.put_file(key, local, sha256=info.sha256)
    local.unlink(missing_ok=True)
    return {"status": "copied", "sha256": stored.sha256, "size_bytes": stored.size}
