"""What the distributed tasks do. Each is an ordinary function of plain arguments (run, source,
op, chunk); the Celery tasks (farm.distributed.tasks) only pass them the delivery's context and turn
a `Retry` into Celery's retry.

Delivery rules, the same for both kinds of task:

- a task id derives from run, op and chunk; a done mark per id makes a duplicate return;
- one lock per (run, source, op): a second copy waits (Retry) until the first ends or its
  worker dies and the lock lapses;
- a redelivered message (its worker died, or a hard time limit) is counted; past
  queue.max_redeliveries the op is marked failed instead of being tried forever;
- storage or broker unreachable: `Transient`, which Celery retries (autoretry_for, exponential
  backoff with full jitter, so a fleet does not come back all at once after an outage),
  MAX_ERROR_RETRIES times, then the op fails with the reason;
- the op's lock lapsed under a running task (`OpLock.lost`: Redis lost it, or could not be
  reached for queue.lock_ttl_s): the chunk stops at its next candidate and neither
  checkpoints nor enqueues; a copy that holds the lock now, or the reconciler, goes on;
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
from farm.corpus import tasks as taskfiles
from farm.distributed.coord import BACKOFF_MAX_S, BACKOFF_S, Coordinator, OpLock, Transient, redis_url
from farm.distributed.publish import enqueue_reference, enqueue_search, reference_task_id, search_task_id  # noqa: F401
from farm.distributed.queues import DEVICE_ENV, queue_name
from farm.distributed.runs import RunSpec, load_run, op_best, update_op
from farm.errors import FarmError, IntegrityError, StorageError
from farm.evaluate.timing import mode_of
from farm.generators import load_generator
from farm.observe import metrics
from farm.reference.generate import generate_references, reference_cases
from farm.reference.manifest import now
from farm.search.batch import load_reference
from farm.search.context import SearchContext
from farm.search.controller import OpOutcome, OpSearch
from farm.storage import Store, open_store
from farm.targets import DeviceSpec, resolve_device

log = logging.getLogger(__name__)

MAX_ERROR_RETRIES = 10  # storage/broker errors per task before its op is failed
LOCK_WAIT_S = 5.0  # a copy that finds its op locked tries again after this


class OpFailed(FarmError):
    """The op cannot go on (its reference data failed, ...): mark it failed."""


class Retry(Exception):
    """Run this task again after a fixed wait (a busy lock, a soft time limit): the Celery task
    raises self.retry with this countdown."""

    def __init__(self, countdown: float, reason: str):
        super().__init__(reason)
        self.countdown = countdown


class LockLost(Exception):
    """The op's lock lapsed while this task held it: stop, leave the op to whoever holds it now."""


@dataclass
class Delivery:
    """What a task knows about the message it was started by."""

    task_id: str
    hostname: str
    redelivered: bool = False


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
            _env = _Env(settings, open_store(settings.store, settings),
                        Coordinator(redis_url(settings.queue), settings.queue.lock_ttl_s))
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


# ---------------------------------------------------------------- the frame both tasks share

TRANSIENT = (StorageError, redis.ConnectionError, redis.TimeoutError, OperationalError)


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT) and not isinstance(exc, IntegrityError)


def run_task(kind: str, delivery: Delivery, run: str, source: str, op: str,
             body: Callable[[_Env, RunSpec, OpLock], dict[str, Any]]) -> dict[str, Any]:
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
            return _busy(e, delivery, run, source, op, lock)
        e.coord.forget("busy", delivery.task_id)
    except TRANSIENT as exc:  # Redis gone for longer than its client retries
        raise Transient(str(exc)) from None
    try:
        if e.coord.is_done(delivery.task_id):  # finished while we waited for the lock
            return {"task": delivery.task_id, "skipped": "done already"}
        spec, doc = load_run(e.store, run)
        if doc.get("cancelled_at"):
            update_op(e.store, run, source, op, phase="cancelled", running=None)
            return _finish(e, delivery, {"skipped": "cancelled"})
        redeliveries = e.coord.counter("redelivered", delivery.task_id)
        if redeliveries:
            update_op(e.store, run, source, op, redeliveries=redeliveries)
        if redeliveries > e.settings.queue.max_redeliveries:
            return _fail(e, delivery, run, source, op, f"{kind} task {delivery.task_id} was delivered "
                         f"{redeliveries + 1} times: its worker died or hit the time limit each time "
                         f"(queue.max_redeliveries={e.settings.queue.max_redeliveries})")
        return _finish(e, delivery, body(e, spec, lock))
    except LockLost as exc:
        log.error("%s stopped: %s", delivery.task_id, exc)
        return {"task": delivery.task_id, "stopped": str(exc)}  # no done mark: the task may run again
    except SoftTimeLimitExceeded:
        n = e.coord.count("redelivered", delivery.task_id)
        log.warning("%s hit its soft time limit (%d); it runs again from the last checkpoint", delivery.task_id, n)
        raise Retry(0, "soft time limit") from None
    except (Retry, Transient):
        raise
    except Exception as exc:  # noqa: BLE001 - every failure ends as a retry or a failed op, never a hang
        return _handle_error(e, delivery, run, source, op, exc)
    finally:
        lock.release()


def _busy(e: _Env, delivery: Delivery, run: str, source: str, op: str, lock: OpLock) -> dict[str, Any]:
    """Another copy holds the op. A dead holder's lock lapses within queue.lock_ttl_s, so a copy
    that still finds it held after twice that waits on a live holder, which carries the op's
    chain on: the copy is a duplicate and goes (no done mark; the reconciler is the backstop)."""
    holder = lock.holder()
    waits = e.coord.count("busy", delivery.task_id)
    if holder and waits * LOCK_WAIT_S > 2 * e.settings.queue.lock_ttl_s + LOCK_WAIT_S:
        e.coord.forget("busy", delivery.task_id)
        return {"task": delivery.task_id, "skipped": f"duplicate: {source}/{op} of run {run} runs on {holder}"}
    raise Retry(LOCK_WAIT_S, f"{source}/{op} of run {run} is busy on {holder}")


def _finish(e: _Env, delivery: Delivery, result: dict[str, Any]) -> dict[str, Any]:
    e.coord.mark_done(delivery.task_id)
    return {"task": delivery.task_id, **result}


def _fail(e: _Env, delivery: Delivery, run: str, source: str, op: str, error: str) -> dict[str, Any]:
    log.error("%s/%s of run %s failed: %s", source, op, run, error)
    update_op(e.store, run, source, op, phase="failed", error=error[-2000:], finished_at=now(), running=None)
    return _finish(e, delivery, {"failed": error[-500:]})


def _handle_error(e: _Env, delivery: Delivery, run: str, source: str, op: str, exc: Exception) -> dict[str, Any]:
    if _is_transient(exc):
        try:
            n = e.coord.count("errors", delivery.task_id)
        except TRANSIENT:  # Redis is what is missing: nothing to count with
            raise Transient(str(exc)) from None
        if n <= MAX_ERROR_RETRIES:
            log.warning("%s: %s; retry %d/%d in up to %.0f s (backoff with jitter)", delivery.task_id, exc, n,
                        MAX_ERROR_RETRIES, min(BACKOFF_S * 2.0 ** (n - 1), BACKOFF_MAX_S))
            raise Transient(str(exc)) from None
    elif not isinstance(exc, FarmError):
        log.exception("%s failed", delivery.task_id)
    try:
        return _fail(e, delivery, run, source, op, str(exc) if isinstance(exc, FarmError)
                     else f"{type(exc).__name__}: {exc}")
    except TRANSIENT as again:  # cannot even record the failure: try the whole task later
        raise Transient(str(again)) from None


# ---------------------------------------------------------------- reference


def reference_op(delivery: Delivery, run: str, source: str, op: str, force: bool = False) -> dict[str, Any]:
    """Reference data for one op on this worker's device (skipped when the stored .pt is
    current), then the op's first search chunk on search.<target>."""

    def body(e: _Env, spec: RunSpec, lock: OpLock) -> dict[str, Any]:
        device = worker_device(spec.reference_target)
        [ref] = taskfiles.find_tasks(e.settings, [source], [op])
        update_op(e.store, run, source, op, phase="reference", reference="running", worker=delivery.hostname,
                  running=delivery.task_id)
        [entry] = generate_references([ref], e.store, device, spec.reference_seed, spec.shapes,
                                      e.settings.reference.timeout_s, force=force,
                                      cases=reference_cases(e.settings.reference.cases, device),
                                      ship_max_mb=e.settings.reference.ship_max_mb)
        if not entry.get("success"):
            raise OpFailed(f"reference data ({entry.get('stage')}): {entry.get('error')}")
        if lock.lost:
            raise LockLost("the op's lock lapsed while its reference data was made")
        made = "current" if entry.get("skipped") else "generated"
        update_op(e.store, run, source, op, phase="searching", reference=made, running=None)
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
            "best_timing_mode": (mode_of(best.timing) or None) if best else None,
            "verdicts": dict(sorted(verdicts.items()))}


def search_chunk(delivery: Delivery, run: str, source: str, op: str, chunk: int) -> dict[str, Any]:
    """One bounded chunk of the op's search, resumed from its checkpoint; then the next chunk."""

    def body(e: _Env, spec: RunSpec, lock: OpLock) -> dict[str, Any]:
        device = worker_device(spec.target)
        [ref] = taskfiles.find_tasks(e.settings, [source], [op])
        data = load_reference(e.store, source, op)
        events = CandidateLog(run, source, op, spec.target)
        ctx = SearchContext(e.store, run, spec.target, [device], [load_generator(g) for g in spec.generators],
                            spec.search_config(), spec.evaluation(), e.settings, on_event=events,
                            cancel=lock.lost_event)  # a lapsed lock stops the chunk at its next candidate
        search = ChunkSearch(ref, data, ctx, chunk_seconds=e.settings.queue.chunk_time_limit_s / 2)
        state = search.restore()
        if state and state["status"] != "done" and search.chunks_done > chunk:
            # this chunk was done by an earlier delivery that died before its done mark:
            # make sure its continuation exists (a duplicate of it is harmless)
            return {"chunk": chunk, "next": enqueue_search(spec, source, op, search.chunks_done)}
        update_op(e.store, run, source, op, phase="searching", worker=delivery.hostname, running=delivery.task_id)
        started = time.monotonic()
        try:
            outcome = search.step(max_chunks=1)
        except KeyboardInterrupt:
            if not lock.lost:
                raise
            raise LockLost(f"the op's lock lapsed during chunk {chunk}: stopped before its checkpoint") from None
        events.chunk_done(time.monotonic() - started)
        if lock.lost:  # checkpointed, but another copy may be on it now: it enqueues what follows
            raise LockLost(f"the op's lock lapsed during chunk {chunk}, after its checkpoint")
        progress = {**_progress(search), "running": None}
        if outcome is not None:
            phase = "failed" if outcome.status == "failed" else "done"
            events.best(update_op(e.store, run, source, op, phase=phase, outcome=outcome.as_dict(),
                                  error=outcome.error, finished_at=now(), **progress))
            return {"chunk": chunk, "status": outcome.status, "best_id": outcome.best_id}
        if load_run(e.store, run)[1].get("cancelled_at"):
            update_op(e.store, run, source, op, phase="cancelled", **progress)
            return {"chunk": chunk, "cancelled": True}
        events.best(update_op(e.store, run, source, op, **progress))
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

    def best(self, status: dict) -> None:
        """The op's best speedup into the gauge: the figure its status.json gives `farm status`
        (farm.distributed.runs.op_best), so the two never disagree."""
        best = op_best(status)
        if best and best.get("speedup_vs_model") is not None:
            metrics.BEST_SPEEDUP.labels(self.target, self.source, self.op).set(best["speedup_vs_model"])

    def chunk_done(self, wall_s: float) -> None:
        for device, busy in self.busy_s.items():
            metrics.DEVICE_BUSY.labels(self.target, device).set(min(1.0, busy / max(wall_s, 1e-9)))
        self.busy_s.clear()

