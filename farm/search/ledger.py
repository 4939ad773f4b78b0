"""The resume ledger of a batch search: runs/<run>/ledger.json, one entry per source/op.

Entries are `done` (the search finished, with or without a passing kernel), `error`, or
`interrupted` (Ctrl-C or SIGTERM mid-search: never skipped, resumed from its checkpoint), each
written as its op ends with the op's status, reason, best and timings. A batch skips the first
two unless told otherwise (--retry-errors, --force), except an error of the
moment (a full disk, a lost connection: `transient`) and a search stopped by a budget lower
than the one asked for now, which are taken up again. Each update is a merge
through Store.update_json, so an interrupted batch leaves a consistent ledger.

A damaged ledger (truncated, hand-edited, of the wrong shape) stops the run with its way out
named: `--force` starts it anew, `farm cache repair` rebuilds it from the ops' checkpoints
(farm.search.repair).
"""

from __future__ import annotations

from typing import Any

from farm.errors import IntegrityError
from farm.reference.manifest import now, repair_command
from farm.storage import Store
from farm.storage.base import dump_json


def key(run: str) -> str:
    return f"runs/{run}/ledger.json"


def read(store: Store, run: str, force: bool = False) -> dict[str, dict[str, Any]]:
    """The run's entries; with `force` a damaged ledger is started anew (its ops are searched
    again, from their checkpoints where those are sound) instead of stopping the run."""
    try:
        return check(store, run, store.read_json(key(run)))
    except IntegrityError as exc:
        if not force:
            raise IntegrityError(f"{exc}; the same command with --force starts this run's ledger anew, or "
                                 f"`{repair_command(store)}` rebuilds it from the ops' checkpoints") from None
        store.put_bytes(key(run), dump_json({"run": run, "updated_at": now(), "ops": {}}))
        return {}


def check(store: Store, run: str, doc: dict) -> dict[str, dict[str, Any]]:
    ops = doc.get("ops", {})
    if not isinstance(ops, dict) or not all(isinstance(e, dict) and isinstance(e.get("result", {}), dict)
                                            for e in ops.values()):
        raise IntegrityError(f"{store.describe(key(run))} is corrupt: 'ops' is not a mapping of op to entries")
    return ops


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
