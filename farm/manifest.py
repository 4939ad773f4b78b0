"""refs/manifest.json: one entry per source/op, merged across runs and machines.

    {"version": 1, "updated_at": ..., "total": N, "success": N, "failed": N,
     "entries": {"<source>/<op>": {op_name, source, success, key, sha256, size_bytes,
                                   elapsed_s, error, stage, device, created_at,
                                   task_sha256, seed, shapes, ...}}}

Writers never replace the document: they merge their entries into whatever is there, through
Store.update_json (a conditional write on S3, a lock on files), so two runs over different
sources, or two machines at once, leave both sets of entries.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Callable

from farm.corpus import validate_name
from farm.storage import Store

MANIFEST_KEY = "refs/manifest.json"
VERSION = 1


def ref_key(source: str, op: str) -> str:
    return f"refs/{validate_name(source, 'source')}/{validate_name(op, 'op')}.pt"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def entries(store: Store) -> dict[str, dict[str, Any]]:
    return store.read_json(MANIFEST_KEY).get("entries", {})


def merger(new_entries: list[dict[str, Any]]) -> Callable[[dict], dict]:
    """A mutate function for update_json that adds or replaces only our entries."""

    def mutate(doc: dict) -> dict:
        merged = dict(doc.get("entries", {}))
        for entry in new_entries:
            name = f"{entry['source']}/{entry['op_name']}"
            previous = merged.get(name)
            if not entry.get("success") and previous and previous.get("success"):
                # a failed regeneration does not hide the reference data still stored
                entry = {**entry, "last_success": {k: previous.get(k) for k in
                                                   ("key", "sha256", "size_bytes", "created_at", "task_sha256", "seed")}}
            merged[name] = entry
        ok = sum(1 for e in merged.values() if e.get("success"))
        return {"version": VERSION, "updated_at": now(), "total": len(merged), "success": ok,
                "failed": len(merged) - ok, "entries": dict(sorted(merged.items()))}

    return mutate


def record(store: Store, new_entries: list[dict[str, Any]]) -> dict:
    return store.update_json(MANIFEST_KEY, merger(new_entries))
