"""A distributed run as the store keeps it; everything `farm status` shows comes from here.

    runs/index.json                        every run, local or submitted: when, source, target (farm.search.catalog)
    runs/<run>/run.json                    what was submitted (RunSpec), and a cancellation
    runs/<run>/<source>/<op>/status.json   where each op is: phase, worker, counts, best, error
    runs/<run>/<source>/<op>/state.json    the search checkpoint (farm.search.controller)
    runs/<run>/changed.json                rewritten with every change to the run: readers that cache
                                           (the exporter) re-read a run only when its sha256 moved

status.json is written by the tasks (farm.distributed.work) through Store.update_json, so a status
read never needs Redis and costs one small object per op.
"""

from __future__ import annotations

import datetime as _dt
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from farm.corpus.tasks import validate_name
from farm.errors import FarmError
from farm.evaluate.options import EvalOptions
from farm.evaluate.timing import INTERPRETER
from farm.reference.manifest import now
from farm.search import catalog, ledger
from farm.search.context import SearchConfig
from farm.search.results import best_speedup
from farm.storage import Store
from farm.targets import known

TERMINAL = ("done", "failed", "cancelled")
PHASES = ("queued", "reference", "searching", "interrupted", "cancelling") + TERMINAL


@dataclass
class RunSpec:
    """What `farm submit` asked for; workers rebuild the search from it."""

    run: str
    source: str
    ops: list[str]
    target: str
    reference_target: str
    shapes: str
    generators: list[str]
    max_tasks: int
    chunk_candidates: int
    max_concurrent: int
    seed: int = 0
    reference_seed: int = 0
    flush: str = "write"  # the timer's cache flush (farm.evaluate.timing)
    timing_mode: str = "auto"  # events, graph, or auto (farm.evaluate.timing.choose_mode)
    created_at: str = field(default_factory=now)

    def search_config(self) -> SearchConfig:
        return SearchConfig(max_tasks=self.max_tasks, max_concurrent=self.max_concurrent,
                            chunk_size=self.chunk_candidates, generators=tuple(self.generators), seed=self.seed)

    def evaluation(self) -> EvalOptions:
        """What the run's evaluators are asked (the submitted --flush and --timing-mode)."""
        return EvalOptions(flush=self.flush, timing_mode=self.timing_mode)

    def params(self) -> dict[str, Any]:
        """Everything but the creation time: two submissions of one run must agree on these."""
        return {k: v for k, v in asdict(self).items() if k != "created_at"}

    @classmethod
    def from_dict(cls, doc: dict) -> RunSpec:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


def run_key(run: str) -> str:
    return f"runs/{validate_name(run, 'run')}/run.json"


def status_key(run: str, source: str, op: str) -> str:
    return f"runs/{run}/{source}/{op}/status.json"


def default_run_name(source: str, target: str) -> str:
    return f"{source}-{target}-" + _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")


def save_run(store: Store, spec: RunSpec) -> tuple[RunSpec, bool]:
    """Record a run; returns (the stored spec, created). Submitting an existing run again is
    allowed with the same parameters (its tasks have the same ids, so nothing runs twice)."""

    def mutate(doc: dict) -> dict:
        if doc:
            stored = RunSpec.from_dict(doc)
            if stored.params() != spec.params():
                diff = sorted(k for k, v in spec.params().items() if stored.params().get(k) != v)
                raise FarmError(f"run {spec.run} exists with other parameters ({', '.join(diff)}): "
                                "use another --run name")
            if doc.get("cancelled_at"):
                raise FarmError(f"run {spec.run} was cancelled at {doc['cancelled_at']}: use another --run name")
            return doc
        return {**asdict(spec), "cancelled_at": None}

    key = run_key(spec.run)
    existed = store.exists(key)
    doc = store.update_json(key, mutate)
    catalog.record(store, spec.run, "distributed", [spec.source], spec.target, created_at=doc["created_at"])
    touch(store, spec.run)
    return RunSpec.from_dict(doc), not existed


def touch(store: Store, run: str) -> None:
    """Say that the run changed (one small whole-object write; the last writer wins, which is all
    a reader needs: a new sha256)."""
    store.put_bytes(f"runs/{run}/changed.json", f'{{"at": "{now()}", "id": "{uuid.uuid4().hex}"}}\n'.encode())


def run_version(store: Store, run: str, entry: dict) -> tuple:
    """Changes whenever the run's status can have changed (see `touch`)."""
    stamp = store.head(f"runs/{run}/changed.json")
    version: tuple = (stamp.sha256 if stamp else None, tuple(sorted((k, str(v)) for k, v in entry.items())))
    if entry.get("kind") == "local":
        led = store.head(ledger.key(run))
        version += (led.sha256 if led else None,)
    return version


def load_run(store: Store, run: str) -> tuple[RunSpec, dict]:
    """The spec and the raw record (with cancelled_at)."""
    doc = store.read_json(run_key(run))
    if not doc:
        raise FarmError(f"no run {run!r} in {store.url} (farm status --all lists the runs)")
    return RunSpec.from_dict(doc), doc


def cancel_run(store: Store, run: str) -> dict:
    load_run(store, run)
    doc = store.update_json(run_key(run), lambda doc: {**doc, "cancelled_at": doc.get("cancelled_at") or now()})
    touch(store, run)
    return doc


def list_runs(store: Store) -> dict[str, dict]:
    return catalog.runs(store)


def latest_run(store: Store) -> str:
    return catalog.latest(store)


def update_op(store: Store, run: str, source: str, op: str, **changes: Any) -> dict:
    """Merge `changes` into the op's status.json; a terminal phase is never left again."""

    def mutate(doc: dict) -> dict:
        new = dict(changes)
        if doc.get("phase") in TERMINAL and new.get("phase") not in (None, *TERMINAL):
            del new["phase"]
        started = doc.get("started_at") or (now() if new.get("phase") not in (None, "queued") else None)
        return {**doc, **new, "source": source, "op": op, "started_at": started, "updated_at": now()}

    doc = store.update_json(status_key(run, source, op), mutate)
    touch(store, run)
    return doc


def op_status(store: Store, run: str, source: str, op: str) -> dict:
    return store.read_json(status_key(run, source, op))


READERS = 16  # status.json reads in flight: a run of thousands of ops on S3 is read in seconds


def read_statuses(store: Store, run: str, source: str, ops: list[str]) -> dict[str, dict]:
    """Every op's status.json, read concurrently (each is one small object)."""
    if len(ops) < 2 * READERS:
        return {op: op_status(store, run, source, op) for op in ops}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(READERS, thread_name_prefix="farm-status") as pool:
        return dict(zip(ops, pool.map(lambda op: op_status(store, run, source, op), ops)))


# ---------------------------------------------------------------- the view `farm status` prints


def is_local(store: Store, run: str) -> bool:
    """A run of `farm run` or `farm search` (in one process): no run.json, but an index entry,
    a ledger or an op's folder."""
    if store.exists(run_key(run)):
        return False
    return catalog.entry(store, run).get("kind") == "local" or store.exists(ledger.key(run)) or any(
        True for _ in store.list(f"runs/{validate_name(run, 'run')}/"))


def _local_row(source: str, op: str, phase: str, **fields: Any) -> dict[str, Any]:
    row = {"source": source, "op": op, "phase": phase, "reference": "local", "chunk": 0, "tried": 0, "passed": 0,
           "best_speedup": None, "best_time_ms": None, "best_timing_mode": None, "best_retimed": None, "worker": "local", "redeliveries": 0, "started_at": None,
           "updated_at": None, "error": "", "verdicts": {}}
    return {**row, **{k: v for k, v in fields.items() if v is not None}}


def op_best(status: dict) -> dict[str, Any] | None:
    """An op's best speedup from its status.json (farm.search.results.best_speedup): its
    outcome's once the search finished, else the search's best so far (not re-timed yet)."""
    if status.get("outcome"):
        return best_speedup(status["outcome"])
    return best_speedup({"speedup_vs_model": status.get("best_speedup"), "time_ms": status.get("best_time_ms"),
                         "timing_mode": status.get("best_timing_mode"), "retimed": False})


def _best_fields(best: dict | None) -> dict[str, Any]:
    """A status row's best-speedup columns from best_speedup's figure."""
    best = best or {}
    return {"best_speedup": best.get("speedup_vs_model"), "best_time_ms": best.get("time_ms"),
            "best_timing_mode": best.get("timing_mode"), "best_retimed": best.get("retimed")}


def _from_ledger(name: str, entry: dict) -> dict[str, Any]:
    result = entry.get("result", {})
    source, _, op = name.partition("/")
    phase = {"done": "done", "interrupted": "interrupted"}.get(entry.get("status") or "", "failed")
    # the op's own outcome and why it stopped, as the batch wrote them when the op ended
    return _local_row(source, op, phase, result=result.get("status"), stop_reason=result.get("stop_reason"),
                      tried=result.get("submitted", 0), passed=result.get("passed", 0),
                      **_best_fields(best_speedup(result)),
                      started_at=result.get("started_at"), elapsed_s=result.get("elapsed_s"),
                      updated_at=entry.get("updated_at"), error=result.get("error", ""))


def _from_folder(store: Store, run: str, source: str, op: str, files: set[str], alive: bool | None) -> dict:
    """An op the ledger does not list: a `farm search --op` (its report), or one in progress or
    interrupted (its checkpoint)."""
    base = f"runs/{run}/{source}/{op}/"
    if "report.json" in files:
        rep = store.read_json(base + "report.json")
        return _local_row(source, op, "failed" if rep.get("status") == "failed" else "done",
                          tried=rep.get("submitted", 0), passed=rep.get("passed", 0), **_best_fields(best_speedup(rep)),
                          started_at=rep.get("started_at"), updated_at=rep.get("finished_at"),
                          error=rep.get("error", ""))
    state = store.read_json(base + "state.json")
    records = state.get("db", {}).get("records", [])
    return _local_row(source, op, "interrupted" if alive is False else "searching", chunk=state.get("chunks_done", 0),
                      tried=len(records), passed=sum(1 for r in records if r.get("verdict") == "pass"),
                      started_at=state.get("started_at"),
                      error="the process searching it ended: run the same command again to resume" if alive is False
                      else "")


def summarize_local(store: Store, run: str) -> dict[str, Any]:
    """The status view of a local run: finished ops from its ledger, the others (a single-op
    search, an op in progress or interrupted) from their folders."""
    entry = catalog.entry(store, run)
    alive = catalog.process_alive(entry)
    done = ledger.read(store, run)
    rows = {name: _from_ledger(name, e) for name, e in done.items()}
    if not entry.get("planned") or len(rows) < entry["planned"]:
        for (source, op), files in catalog.op_files(store, run, ("report.json", "state.json")).items():
            if f"{source}/{op}" not in rows:
                rows[f"{source}/{op}"] = _from_folder(store, run, source, op, files, alive)
    ops = _interpreted([rows[k] for k in sorted(rows)], entry.get("target"))
    if not ops and not entry:
        raise FarmError(f"no run {run!r} in {store.url} (farm status --all lists the runs)")
    count = lambda phase: sum(1 for r in ops if r["phase"] == phase)  # noqa: E731
    planned = max(entry.get("planned") or 0, len(ops))
    finished = sum(1 for r in ops if r["phase"] in TERMINAL)
    status = ("finished" if finished == planned else "interrupted" if alive is False else "running")
    totals = {"ops": planned, "done": count("done"), "failed": count("failed"), "cancelled": 0,
              "finished": finished, "searching": count("searching"), "tried": sum(r["tried"] for r in ops),
              "passed": sum(r["passed"] for r in ops), "budget": "-"}
    spec = {"local": True, "source": entry.get("source") or ",".join(sorted({r["source"] for r in ops})),
            "target": entry.get("target", "?")}
    return {"run": run, "store": store.url, "status": status, "kind": "local", "spec": spec,
            "created_at": entry.get("created_at"), "cancelled_at": None, "totals": totals,
            "eta_s": 0.0 if status == "finished" else None, "ops": ops}


def summarize(store: Store, run: str) -> dict[str, Any]:
    """Per op: phase, reference, candidates tried and passed, best speedup, worker; totals and ETA."""
    if is_local(store, run):
        return summarize_local(store, run)
    spec, doc = load_run(store, run)
    statuses = read_statuses(store, run, spec.source, spec.ops)
    rows = []
    for op in spec.ops:
        st = statuses[op]
        stored = phase = st.get("phase", "queued")
        if doc.get("cancelled_at") and phase not in TERMINAL:
            # a chunk that runs finishes and checkpoints first; the tasks clear `running` at the end
            phase = "cancelling" if st.get("running") else "cancelled"
        rows.append({"source": spec.source, "op": op, "phase": phase, "stored_phase": stored,
                     "reference": st.get("reference", "-"),
                     "chunk": st.get("chunk", 0), "tried": st.get("tried", 0), "passed": st.get("passed", 0),
                     **_best_fields(op_best(st)),
                     "worker": st.get("worker", ""), "redeliveries": st.get("redeliveries", 0),
                     "started_at": st.get("started_at"), "updated_at": st.get("updated_at"),
                     "error": st.get("error", ""), "verdicts": st.get("verdicts", {}), "running": st.get("running"),
                     "recovered": st.get("recovered", [])})
    rows = _interpreted(rows, spec.target)
    totals = _totals(rows, spec)
    if doc.get("cancelled_at"):
        status = "cancelling" if any(r["phase"] == "cancelling" for r in rows) else "cancelled"
    else:
        status = "finished" if totals["finished"] == len(rows) else "running"
    return {"run": run, "store": store.url, "status": status, "kind": "distributed", "spec": spec.params(),
            "created_at": spec.created_at,
            "cancelled_at": doc.get("cancelled_at"), "totals": totals, "eta_s": _eta(rows, spec, totals),
            "ops": rows}


def _interpreted(rows: list[dict], target: str | None) -> list[dict]:
    """The rows of a run on an interpreting target (cpu): a best figure an outcome written before
    they were labelled so calls "events" is the interpreter's, and says so (timing.INTERPRETER)."""
    if (t := known(target)) is not None and t.interpret:
        for row in rows:
            if row.get("best_timing_mode") == "events":
                row["best_timing_mode"] = INTERPRETER
    return rows


def _totals(rows: list[dict], spec: RunSpec) -> dict[str, int]:
    def count(phase):
        return sum(1 for r in rows if r["phase"] == phase)

    return {"ops": len(rows), "done": count("done"), "failed": count("failed"), "cancelled": count("cancelled"),
            "finished": sum(1 for r in rows if r["phase"] in TERMINAL), "searching": count("searching"),
            "tried": sum(r["tried"] for r in rows), "passed": sum(r["passed"] for r in rows),
            "budget": spec.max_tasks * len(rows)}


def _eta(rows: list[dict], spec: RunSpec, totals: dict) -> float | None:
    """Seconds left at the rate candidates have been tried since the first op started."""
    if totals["finished"] == len(rows):
        return 0.0
    starts = [r["started_at"] for r in rows if r["started_at"]]
    if not starts or not totals["tried"]:
        return None
    elapsed = (_dt.datetime.now(_dt.timezone.utc) - _dt.datetime.fromisoformat(min(starts))).total_seconds()
    left = sum(max(spec.max_tasks - r["tried"], 0) for r in rows if r["phase"] not in TERMINAL)
    return round(left * max(elapsed, 1.0) / totals["tried"], 1)
