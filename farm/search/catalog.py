"""Every run a store holds, wherever it came from: `runs/index.json`.

A run is a run whether `farm run`/`farm search` made it in one process ("local") or `farm
submit` spread it over workers ("distributed"): both are entered here when they start, so
`farm status` lists both and `--latest` means the same run in every command (the one started
last). An entry says when the run started, its sources and target, and for a local run the
host and pid of the process writing it (so that status can tell a run going on from one that
was interrupted).

Stores written before this index held local runs know them only by their folders: `latest`
falls back to those folders (their ledger's time) only when the index is empty, because a
listing of every run's objects costs seconds at thousands of ops.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from farm.errors import FarmError, IntegrityError
from farm.reference.manifest import now, repair_command, repairable
from farm.storage import Store

INDEX_KEY = "runs/index.json"
KINDS = ("local", "distributed")


def record(store: Store, run: str, kind: str, sources: list[str], target: str, **extra: Any) -> dict:
    """Enter (or refresh) a run: its first start time stays, sources accumulate."""
    def mutate(doc: dict) -> dict:
        runs = dict(doc.get("runs", {}))
        old = runs.get(run, {})
        entry = {**old, **extra, "kind": kind, "target": target,
                 "sources": sorted(set(old.get("sources", [])) | set(sources)),
                 "created_at": old.get("created_at") or extra.get("created_at") or now()}
        entry["source"] = ",".join(entry["sources"])  # what status and the exporter label a run with
        if kind == "local":
            entry.update(host=socket.gethostname(), pid=os.getpid(), updated_at=now())
        if entry == old:
            return doc
        runs[run] = entry
        return {**doc, "runs": runs}

    with repairable(store):
        return store.update_json(INDEX_KEY, mutate)["runs"][run]


def runs(store: Store) -> dict[str, dict]:
    with repairable(store):
        found = store.read_json(INDEX_KEY).get("runs", {})
    if not isinstance(found, dict) or not all(isinstance(e, dict) for e in found.values()):
        raise IntegrityError(f"{store.describe(INDEX_KEY)} is corrupt: 'runs' is not a mapping of run to entries; "
                             f"rebuild it with `{repair_command(store)}`")
    return found


def entry(store: Store, run: str) -> dict:
    return runs(store).get(run, {})


def latest(store: Store) -> str:
    """The run started last, local or distributed (--latest in every command)."""
    found = {name: e.get("created_at") or "" for name, e in runs(store).items()}
    if not found:
        found = _unindexed(store)
    if not found:
        raise FarmError(f"no runs in {store.url}: `farm run` or `farm submit` makes one")
    return max(found, key=lambda name: (found[name], name))


def _unindexed(store: Store) -> dict[str, str]:
    """Runs of a store written before the index knew local runs: one per ledger."""
    found = {}
    for info in store.list("runs/"):
        parts = info.key.split("/")
        if len(parts) == 3 and parts[2] == "ledger.json":
            found[parts[1]] = store.read_json(info.key).get("updated_at") or ""
    return found


def op_files(store: Store, run: str, names: tuple[str, ...]) -> dict[tuple[str, str], set[str]]:
    """(source, op) -> which of these files runs/<run>/<source>/<op>/ holds: the ops a run
    touched, whatever kind of run it is."""
    found: dict[tuple[str, str], set[str]] = {}
    for info in store.list(f"runs/{run}/"):
        parts = info.key.split("/")
        if len(parts) == 5 and parts[4] in names:
            found.setdefault((parts[2], parts[3]), set()).add(parts[4])
    return found


def process_alive(e: dict) -> bool | None:
    """Whether the process that writes a local run still runs: None where it cannot be told
    (another host)."""
    if e.get("host") != socket.gethostname() or not e.get("pid"):
        return None
    try:
        os.kill(int(e["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
