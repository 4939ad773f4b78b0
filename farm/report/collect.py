"""A run as the store holds it, gathered into plain data for the page and the plots.

What a run leaves (docs/search.md, docs/distributed.md):

    runs/<run>/run.json                     a distributed run: what was submitted (RunSpec)
    runs/<run>/ledger.json                  a batch (farm run, farm search): one entry per op
    runs/<run>/<source>/<op>/status.json    a distributed op: phase, error, started/finished
    runs/<run>/<source>/<op>/report.json    a finished search: summary and every candidate
    runs/<run>/<source>/<op>/state.json     the checkpoint: every candidate so far
    runs/<run>/<source>/<op>/candidates/<id>.py

Nothing here computes a figure the store does not hold: a missing value stays None and the
page says "not measured" or "not recorded".
"""

from __future__ import annotations

import datetime as _dt
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from farm.errors import FarmError
from farm.search import catalog, provenance
from farm.search.results import best_speedup
from farm.storage import Store

RUNS = "runs/"
OP_FILES = ("report.json", "state.json", "status.json")
BASELINES = (("model", "the original Model"), ("reference", "the PyTorch Reference"),
             ("compile", "torch.compile of Reference"))


@dataclass
class OpView:
    source: str
    op: str
    status: str  # succeeded | zero_pass | failed | running | queued | cancelled
    stop_reason: str = ""
    error: str = ""
    summary: dict = field(default_factory=dict)  # report.json without its candidates
    candidates: list[dict] = field(default_factory=list)
    started_at: str | None = None
    finished_at: str | None = None
    promoted: bool | None = None
    ledger_result: dict = field(default_factory=dict)  # the ledger entry's result, where a batch recorded one
    provenance: dict = field(default_factory=dict)  # farm.search.provenance.check of its result; {} not judged

    @property
    def stale(self) -> bool:
        """Its result was verified on another task file or reference data than the current ones."""
        return self.provenance.get("status") == provenance.STALE

    @property
    def key(self) -> str:
        return f"{self.source}/{self.op}"

    @property
    def best(self) -> dict | None:
        return self.summary.get("best") or _best_of(self.candidates)

    @property
    def baseline(self) -> dict:
        return self.summary.get("baseline") or {}

    @property
    def passed(self) -> int:
        return sum(1 for c in self.candidates if c.get("verdict") == "pass")

    def speedup(self, basis: str) -> float | None:
        """The best kernel against one baseline: the end-of-search re-timing's ratio where there
        is one (interleaved rounds; the figure promotion decided on, docs/evaluator.md), else the
        search's stored figure, else the ratio of two stored medians measured in the same search
        (torch.compile's, when a search recorded it)."""
        best = self.best
        if not best:
            return None
        if basis == "model" and self.summary.get("best"):  # the one definition every surface shows
            return (best_speedup(self.summary) or {}).get("speedup_vs_model")
        retimed = self.retimed(basis)
        if retimed is not None:
            return retimed
        if best.get(f"speedup_vs_{basis}") is not None:
            return best[f"speedup_vs_{basis}"]
        base, ms = self.baseline.get(f"{basis}_ms"), best.get("time_ms")
        return base / ms if base and ms else None


    def retimed(self, basis: str) -> float | None:
        conf = self.summary.get("confirmation") or {}
        if conf.get("error") or conf.get("time_ms") is None:
            return None
        # against the Model, the serving mix's geomean where one was timed (farm.evaluate.mix_timing)
        return ((conf.get("mix") if basis == "model" else None) or conf.get(basis) or {}).get("ratio")


@dataclass
class RunView:
    run: str
    store: str
    kind: str  # distributed | batch | search
    ops: list[OpView]
    spec: dict = field(default_factory=dict)  # run.json, for a distributed run
    created_at: str | None = None

    def candidates(self) -> list[dict]:
        return [c for o in self.ops for c in o.candidates]


def _best_of(candidates: list[dict]) -> dict | None:
    passing = [c for c in candidates if c.get("verdict") == "pass" and c.get("time_ms") is not None]
    return min(passing, key=lambda c: (c["time_ms"], c["id"])) if passing else None


# ---------------------------------------------------------------- finding runs


def run_names(store: Store) -> dict[str, str | None]:
    """Every run in the store with the newest time it records (None where it records none)."""
    seen: dict[str, str | None] = {}
    for info in store.list(RUNS):
        parts = info.key.split("/")
        if len(parts) >= 3:
            seen.setdefault(parts[1], None)
    for name, entry in store.read_json(f"{RUNS}index.json").get("runs", {}).items():
        seen[name] = _later(seen.get(name), entry.get("created_at"))
    for name in list(seen):
        seen[name] = _later(seen[name], store.read_json(f"{RUNS}{name}/ledger.json").get("updated_at"))
    return seen


def _later(a: str | None, b: str | None) -> str | None:
    return max((t for t in (a, b) if t), default=None)


def latest_run(store: Store) -> str:
    """--latest: the run started last, local or distributed, as every command takes it."""
    return catalog.latest(store)


# ---------------------------------------------------------------- reading one run


def load_run(store: Store, run: str, settings=None) -> RunView:
    """The run's ops as the store holds them, each finished one's result judged against the
    current task file (where `settings` finds this machine's corpus) and reference data."""
    spec = store.read_json(f"{RUNS}{run}/run.json")
    ledger = store.read_json(f"{RUNS}{run}/ledger.json").get("ops", {})
    found = _op_dirs(store, run)
    names = [(spec["source"], op) for op in spec.get("ops", [])] if spec else []
    names += [tuple(k.split("/", 1)) for k in ledger]
    names += sorted(found)
    ops = [_load_op(store, run, s, o, ledger.get(f"{s}/{o}"), found.get((s, o), set()), spec)
           for s, o in dict.fromkeys(names)]
    if not ops:
        raise FarmError(f"no run {run!r} in {store.url}: `farm report --latest` takes the newest "
                        f"(runs here: {', '.join(sorted(run_names(store))) or 'none'})")
    kind = "distributed" if spec else ("batch" if ledger else "search")
    judge_provenance(store, settings, ops)
    return RunView(run, store.url, kind, ops, spec, spec.get("created_at") if spec else None)


def judge_provenance(store: Store, settings, ops: list[OpView]) -> None:
    """Each op with a kernel: its result's provenance (report.json, else its ledger entry) against
    the current task file and reference data (farm.search.provenance); unknown where it recorded none."""
    found = [o for o in ops if o.best]
    docs: dict[tuple[str, str], dict | None] = {
        (o.source, o.op): (o.summary if o.summary.get("verified") or o.summary.get("provenance") else o.ledger_result)
        for o in found}
    judged = provenance.judge(store, settings, docs) if docs else {}
    for o in found:
        o.provenance = judged[(o.source, o.op)]


def _op_dirs(store: Store, run: str) -> dict[tuple[str, str], set[str]]:
    return catalog.op_files(store, run, OP_FILES)


def _load_op(store: Store, run: str, source: str, op: str, ledger: dict | None, files: set[str],
             spec: dict) -> OpView:
    prefix = f"{RUNS}{run}/{source}/{op}"
    report = store.read_json(f"{prefix}/report.json") if "report.json" in files else {}
    status = store.read_json(f"{prefix}/status.json") if "status.json" in files else {}
    view = OpView(source, op, status="queued")
    if report:
        view.candidates = report.pop("candidates", [])
        report.pop("lineage_graph", None)
        view.summary = report
        view.status, view.stop_reason = report.get("status", "succeeded"), report.get("stop_reason", "")
    elif "state.json" in files:
        _from_state(view, store.read_json(f"{prefix}/state.json"))
    _apply_ledger(view, ledger)
    _apply_status(view, status)
    if not view.summary and spec:
        view.summary = {"target": spec.get("target")}
    return view


def _from_state(view: OpView, state: dict) -> None:
    """A search still running (or cut off): its checkpoint's candidates, nothing promoted."""
    keep = ("id", "parent", "generator", "note", "lineage", "generation", "verdict", "reason", "time_ms",
            "speedup_vs_model", "speedup_vs_reference", "timing", "eval_s", "device", "chunk", "inspirations")
    view.candidates = [{("error" if k == "reason" else k): r.get(k) for k in keep}
                       for r in state.get("db", {}).get("records", []) if r.get("verdict") != "pending"]
    if state.get("status") != "done":
        view.status = "running"
    else:  # finished, but its report.json is not (yet) there
        view.status = "succeeded" if _best_of(view.candidates) else "zero_pass"
    view.summary = {"target": state.get("target"), "config": state.get("config", {}),
                    "started_at": state.get("started_at")}


def _apply_ledger(view: OpView, entry: dict | None) -> None:
    if not entry:
        return
    result = entry.get("result", {})
    if entry.get("status") == "error" or result.get("status") == "failed":
        view.status, view.error = "failed", result.get("error", "")
    view.promoted = result.get("promoted")
    view.ledger_result = result
    view.finished_at = view.finished_at or entry.get("updated_at")


def _apply_status(view: OpView, st: dict) -> None:
    if not st:
        return
    phase = st.get("phase", "queued")
    if phase in ("failed", "cancelled"):
        view.status = phase
    elif phase in ("queued", "reference", "searching") and view.status == "queued":
        view.status = "queued" if phase == "queued" else "running"
    view.error = st.get("error") or view.error
    view.started_at = st.get("started_at")
    view.finished_at = st.get("finished_at") or view.finished_at


# ---------------------------------------------------------------- what the page reports


def op_times(view: OpView) -> tuple[str | None, str | None]:
    started = view.summary.get("started_at") or view.started_at
    finished = view.summary.get("finished_at") or view.finished_at
    return started, finished


def duration_s(run: RunView) -> float | None:
    """From the first op's start to the last op's end, where both are recorded."""
    starts = [s for s, _ in map(op_times, run.ops) if s]
    ends = [e for _, e in map(op_times, run.ops) if e]
    if not starts or not ends:
        return None
    first, last = min(map(_parse, starts)), max(map(_parse, ends))
    return max((last - first).total_seconds(), 0.0)


def _parse(stamp: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(stamp)


def totals(run: RunView) -> dict[str, Any]:
    cands = run.candidates()
    eval_s = [c["eval_s"] for c in cands if c.get("eval_s") is not None]
    device_s = sum(eval_s) if eval_s else None
    per_min = len(eval_s) / (device_s / 60.0) if device_s else None
    statuses = Counter(o.status for o in run.ops)
    return {"ops": len(run.ops), "statuses": dict(statuses), "verdicts": dict(Counter(c["verdict"] for c in cands)),
            "candidates": len(cands), "passed": sum(1 for c in cands if c["verdict"] == "pass"),
            "device_s": device_s, "per_device_minute": per_min, "duration_s": duration_s(run),
            "targets": sorted({o.summary.get("target") for o in run.ops if o.summary.get("target")}),
            "devices": sorted({c["device"] for c in cands if c.get("device")}),
            "device_names": sorted({o.summary["device_name"] for o in run.ops if o.summary.get("device_name")})}


_NUMBERS = re.compile(r"0x[0-9a-f]+|\d+(\.\d+)?", re.IGNORECASE)


def reason_key(verdict: str, error: str) -> str:
    """Failures alike up to the numbers in them (sizes, line numbers, times) share a group."""
    head = (error or "").strip().splitlines()[0] if (error or "").strip() else "(no message)"
    return f"{verdict}: {_NUMBERS.sub('N', head)[:160]}"


def failure_groups(run: RunView) -> list[dict[str, Any]]:
    """Rejected candidates and failed ops, grouped by verdict and message; largest first."""
    groups: dict[str, dict[str, Any]] = {}
    for op in run.ops:
        if op.status == "failed":
            _add(groups, f"op failed: {_NUMBERS.sub('N', op.error.strip()[:160]) or '(no message)'}", "op failed",
                 op.key, op.error)
        for c in op.candidates:
            if c.get("verdict") not in ("pass", "pending", None):
                _add(groups, reason_key(c["verdict"], c.get("error", "")), c["verdict"], op.key, c.get("error", ""))
    return sorted(groups.values(), key=lambda g: (-g["count"], g["key"]))


def _add(groups: dict, key: str, verdict: str, op: str, example: str) -> None:
    g = groups.setdefault(key, {"key": key, "verdict": verdict, "count": 0, "ops": [], "example": example})
    g["count"] += 1
    if op not in g["ops"]:
        g["ops"].append(op)


def verdicts_by_generator(run: RunView) -> dict[str, Counter]:
    table: dict[str, Counter] = defaultdict(Counter)
    for c in run.candidates():
        table[c.get("generator") or "?"][c["verdict"]] += 1
    return dict(sorted(table.items()))


def speedup_basis(view: OpView) -> str | None:
    """What an op's progress is measured against: the Model where it ran, else Reference."""
    for basis in ("model", "reference"):
        if any(c.get(f"speedup_vs_{basis}") for c in view.candidates):
            return basis
    return None


def best_so_far(view: OpView) -> tuple[str | None, list[float | None]]:
    """The best speedup after each candidate in the order they were proposed (ids are handed
    out in that order); None until the first pass."""
    basis = speedup_basis(view)
    best: float | None = None
    series = []
    for c in sorted(view.candidates, key=lambda c: c["id"]):
        value = c.get(f"speedup_vs_{basis}") if basis and c.get("verdict") == "pass" else None
        if value is not None:
            best = value if best is None else max(best, value)
        series.append(best)
    return basis, series


def ancestry(view: OpView, cand_id: str | None) -> list[str]:
    """The chain from a seed down to `cand_id` (parent -> child)."""
    by_id = {c["id"]: c for c in view.candidates}
    chain = []
    while cand_id and cand_id in by_id and cand_id not in chain:
        chain.append(cand_id)
        cand_id = by_id[cand_id].get("parent")
    return chain[::-1]
