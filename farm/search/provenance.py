"""What a result was verified against: the task file's sha256, the reference data's sha256 and
the farm version that judged it (docs/concepts.md, "provenance").

Every outcome (a batch row, a ledger entry), checkpoint (state.json), report.json and promoted
kernel (best.json and the header of best.py) records them under "provenance". A result whose
task file or reference data has changed since is *stale*: a batch does not skip its op as
finished but searches it again (the old checkpoint is retired, the run says so), and
`farm fetch`, `farm export` and `farm report` refuse or flag it. A result recorded before
provenance was kept is of *unknown* provenance where the part that would decide is missing
(flagged, never taken as current, never a crash). The farm version is recorded and shown; a
new version alone does not make a result stale (the verification rules of a version are in
its own documentation).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import farm
from farm.corpus.tasks import TaskRef
from farm.errors import FarmError
from farm.reference import manifest
from farm.storage import Store

log = logging.getLogger(__name__)

CURRENT, STALE, UNKNOWN = "current", "stale", "unknown"
WHAT = {"task_sha256": "task file", "ref_sha256": "reference data"}


def stamp(task_sha256: str | None, ref_sha256: str | None) -> dict[str, Any]:
    """The provenance of a result verified now, by this farm."""
    return {"task_sha256": task_sha256 or None, "ref_sha256": ref_sha256 or None, "farm_version": farm.__version__}


def recorded(doc: dict | None) -> dict[str, Any]:
    """The provenance a stored record holds; before provenance was kept, the reference data's
    sha256 that outcomes, checkpoints, reports and best.json already recorded (the task file's
    stays None: unknown)."""
    doc = doc or {}
    found = doc.get("provenance")
    if isinstance(found, dict):
        return {k: found.get(k) for k in (*WHAT, "farm_version")}
    ref = doc.get("ref_sha256") or (doc.get("verified") or {}).get("ref_sha256")
    # a checkpoint recorded the task file's sha256 before provenance had its own block
    return {"task_sha256": doc.get("task_sha256"), "ref_sha256": ref or None, "farm_version": None}


def changes(was: dict, now: dict) -> list[str]:
    """What differs between the provenance a result recorded and the current one: one phrase
    per part, where both are known ('the task file changed (sha256 1a2b... -> 3c4d...)')."""
    out = []
    for field, what in WHAT.items():
        a, b = was.get(field), now.get(field)
        if a and b and a != b:
            out.append(f"the {what} changed (sha256 {a[:12]}... -> {b[:12]}...)")
    return out


def unknown_parts(was: dict, now: dict) -> list[str]:
    """The parts the current state knows and the record does not (recorded before provenance)."""
    return [WHAT[f] for f in WHAT if now.get(f) and not was.get(f)]


def verdict(was: dict, now: dict) -> str:
    """current, stale (a part changed) or unknown (a part the record lacks)."""
    if changes(was, now):
        return STALE
    return UNKNOWN if unknown_parts(was, now) else CURRENT


def describe(was: dict, now: dict) -> str:
    """One line for a person: what changed, or what is unknown."""
    found = changes(was, now)
    if found:
        return "; ".join(found)
    missing = unknown_parts(was, now)
    if missing:
        return f"recorded without the {' and '.join(missing)} it was verified on (made before provenance was kept)"
    return "matches the current task file and reference data"


def changed(doc: dict | None, now: dict, what: str = "") -> str:
    """What changed since a record was verified ('' where nothing known did); logged for `what`."""
    was = recorded(doc)
    if not changes(was, now):
        return ""
    log.warning("%s: searched on other inputs before (%s): that result is retired, searched again",
                what or "a result", describe(was, now))
    return describe(was, now)


def check(doc: dict | None, now: dict) -> dict[str, Any]:
    """A record's provenance judged against the current one, as commands report it."""
    was = recorded(doc)
    return {"status": verdict(was, now), "why": describe(was, now), "recorded": was, "current": now}


def of_search(ref: TaskRef, data: dict) -> dict[str, Any]:
    """The provenance of a search of `ref` on reference data `data` (its "_sha256"), checked."""
    now = current(ref, data.get("_sha256"))
    check_pair(ref, data, now)
    return now


def check_pair(ref: TaskRef, data: dict, now: dict) -> None:
    """Reference data is searched only with the task file it was made from (the sha256 the .pt
    records, where it records one): a task edited since would be judged against another truth."""
    made_from, task = data.get("task_sha256"), now.get("task_sha256")
    if made_from and task and made_from != task:
        raise FarmError(f"{ref.path}: its reference data was made from another version of this task file (sha256 "
                        f"{made_from[:12]}..., now {task[:12]}...): make it again with `farm reference --source "
                        f"{ref.source} --ops {ref.op} --force` (`farm run` does so by itself)")


# ---------------------------------------------------------------- the current task file and reference data


def reference_shas(store: Store) -> Callable[[str, str], str | None]:
    """source, op -> the sha256 of the reference data the store lists now (refs/manifest.json;
    None where it lists none, or cannot be read: then the reference data is not judged)."""
    try:
        entries = manifest.entries(store)
    except FarmError:
        entries = {}

    def sha(source: str, op: str) -> str | None:
        entry = entries.get(f"{source}/{op}") or {}
        return entry.get("sha256") if entry.get("success") else None

    return sha


def task_sha(ref: TaskRef | None) -> str | None:
    """The task file's sha256 now (None where this machine has no such file)."""
    if ref is None:
        return None
    try:
        return ref.sha256()
    except OSError:
        return None


def current(ref: TaskRef | None, ref_sha256: str | None) -> dict[str, Any]:
    return stamp(task_sha(ref), ref_sha256)


def tasks_by_key(settings, keys: list[tuple[str, str]]) -> dict[str, TaskRef]:
    """The task files of these source/op pairs that this machine's corpus has (others are left
    out: their task file is not judged)."""
    from farm.corpus import tasks as taskfiles

    found: dict[str, TaskRef] = {}
    for source in sorted({s for s, _ in keys}):
        try:
            found.update({r.key: r for r in taskfiles.find_tasks(settings, [source])})
        except FarmError:
            continue
    return found


def judge(store: Store, settings, docs: dict[tuple[str, str], dict | None]) -> dict[tuple[str, str], dict]:
    """Each (source, op)'s record judged against the current task file (from the corpus, where
    this machine has it) and reference data (the store's manifest)."""
    shas = reference_shas(store)
    tasks = tasks_by_key(settings, list(docs)) if settings is not None else {}
    return {(s, o): check(doc, current(tasks.get(f"{s}/{o}"), shas(s, o))) for (s, o), doc in docs.items()}


def refusal(kind: str, stale: list[tuple[str, dict]], allow: str) -> str:
    """The one-line error of fetch/export for kernels verified on another task file or reference data."""
    head = "; ".join(f"{name}: {j['why']}" for name, j in stale[:3]) + (f" (and {len(stale) - 3} more)"
                                                                        if len(stale) > 3 else "")
    return (f"{kind} refused: {len(stale)} kernel(s) were verified on another task file or reference data than "
            f"the current one ({head}); search again with `farm run` (or `farm search`) to verify a kernel of the "
            f"task as it is now, or pass {allow} to take them as they are")


def guard(store: Store, settings, metas: list[dict], kind: str, allow_stale: bool = False) -> list[str]:
    """fetch/export: each promoted kernel's best.json judged against the current task file and
    reference data; its judgement goes into the metadata ("provenance_check"). Stale kernels are
    refused in one line unless `allow_stale`; returns the names of kernels of unknown provenance
    (promoted before provenance was kept), which go on, flagged."""
    shas = reference_shas(store)
    tasks = tasks_by_key(settings, [(m["source"], m["op"]) for m in metas]) if settings is not None else {}
    stale, unknown = [], []
    for meta in metas:
        judged = check(meta, current(tasks.get(f"{meta['source']}/{meta['op']}"), shas(meta["source"], meta["op"])))
        meta["provenance_check"] = {"status": judged["status"], "why": judged["why"]}
        name = f"{meta['target']}/{meta['source']}/{meta['op']}"
        if judged["status"] == STALE:
            stale.append((name, judged))
        elif judged["status"] == UNKNOWN:
            unknown.append(name)
    if stale and not allow_stale:
        raise FarmError(refusal(kind, stale, "--allow-stale"))
    return unknown
