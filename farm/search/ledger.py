"""The resume ledger of a batch search: runs/<run>/ledger.json, one entry per source/op.

Entries are `done` (the search finished, with or without a passing kernel) or `error`; a
batch skips both unless told otherwise (--retry-errors, --force), except an error of the
moment (a full disk, a lost connection: `transient`) and a search stopped by a budget lower
than the one asked for now, which are taken up again. Each update is a merge
through Store.update_json, so an interrupted batch leaves a consistent ledger.
"""

from __future__ import annotations

from typing import Any

from farm.reference.manifest import now
from farm.storage import Store


def key(run: str) -> str:
    return f"runs/{run}/ledger.json"


def read(store: Store, run: str) -> dict[str, dict[str, Any]]:
    return store.read_json(key(run)).get("ops", {})


def should_skip(entry: dict | None, retry_errors: bool, force: bool, max_tasks: int | None = None) -> bool:
    if force or not entry:
        return False
    result = entry.get("result", {})
    if entry.get("status") == "error":
        # a full disk, a lost connection, a timeout: the machine's failure, not the op's
        return not (retry_errors or result.get("transient"))
    if max_tasks is not None and result.get("stop_reason") == "budget" and result.get("submitted", 0) < max_tasks:
        return False  # stopped by a budget that has since been raised: go on from its checkpoint
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
