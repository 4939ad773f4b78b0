"""What the distributed tasks do. Each is an ordinary function of plain arguments (run, source,
op, chunk); the Celery tasks (farm.distributed.tasks) only pass them the delivery's context and turn
a `Retry` into Celery's retry.

Delivery rules, the same for both kinds of task:

- a task id derives from run, op and chunk; a done mark per id makes a duplicate return;
- one lock per (run, source, op): a second copy waits (Retry) until the first ends or its
  worker dies and the lock lapses;
- a redelivered message (its worker died, or a hard time limit) is counted; past
  queue.max_redeliveries the op is marked failed instead of being tried forever;
- storage or broker unreachable: retried with backoff, MAX_ERROR_RETRIES times;
- any other error fails the op with its message; nothing is left hanging.

A search chunk resumes from the op's checkpoint, runs one bounded chunk (queue.chunk_candidates
candidates; none starts after half of queue.chunk_time_limit_s), checkpoints, and enqueues the
next chunk, whose id is that of the new checkpoint.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import redis
from kombu.exceptions import OperationalError

from farm.config import Settings, load_settings
from farm.corpus import tasks as corpus
from farm.distributed.coord import Coordinator, redis_url
from farm.distributed.queues import DEVICE_ENV, REFERENCE_TASK, SEARCH_TASK, queue_name
from farm.distributed.runs import RunSpec, load_run, update_op
from farm.errors import FarmError, IntegrityError, StorageError
from farm.generators import load_generator
from farm.observe import metrics
from farm.reference.generate import generate_references
from farm.reference.manifest import now
from farm.search.batch import load_reference
from farm.search.controller import OpOutcome, OpSearch
from farm.storage import Store, open_store
from farm.targets import DeviceSpec, resolve_device

log = logging.getLogger(__name__)

MAX_ERROR_RETRIES = 10  # storage/broker errors per task before its op is failed
LOCK_WAIT_S = 5.0  # a copy that finds its op locked tries again after this


class OpFailed(FarmError):
    """The op cannot go on (its reference data failed, ...): mark it failed."""


class Retry(Exception):
    """Run this task again later (the Celery task raises self.retry)."""

    def __init__(self, countdown: float, reason: str):
        super().__init__(reason)
        self.countdown = countdown


@dataclass
class Delivery:
    """What a task knows about the message it was started by."""

    task_id: str
    hostname: str
    redelivered: bool = False


def reference_task_id(run: str, source: str, op: str) -> str:
    return f"{run}:{source}:{op}:reference"


def search_task_id(run: str, source: str, op: str, chunk: int) -> str:
    return f"{run}:{source}:{op}:search:{chunk}"


# ---------------------------------------------------------------- per-process context


@dataclass
class _Env:
    settings: Settings
    store: Store
    coord: Coordinator


_env: _Env | None = None
_env_lock = threading.Lock()


def env() -> _Env:
    """Settings, store and Redis of this worker process, made once."""
    global _env
    with _env_lock:
        if _env is None:
            settings = load_settings()[0]
            _env = _Env(settings, open_store(settings.store, settings), Coordinator(redis_url(settings.queue)))
        return _env


def worker_device(target: str) -> DeviceSpec:
    """The device this worker owns: FARM_WORKER_DEVICE, else the index its mask shows, else device 0."""
    spec = resolve_device(os.environ.get(DEVICE_ENV) or target, default_target=target)
    visible = spec.target.visible_env and os.environ.get(spec.target.visible_env, "")
    if DEVICE_ENV not in os.environ and visible and visible.isdigit():
        spec = resolve_device(f"{target}:{visible}")  # a hand-started worker under CUDA_VISIBLE_DEVICES=3
    if spec.target.name != target:
        raise FarmError(f"this worker owns {spec.label}, but the task is for target {target}: check the queues "
                        f"it consumes (-Q {queue_name('search', spec.target.name)})")
    return spec


# ---------------------------------------------------------------- enqueueing


# By task name, not through the task objects: farm.distributed.tasks wraps this module, and a
# name is also what a worker of another version still understands.
def enqueue_reference(spec: RunSpec, op: str, force: bool) -> str:
    from farm.distributed.celery_app import app

    task_id = reference_task_id(spec.run, spec.source, op)
    app.send_task(REFERENCE_TASK, (spec.run, spec.source, op, force), task_id=task_id,
                  queue=queue_name("reference", spec.reference_target))
    return task_id


def enqueue_search(spec: RunSpec, source: str, op: str, chunk: int) -> str:
    from farm.distributed.celery_app import app

    task_id = search_task_id(spec.run, source, op, chunk)
    app.send_task(SEARCH_TASK, (spec.run, source, op, chunk), task_id=task_id, queue=queue_name("search", spec.target))
    return task_id


# ---------------------------------------------------------------- the frame both tasks share

TRANSIENT = (StorageError, redis.ConnectionError, redis.TimeoutError, OperationalError)


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT) and not isinstance(exc, IntegrityError)


def run_task(kind: str, delivery: Delivery, run: str, source: str, op: str,
             body: Callable[[_Env, RunSpec], dict[str, Any]]) -> dict[str, Any]:
    """Dedup, lock, cap redeliveries, check cancellation, run `body`, mark done; map errors."""
    from celery.exceptions import SoftTimeLimitExceeded

    e = env()
    try:
        if e.coord.is_done(delivery.task_id):
            return {"task": delivery.task_id, "skipped": "done already"}
        if delivery.redelivered:
            e.coord.count("redelivered", delivery.task_id)
        lock = e.coord.lock(f"{run}:{source}:{op}", delivery.hostname)
        if not lock.acquire():
            raise Retry(LOCK_WAIT_S, f"{source}/{op} of run {run} is busy on {lock.holder()}")
    except TRANSIENT as exc:  # Redis gone for longer than its client retries
        raise Retry(30.0, str(exc)) from None
    try:
        if e.coord.is_done(delivery.task_id):  # finished while we waited for the lock
            return {"task": delivery.task_id, "skipped": "done already"}
        spec, doc = load_run(e.store, run)
        if doc.get("cancelled_at"):
            update_op(e.store, run, source, op, phase="cancelled")
            return _finish(e, delivery, {"skipped": "cancelled"})
        redeliveries = e.coord.counter("redelivered", delivery.task_id)
        if redeliveries:
            update_op(e.store, run, source, op, redeliveries=redeliveries)
        if redeliveries > e.settings.queue.max_redeliveries:
            return _fail(e, delivery, run, source, op, f"{kind} task {delivery.task_id} was delivered "
                         f"{redeliveries + 1} times: its worker died or hit the time limit each time "
                         f"(queue.max_redeliveries={e.settings.queue.max_redeliveries})")
        return _finish(e, delivery, body(e, spec))
    except SoftTimeLimitExceeded:
        n = e.coord.count("redelivered", delivery.task_id)
        log.warning("%s hit its soft time limit (%d); it runs again from the last checkpoint", delivery.task_id, n)
        raise Retry(0, "soft time limit") from None
    except Retry:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure ends as a retry or a failed op, never a hang
        return _handle_error(e, delivery, run, source, op, exc)
    finally:
        lock.release()


def _finish(e: _Env, delivery: Delivery, result: dict[str, Any]) -> dict[str, Any]:
    e.coord.mark_done(delivery.task_id)
    return {"task": delivery.task_id, **result}


def _fail(e: _Env, delivery: Delivery, run: str, source: str, op: str, error: str) -> dict[str, Any]:
    log.error("%s/%s of run %s failed: %s", source, op, run, error)
    update_op(e.store, run, source, op, phase="failed", error=error[-2000:], finished_at=now())
    return _finish(e, delivery, {"failed": error[-500:]})


def _handle_error(e: _Env, delivery: Delivery, run: str, source: str, op: str, exc: Exception) -> dict[str, Any]:
    if _is_transient(exc):
        try:
            n = e.coord.count("errors", delivery.task_id)
        except TRANSIENT:  # Redis is what is missing: nothing to count with
            raise Retry(30.0, str(exc)) from None
        if n <= MAX_ERROR_RETRIES:
            countdown = min(2.0 ** n, 120.0)
            log.warning("%s: %s; retry %d/%d in %.0f s", delivery.task_id, exc, n, MAX_ERROR_RETRIES, countdown)
            raise Retry(countdown, str(exc)) from None
    elif not isinstance(exc, FarmError):
        log.exception("%s failed", delivery.task_id)
    try:
        return _fail(e, delivery, run, source, op, str(exc) if isinstance(exc, FarmError)
                     else f"{type(exc).__name__}: {exc}")
    except TRANSIENT as again:  # cannot even record the failure: try the whole task later
        raise Retry(30.0, str(again)) from None


# ---------------------------------------------------------------- reference


def reference_op(delivery: Delivery, run: str, source: str, op: str, force: bool = False) -> dict[str, Any]:
    """Reference data for one op on this worker's device (skipped when the stored .pt is
    current), then the op's first search chunk on search.<target>."""

    def body(e: _Env, spec: RunSpec) -> dict[str, Any]:
        device = worker_device(spec.reference_target)
        [ref] = corpus.find_tasks(e.settings, [source], [op])
        update_op(e.store, run, source, op, phase="reference", reference="running", worker=delivery.hostname)
        [entry] = generate_references([ref], e.store, device, spec.reference_seed, spec.shapes,
                                      e.settings.reference.timeout_s, force=force)
        if not entry.get("success"):
            raise OpFailed(f"reference data ({entry.get('stage')}): {entry.get('error')}")
        made = "current" if entry.get("skipped") else "generated"
        update_op(e.store, run, source, op, phase="searching", reference=made)
        nxt = enqueue_search(spec, source, op, 0)
        return {"reference": made, "sha256": entry.get("sha256"), "next": nxt}

    return run_task("reference", delivery, run, source, op, body)


# ---------------------------------------------------------------- search


class ChunkSearch(OpSearch):
    """OpSearch whose chunk also ends on time: once `chunk_seconds` have passed since the
    step began, no further candidate starts (the chunk keeps at least one)."""

    def __init__(self, *args, chunk_seconds: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunk_seconds = chunk_seconds
        self.deadline = float("inf")
        self.started_in_chunk: dict[int, int] = {}

    def step(self, max_chunks: int | None = 1, force: bool = False) -> OpOutcome | None:
        self.deadline = time.monotonic() + self.chunk_seconds
        return super().step(max_chunks=max_chunks, force=force)

    def _next(self, chunk: int):
        with self.lock:
            if self.started_in_chunk.get(chunk) and time.monotonic() > self.deadline:
                return None
        rec = super()._next(chunk)
        if rec is not None:
            with self.lock:
                self.started_in_chunk[chunk] = self.started_in_chunk.get(chunk, 0) + 1
        return rec


def _progress(search: OpSearch) -> dict[str, Any]:
    best = search.db.best()
    verdicts = Counter(r.verdict for r in search.db.records.values() if r.verdict != "pending")
    return {"chunk": search.chunks_done, "tried": search.db.submitted, "passed": len(search.db.passing()),
            "best_speedup": best.speedup_vs_model if best else None, "best_time_ms": best.time_ms if best else None,
            "verdicts": dict(sorted(verdicts.items()))}


def search_chunk(delivery: Delivery, run: str, source: str, op: str, chunk: int) -> dict[str, Any]:
    """One bounded chunk of the op's search, resumed from its checkpoint; then the next chunk."""

    def body(e: _Env, spec: RunSpec) -> dict[str, Any]:
        device = worker_device(spec.target)
        [ref] = corpus.find_tasks(e.settings, [source], [op])
        data = load_reference(e.store, source, op)
        events = CandidateLog(run, source, op, spec.target)
        search = ChunkSearch(ref, data, e.store, run, spec.target, [device],
                             [load_generator(g) for g in spec.generators], spec.search_config(),
                             on_event=events, chunk_seconds=e.settings.queue.chunk_time_limit_s / 2)
        state = search.restore()
        if state and state["status"] != "done" and search.chunks_done > chunk:
            # this chunk was done by an earlier delivery that died before its done mark:
            # make sure its continuation exists (a duplicate of it is harmless)
            return {"chunk": chunk, "next": enqueue_search(spec, source, op, search.chunks_done)}
        update_op(e.store, run, source, op, phase="searching", worker=delivery.hostname)
        started = time.monotonic()
        outcome = search.step(max_chunks=1)
        events.chunk_done(time.monotonic() - started)
        progress = _progress(search)
        if outcome is not None:
            phase = "failed" if outcome.status == "failed" else "done"
            update_op(e.store, run, source, op, phase=phase, outcome=outcome.as_dict(), error=outcome.error,
                      finished_at=now(), **progress)
            return {"chunk": chunk, "status": outcome.status, "best_id": outcome.best_id}
        if load_run(e.store, run)[1].get("cancelled_at"):
            update_op(e.store, run, source, op, phase="cancelled", **progress)
            return {"chunk": chunk, "cancelled": True}
        update_op(e.store, run, source, op, **progress)
        return {"chunk": chunk, "next": enqueue_search(spec, source, op, search.chunks_done)}

    return run_task("search", delivery, run, source, op, body)


class CandidateLog:
    """Logs each evaluated candidate and records it in the metrics: its verdict, the time of each
    evaluation stage, the op's best speedup, and how busy the device was over the chunk."""

    STAGES = ("compile", "verify", "time")

    def __init__(self, run: str, source: str, op: str, target: str):
        self.run, self.source, self.op, self.target = run, source, op, target
        self.busy_s: dict[str, float] = {}  # device -> seconds in evaluation stages this chunk

    def __call__(self, kind: str, info: dict) -> None:
        if kind != "candidate":
            return
        log.info("evaluated run=%s op=%s/%s candidate=%s verdict=%s", self.run, self.source, self.op,
                 info["id"], info["verdict"])
        metrics.CANDIDATES.labels(self.target, self.source, self.op, info.get("generator") or "unknown",
                                  info["verdict"]).inc()
        stages = info.get("stage_s") or {}
        for stage in self.STAGES:
            if stage in stages:
                metrics.STAGE_SECONDS.labels(self.target, stage).observe(stages[stage])
        device = metrics.device_label() or info.get("device") or ""
        self.busy_s[device] = self.busy_s.get(device, 0.0) + sum(stages.get(s, 0.0) for s in self.STAGES)
        if info["verdict"] == "pass" and info.get("speedup_vs_model"):
            key = (self.target, self.source, self.op)
            _best_seen[key] = max(info["speedup_vs_model"], _best_seen.get(key, 0.0))
            metrics.BEST_SPEEDUP.labels(*key).set(_best_seen[key])

    def chunk_done(self, wall_s: float) -> None:
        for device, busy in self.busy_s.items():
            metrics.DEVICE_BUSY.labels(self.target, device).set(min(1.0, busy / max(wall_s, 1e-9)))
        self.busy_s.clear()


# this process's best per (target, source, op); the gauge's 'max' mode takes the max over processes
_best_seen: dict[tuple[str, str, str], float] = {}
