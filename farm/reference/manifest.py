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
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from farm.corpus.tasks import natural_sorted, validate_name
from farm.errors import IntegrityError
from farm.storage import Store
from farm.storage.base import dump_json

MANIFEST_KEY = "refs/manifest.json"
VERSION = 1


def ref_key(source: str, op: str) -> str:
    return f"refs/{validate_name(source, 'source')}/{validate_name(op, 'op')}.pt"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def repair_command(store: Store) -> str:
    """The command that rebuilds this store's manifest from its objects (farm cache repair)."""
    if getattr(store, "strip_prefix", ""):  # a plain folder in the existing tools' layout
        return f"farm cache repair --dir {getattr(store, 'root', '')}"  # FileStore's, perhaps behind MeteredStore
    return f"farm cache repair --store {store.url}"


@contextmanager
def repairable(store: Store) -> Iterator[None]:
    """A damaged document's error, with the command that rebuilds it."""
    try:
        yield
    except IntegrityError as exc:
        raise IntegrityError(f"{exc}; rebuild it from the stored objects with `{repair_command(store)}`") from None


def entries(store: Store) -> dict[str, dict[str, Any]]:
    with repairable(store):
        doc = store.read_json(MANIFEST_KEY)
    found = doc.get("entries", {})
    if not isinstance(found, dict) or not all(isinstance(e, dict) and "source" in e and "op_name" in e
                                              for e in found.values()):
        raise IntegrityError(f"{store.describe(MANIFEST_KEY)} is corrupt: 'entries' is not a mapping of "
                             f"source/op to entries; rebuild it with `{repair_command(store)}`")
    return found


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
                "failed": len(merged) - ok, "entries": {k: merged[k] for k in natural_sorted(merged)}}

    return mutate


def record(store: Store, new_entries: list[dict[str, Any]]) -> dict:
    with repairable(store):
        return store.update_json(MANIFEST_KEY, merger(new_entries))


def replace(store: Store, new_entries: list[dict[str, Any]]) -> dict:
    """Write the manifest anew from `new_entries` (farm cache repair: the old one is unreadable)."""
    doc = merger(new_entries)({})
    store.put_bytes(MANIFEST_KEY, dump_json(doc))
    return doc
