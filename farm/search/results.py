"""What a finished search leaves behind, per op:

    runs/<run>/<source>/<op>/report.json      every candidate: parent, generator, outcome, timing
    runs/<run>/<source>/<op>/lineage.mmd      the lineage as a Mermaid graph
    runs/<run>/<source>/<op>/candidates/<id>.py
    kernels/<target>/<source>/<op>/best.py    self-contained, importable, with a header
    kernels/<target>/<source>/<op>/best.json  what best.py is and how it was verified

and, per op, an `OpOutcome` (the batch's row and ledger entry).

A best kernel is promoted only if its re-timing against the Model in a fresh runner shows it
faster with 95% confidence where the Model runs (farm.evaluate.speedup.promotion), and if it
beats the one already there on the same device in the same timing mode. best.json and the
header of best.py carry the re-timed figures, their timing mode and the fraction of the
device's physical limit.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from farm.evaluate import verified
from farm.evaluate.timing import mode_of
from farm.search import provenance
from farm.search.database import Database, Record
from farm.storage import Store
from farm.storage.base import dump_json

log = logging.getLogger(__name__)


@dataclass
class OpOutcome:
    """One op's search, as a batch, the ledger and the leaderboard see it."""

    source: str
    op: str
    status: str  # succeeded | zero_pass | failed
    stop_reason: str
    submitted: int = 0
    passed: int = 0
    best_id: str | None = None
    best_time_ms: float | None = None
    speedup_vs_model: float | None = None
    speedup_vs_reference: float | None = None
    baseline: dict = field(default_factory=dict)
    error: str = ""
    promoted: bool = False
    transient: bool = False  # failed for a reason of the moment (disk full, lost connection): retry
    promotion: str = ""  # why the best was promoted or not (farm.evaluate.speedup.promotion)
    timing_mode: str = ""
    fraction_of_limit: float | None = None
    ref_sha256: str = ""  # the reference data searched on: a batch does not skip an op whose data changed
    provenance: dict = field(default_factory=dict)  # task file, reference data, farm version (farm.search.provenance)
    retimed: bool | None = None  # the figures are the end-of-search re-timing's (best_speedup); None: not recorded
    retired: str = ""  # what changed since this run's earlier result of the op, which was retired (searched again)
    unseen_inputs: bool | None = None  # passes checked beyond the .pt (farm.evaluate.verified)
    verified: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OpOutcome":
        """A finished search's outcome as its checkpoint keeps it (fields it lacks take defaults)."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def op_prefix(run: str, source: str, op: str) -> str:
    return f"runs/{run}/{source}/{op}"


def kernel_prefix(target: str, source: str, op: str) -> str:
    return f"kernels/{target}/{source}/{op}"


def lineage_graph(db: Database) -> str:
    lines = ["graph TD"]
    for rec in db.records.values():
        label = f"{rec.id} {rec.generator}"
        label += f"<br/>{rec.time_ms:.4g} ms" if rec.passed else f"<br/>{rec.verdict}"
        lines.append(f'  {rec.id}["{label}"]')
        if rec.parent:
            lines.append(f"  {rec.parent} --> {rec.id}")
    best = db.best()
    if best:
        lines.append(f"  style {best.id} stroke-width:4px")
    return "\n".join(lines) + "\n"


def candidate_row(rec: Record) -> dict[str, Any]:
    return {"id": rec.id, "parent": rec.parent, "generator": rec.generator, "note": rec.note,
            "lineage": rec.lineage, "generation": rec.generation, "verdict": rec.verdict, "error": rec.reason,
            "time_ms": rec.time_ms, "speedup_vs_model": rec.speedup_vs_model,
            "speedup_vs_reference": rec.speedup_vs_reference, "timing": rec.timing, "eval_s": rec.eval_s,
            "stage_s": rec.stage_s,
            "device": rec.device, "sandbox": rec.sandbox, "chunk": rec.chunk, "backward": rec.backward,
            "inspirations": rec.inspirations, "timing_mode": mode_of(rec.timing) or None,
            "comparison": rec.comparison, "limit": rec.limit, "fraction_of_limit": (rec.limit or {}).get("fraction")}


def write_candidates(store: Store, prefix: str, records: list[Record]) -> None:
    for rec in records:
        store.put_bytes(f"{prefix}/candidates/{rec.id}.py", rec.source.encode())


def write_report(store: Store, prefix: str, summary: dict[str, Any], db: Database) -> dict[str, Any]:
    report = {**summary, "candidates": [candidate_row(r) for r in db.records.values()],
              "lineage_graph": lineage_graph(db)}
    store.put_bytes(f"{prefix}/report.json", dump_json(report))
    store.put_bytes(f"{prefix}/lineage.mmd", report["lineage_graph"].encode())
    return report


def best_header(summary: dict[str, Any], rec: Record) -> str:
    def fmt(v):
        return "n/a" if v is None else f"{v:.3f}x"

    how = summary.get("verified", {})
    figures = retimed_figures(summary, rec)
    return (
        f'"""Kernel Farm best kernel: {summary["source"]}/{summary["op"]} for target {summary["target"]}.\n\n'
        f"Device: {summary.get('device_name', '?')}\n"
        f"Run: {summary['run']}  candidate: {rec.id} ({rec.generator}, generation {rec.generation}, lineage {rec.lineage})\n"
        f"Median time: {figures['time_ms']:.6g} ms ({figures['timing_mode']})  speedup vs original Model: "
        f"{fmt(figures['speedup_vs_model'])}  vs PyTorch Reference: {fmt(figures['speedup_vs_reference'])}\n"
        f"Re-timed against the Model in a fresh runner: {summary.get('promotion', {}).get('reason', 'no')}\n"
        f"Verified: outputs against the reference data {how.get('ref_sha256', '?')[:16]}... "
        f"({how.get('ref_device', '?')}), a bitwise-identical second run, unchanged inputs,\n"
        f"Triton launches observed at run time, and {_unseen(how)}; tolerance policy farm/runtime/tolerance.py.\n"
        f"{_provenance_line(summary.get('provenance'))}\n"
        f"Use: from best import ModelNew; ModelNew(*get_init_inputs())(*inputs)\n"
        f'"""\n'
    )


def retimed_figures(summary: dict[str, Any], rec: Record) -> dict[str, Any]:
    """The figures a promoted kernel is reported with: the re-timing's where there is one."""
    return figures_of(summary.get("confirmation"), candidate_row(rec))


def with_figures(outcome: OpOutcome, summary: dict[str, Any], rec: Record) -> None:
    """An outcome's figures: the promoted kernel's (retimed_figures), as best_speedup reads them."""
    figures = retimed_figures(summary, rec)
    outcome.speedup_vs_model, outcome.speedup_vs_reference = figures["speedup_vs_model"], figures["speedup_vs_reference"]
    outcome.best_time_ms, outcome.timing_mode = figures["time_ms"], figures["timing_mode"]
    outcome.fraction_of_limit = figures["fraction_of_limit"]
    outcome.retimed = (summary.get("confirmation") or {}).get("time_ms") is not None


def figures_of(confirmation: dict | None, best: dict[str, Any]) -> dict[str, Any]:
    """The end-of-search re-timing's figures where it has them, else the best candidate's row
    (candidate_row, as report.json stores it under "best")."""
    conf = confirmation or {}
    if conf.get("time_ms") is not None:
        return {"time_ms": conf["time_ms"], "timing_mode": mode_of(conf.get("timing"), "?"),
                "speedup_vs_model": (conf.get("mix") or conf.get("model") or {}).get("ratio"),
                **_cases_of(conf.get("timing")),
                "speedup_vs_reference": (conf.get("reference") or {}).get("ratio"),
                "limit": conf.get("limit"), "fraction_of_limit": (conf.get("limit") or {}).get("fraction")}
    return {"time_ms": best.get("time_ms"), "timing_mode": mode_of(best.get("timing"), "events"),
            **_cases_of(best.get("timing")),
            "speedup_vs_model": best.get("speedup_vs_model"), "speedup_vs_reference": best.get("speedup_vs_reference"),
            "limit": best.get("limit"), "fraction_of_limit": (best.get("limit") or {}).get("fraction")}


def _provenance_line(prov: dict | None) -> str:
    prov = prov or {}
    return (f"Provenance: task file sha256 {str(prov.get('task_sha256') or '?')[:16]}..., reference data sha256 "
            f"{str(prov.get('ref_sha256') or '?')[:16]}..., verified by farm {prov.get('farm_version') or '?'}")


def best_speedup(doc: dict | None) -> dict[str, Any] | None:
    """THE best speedup of an op: the one figure the leaderboard, `farm status`, the report, the
    metrics, `farm fetch` and `farm export` show. It is the best kernel's speedup over the
    original Model as re-timed against it in a fresh runner at the end of the search (the
    figure promotion decided on), else (no re-timing: a search still running, a replay) the
    search's own figure; always with the timing mode it was measured in, and whether it was
    re-timed. `doc` is any record of an op's search: a report.json summary (confirmation and
    best), best.json, or an outcome (a batch row, a ledger entry's result, a status.json's
    outcome, which hold the figures this function gave when the search finished). None where
    nothing passed."""
    if not doc:
        return None
    if "best" in doc:  # report.json's summary: the best candidate's row and the re-timing
        if not doc.get("best"):
            return None
        fig = figures_of(doc.get("confirmation"), doc["best"])
        retimed = (doc.get("confirmation") or {}).get("time_ms") is not None
    else:  # best.json (figures_of's output at its top), an outcome (best_time_ms), a progress record
        fig = {"speedup_vs_model": doc.get("speedup_vs_model"), "timing_mode": stored_mode(doc),
               "time_ms": doc.get("time_ms", doc.get("best_time_ms"))}
        conf = doc.get("confirmation")
        retimed = (conf or {}).get("time_ms") is not None if "confirmation" in doc else doc.get("retimed") is not False
    if fig.get("speedup_vs_model") is None and fig.get("time_ms") is None:
        return None
    return {"speedup_vs_model": fig.get("speedup_vs_model"), "timing_mode": fig.get("timing_mode") or "",
            "time_ms": fig.get("time_ms"), "retimed": retimed}


def stored_mode(doc: dict, default: str = "") -> str:
    """The timing mode of a best.json, an outcome or a status row: "interpreter" for figures of an
    interpreting target, also where a record written before they were labelled so says "events"
    (its timing's method is the host clock: timing.mode_of)."""
    if (doc.get("timing") or {}).get("method") == "host_clock":
        return mode_of(doc["timing"])
    return doc.get("timing_mode") or default


def fmt_best(best: dict | None, digits: int = 2) -> str:
    """A best speedup as every text surface writes it: '1.08x (events)', '0.95x (graph, not re-timed)'."""
    if not best or best.get("speedup_vs_model") is None:
        return "-"
    extra = ", not re-timed" if not best.get("retimed", True) else ""
    return f"{best['speedup_vs_model']:.{digits}f}x ({best.get('timing_mode') or '?'}{extra})"


def _cases_of(timing: dict | None) -> dict[str, Any]:
    """The per-case figures of the serving mix (farm.evaluate.mix_timing) and the cases where the
    kernel is slower than the original: an export can route those sizes to the original."""
    rows = (timing or {}).get("cases") or []
    return {"timed_cases": rows,
            "slower_cases": [r for r in rows if r.get("speedup") is not None and r["speedup"] < 1.0]}


def _unseen(how: dict) -> str:
    """How the kernel was checked on inputs it had never seen."""
    return f"on unseen inputs: {verified.describe(how)}"


def promote(store: Store, target: str, summary: dict[str, Any], rec: Record) -> bool:
    """Make `rec` the op's best unless a faster one is there (same device, same timing mode:
    figures of different modes are not compared), or one checked on unseen inputs where this one
    was not (farm.evaluate.verified); best.json says which.

    A compare-and-swap: best.json is the one record of the op's best, the kernel's source inside
    it and a version that grows by one per promotion, replaced under the store's update_json
    (a lock on a file store, a conditional write on S3), so of two searches promoting at once the
    faster one stays whatever the order. best.py is written from that record afterwards."""
    prefix = kernel_prefix(target, summary["source"], summary["op"])
    figures = retimed_figures(summary, rec)
    source = best_header(summary, rec) + rec.source
    unseen = verified.unseen_checked(summary.get("verified"))
    meta = {"source": summary["source"], "op": summary["op"], "target": target, "run": summary["run"],
            "candidate": rec.id, "generator": rec.generator, **figures,
            "search": {"time_ms": rec.time_ms, "speedup_vs_model": rec.speedup_vs_model,
                       "speedup_vs_reference": rec.speedup_vs_reference, "comparison": rec.comparison},
            "device_name": summary.get("device_name"), "timing": rec.timing, "verified": summary.get("verified", {}),
            "unseen_inputs": unseen,
            "baseline": summary.get("baseline", {}), "confirmation": summary.get("confirmation"),
            "promotion": summary.get("promotion"), "provenance": summary.get("provenance") or {},
            "kernel_source": source, "kernel_sha256": hashlib.sha256(source.encode()).hexdigest()}
    won: list[bool] = []

    def swap(current: dict) -> dict:
        won.clear()
        if current and not replaces(current, meta):
            return current
        won.append(True)
        return {**meta, "version": int(current.get("version") or 0) + 1}

    store.update_json(f"{prefix}/best.json", swap)
    write_kernel_file(store, prefix)
    return bool(won)


def replaces(current: dict, new: dict) -> bool:
    """Whether a new best takes the place of the current one: times compared on the same device,
    or where either names none (best.json is per target: taken for the same device); a result
    naming no device never wins without that comparison (issue 37). Another named device's
    kernel replaces it (docs/search.md)."""
    was, now = provenance.recorded(current), new.get("provenance") or {}
    unseen = bool(new.get("unseen_inputs"))
    was_unseen = verified.unseen_checked(current.get("verified"))
    if provenance.changes({"task_sha256": was.get("task_sha256")}, {"task_sha256": now.get("task_sha256")}):
        return True  # verified on another task file: wrong for the task as it is, retired
    if not unseen and was_unseen:
        return False  # checked on the .pt alone never replaces a kernel checked on unseen inputs
    if provenance.changes(was, now):
        return True  # verified on other reference data: not a best to beat, retired
    device, new_device = current.get("device_name") or "", new.get("device_name") or ""
    comparable = (stored_mode(current, "events") == stored_mode(new, "events") and unseen == was_unseen
                  and current.get("time_ms") is not None and new.get("time_ms") is not None)
    if device and new_device and device != new_device:  # another device's figures are no bar (docs/search.md)
        log.info("promotion of %s/%s on %s replaces the best of %s without comparing times",
                 new.get("source"), new.get("op"), new_device, device)
        return True
    if comparable:  # same device, or one unnamed: the same target's (best.json is per target), so compared
        return current["time_ms"] > new["time_ms"]
    if device and not new_device and unseen == was_unseen:
        log.warning("promotion refused: the new best of %s/%s names no device and its time cannot be compared "
                    "with the stored best's (%s, %s mode): a kernel of unknown device never wins by default",
                    new.get("source"), new.get("op"), device, stored_mode(current, "events"))
        return False
    return True


def write_kernel_file(store: Store, prefix: str, attempts: int = 8) -> None:
    """best.py from the record as it is now, written again until the record did not change
    meanwhile: a writer that lost the swap, or wrote a record another one then replaced, leaves
    the newest kernel in best.py, not its own."""
    for _ in range(attempts):
        record = store.read_json(f"{prefix}/best.json")
        if "kernel_source" not in record:
            return  # a record of an older farm: its best.py is its own
        store.put_bytes(f"{prefix}/best.py", record["kernel_source"].encode())
        if store.read_json(f"{prefix}/best.json").get("version") == record.get("version"):
            return


def best_record(store: Store, key: str) -> dict:
    """best.json as listings show it: its metadata, the kernel's source left out."""
    return {k: v for k, v in store.read_json(key).items() if k != "kernel_source"}


def kernel_source(store: Store, prefix: str, record: dict | None = None) -> bytes:
    """The promoted kernel's source: the record's own (best.py may lag a promotion in flight by
    a moment), else best.py (records of an older farm)."""
    record = store.read_json(f"{prefix}/best.json") if record is None else record
    if "kernel_source" in record:
        return record["kernel_source"].encode()
    return store.get_bytes(f"{prefix}/best.py")


def load_report(store: Store, run: str, source: str, op: str) -> dict[str, Any]:
    return json.loads(store.get_bytes(f"{op_prefix(run, source, op)}/report.json"))


def baseline_spread(baseline: dict, kept: tuple[str, ...]) -> dict:
    """How each baseline's median was measured (reps, spread, timer), for reports."""
    return {k[:-len("_timing")]: {f: v[f] for f in kept if f in v}
            for k, v in baseline.items() if k.endswith("_timing") and isinstance(v, dict)}


def verified_fields(how: dict) -> dict[str, Any]:
    """An outcome's word on unseen inputs (farm.evaluate.verified)."""
    if not how:
        return {}
    return {"unseen_inputs": verified.unseen_checked(how), "verified": verified.short(how)}
