"""The resume ledger of a batch search: runs/<run>/ledger.json, one entry per source/op.

Entries are `done` (the search finished, with or without a passing kernel) or `error`; a
batch skips both unless told otherwise (--retry-errors, --force). Each update is a merge
through Store.update_json, so an interrupted batch leaves a consistent ledger.
"""

from __future__ import annotations

from typing import Any

from farm.manifest import now
from farm.storage import Store


def key(run: str) -> str:
    return f"runs/{run}/ledger.json"


def read(store: Store, run: str) -> dict[str, dict[str, Any]]:
    return store.read_json(key(run)).get("ops", {})


def should_skip(entry: dict | None, retry_errors: bool, force: bool) -> bool:
    if force or not entry:
        return False
    if entry.get("status") == "error":
        return not retry_errors
    return entry.get("status") == "done"


def record(store: Store, run: str, name: str, status: str, result: dict[str, Any]) -> None:
    def mutate(doc: dict) -> dict:
        ops = dict(doc.get("ops", {}))
        ops[name] = {"status": status, "updated_at": now(), "result": result}
        return {"run": run, "updated_at": now(), "ops": ops}

    store.update_json(key(run), mutate)


def forget(store: Store, run: str, name: str) -> None:
    def mutate(doc: dict) -> dict:
        ops = {k: v for k, v in doc.get("ops", {}).items() if k != name}
        return {**doc, "ops": ops}

    store.update_json(key(run), mutate)
