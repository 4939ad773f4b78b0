"""A way out of every damaged run record (`farm cache repair`, and the errors that name it).

What a run keeps that a truncated write, a full disk or a hand edit can damage, and what
repair does with each:

    runs/<run>/ledger.json                  rebuilt from the ops' checkpoints (finished ones)
    runs/<run>/<source>/<op>/state.json     removed: the op is searched again from its start
                                            (its ledger entry, if it recorded the damage, too)
    runs/index.json                         rebuilt from the runs' folders (farm.search.catalog)

Each damaged record's error names both ways out: `--force` on the same command (that run's
ledger anew, or that op searched from scratch) and `farm cache repair`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from farm.errors import IntegrityError, StorageError
from farm.reference.manifest import now, repair_command
from farm.search import catalog, ledger
from farm.storage import Store
from farm.storage.base import dump_json

# what a checkpoint must hold to be restored (farm.search.controller.SearchController.restore)
STATE_FIELDS = {"db": dict, "rng": list, "pending_seeds": list, "best_by_window": list, "chunks_done": int,
                "status": str}


@contextmanager
def damaged_checkpoint(store: Store, key: str, run: str, name: str) -> Iterator[None]:
    """Restoring a checkpoint: one that cannot be read or has the wrong shape is an error that
    names the ways out, not a traceback nor a puzzle."""
    try:
        yield
    except (IntegrityError, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        detail = str(exc) if isinstance(exc, IntegrityError) else f"{store.describe(key)} is corrupt: {exc!r}"
        raise IntegrityError(f"{detail} (the checkpoint of {name} in run {run}); --force searches {name} again from "
                             f"scratch, or `{repair_command(store)}` removes the damaged checkpoint") from None


def state_problem(store: Store, key: str) -> str:
    """Why the checkpoint at `key` cannot be restored ("" if it can)."""
    try:
        state = store.read_json(key)
    except IntegrityError as exc:
        return str(exc)
    for field, kind in STATE_FIELDS.items():
        if not isinstance(state.get(field), kind):
            return f"{store.describe(key)} is corrupt: {field!r} is not a {kind.__name__}"
    return ""


def _runs(store: Store) -> dict[str, list[str]]:
    """run -> the keys under runs/<run>/ (one listing of runs/)."""
    found: dict[str, list[str]] = {}
    for info in store.list("runs/"):
        parts = info.key.split("/")
        if len(parts) >= 3:
            found.setdefault(parts[1], []).append(info.key)
    return found


def repair_runs(store: Store, on_done: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Every damaged run record set right; one row per record it changed (status repaired)."""
    on_done = on_done or (lambda row: None)
    rows = []
    runs = _runs(store)
    for run, keys in sorted(runs.items()):
        for row in _repair_run(store, run, keys):
            rows.append(row)
            on_done(row)
    index_row = _repair_index(store, runs)
    if index_row:
        rows.append(index_row)
        on_done(index_row)
    return rows


def _row(run: str, name: str, what: str, error: str) -> dict[str, Any]:
    source, _, op = name.partition("/")
    return {"source": source or run, "op": op or what, "name": f"runs/{run}/{what}", "status": "repaired",
            "size_bytes": None, "error": error}


def _repair_run(store: Store, run: str, keys: list[str]) -> list[dict[str, Any]]:
    rows, states = [], {}
    for key in keys:
        parts = key.split("/")
        if len(parts) == 5 and parts[4] == "state.json":
            problem = state_problem(store, key)
            name = f"{parts[2]}/{parts[3]}"
            if problem:
                store.delete(key)
                rows.append(_row(run, name, f"{name}/state.json", f"{problem}: removed, searched again next run"))
            else:
                states[name] = key
    ledger_key = ledger.key(run)
    if ledger_key not in keys:
        return rows
    try:
        entries = ledger.check(store, run, store.read_json(ledger_key))
    except IntegrityError as exc:
        entries = _from_checkpoints(store, states)
        store.put_bytes(ledger_key, dump_json({"run": run, "updated_at": now(), "ops": entries}))
        rows.append(_row(run, "", "ledger.json", f"{exc}: rebuilt from {len(entries)} finished op checkpoint(s)"))
        return rows
    for row in rows:  # an op whose checkpoint was damaged is not held back by the error that recorded it
        name = f"{row['source']}/{row['op']}"
        if (entries.get(name) or {}).get("status") == "error":
            ledger.forget(store, run, name)
    return rows


def _from_checkpoints(store: Store, states: dict[str, str]) -> dict[str, dict]:
    """Ledger entries of the ops whose checkpoint says finished, as the batch records them."""
    entries = {}
    for name, key in sorted(states.items()):
        state = store.read_json(key)
        outcome = state.get("outcome")
        if state.get("status") == "done" and isinstance(outcome, dict):
            entries[name] = {"status": "error" if outcome.get("status") == "failed" else "done",
                             "updated_at": now(), "result": outcome}
    return entries


def _repair_index(store: Store, runs: dict[str, list[str]]) -> dict[str, Any] | None:
    try:
        found = catalog.runs(store)
        if isinstance(found, dict) and all(isinstance(e, dict) for e in found.values()):
            return None
        problem = f"{store.describe(catalog.INDEX_KEY)} is corrupt: 'runs' is not a mapping of run to entries"
    except StorageError as exc:
        problem = str(exc)
    entries = {}
    for run, keys in sorted(runs.items()):
        if run == "index.json" or not keys:
            continue
        kind = "local" if ledger.key(run) in keys else "distributed"
        entries[run] = {"kind": kind, "created_at": None, "sources": sorted({k.split("/")[2] for k in keys
                                                                               if k.count("/") >= 4})}
    store.put_bytes(catalog.INDEX_KEY, dump_json({"runs": entries, "repaired_at": now()}))
    return {"source": "runs", "op": "index.json", "name": catalog.INDEX_KEY, "status": "repaired",
            "size_bytes": None, "error": f"{problem}: rebuilt from {len(entries)} run folder(s)"}
