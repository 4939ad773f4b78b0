"""Task metrics from Celery's signals, so that the tasks themselves stay thin: every message is
stamped when it is published (retries included), and the pool process that runs it records its
queue wait, duration, outcome and redelivery, and which run and op it is busy with.

Outcomes: ok; op_failed (the task ended by marking its op failed); skipped (done already,
cancelled, stopped by a lapsed op lock); retry (Celery will run it again: a busy op lock, a transient storage error);
error (an exception escaped the task).
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from typing import Any

from celery.signals import (
    before_task_publish,
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
)

from farm.observe import metrics

PUBLISHED_HEADER = "farm_published_at"
OUTCOMES = ("ok", "op_failed", "skipped", "retry", "error")
STORAGE_OPERATIONS = ("put", "get", "head", "list", "verify", "delete", "update")
TASK_OF_POOL = {"reference": "reference_op", "search": "search_chunk"}
_running: dict[str, tuple[float, tuple[str, ...] | None]] = {}  # task id -> (start, current-task labels)


@worker_process_init.connect
def _zero_series(**_: Any) -> None:
    """Export the counters this process may move as 0 from the start, so that rates and alert
    expressions have a series before the first failure, redelivery or storage error."""
    for queue in filter(None, os.environ.get(metrics.QUEUES_ENV, "").split(",")):
        task = TASK_OF_POOL.get(queue.split(".")[0])
        if task is None:
            continue
        for result in OUTCOMES:
            metrics.TASKS.labels(queue, task, result)
        metrics.REDELIVERIES.labels(queue, task)
    backend = _store_backend()
    for operation in STORAGE_OPERATIONS:
        metrics.STORAGE_ERRORS.labels(backend, operation)
    if backend == "s3":
        for reason in ("request", "conflict"):
            metrics.STORAGE_RETRIES.labels(backend, reason)


def _store_backend() -> str:
    from farm.config import load_settings

    return "s3" if load_settings()[0].store.startswith("s3://") else "file"


@before_task_publish.connect
def _stamp(headers: dict | None = None, **_: Any) -> None:
    if headers is not None:
        headers[PUBLISHED_HEADER] = time.time()


def _queue(task) -> str:
    return (task.request.delivery_info or {}).get("routing_key") or "unknown"


def _short(task) -> str:
    return task.name.removeprefix("farm.")


def queue_wait(published: float | None, eta: str | None, now: float) -> float | None:
    """Seconds a message waited for a worker: since it was published, or since its ETA when it
    was held back on purpose (a retry's countdown is not waiting)."""
    if published is None:
        return None
    start = float(published)
    if eta:
        try:
            start = max(start, _dt.datetime.fromisoformat(eta).timestamp())
        except (TypeError, ValueError):
            pass
    return max(0.0, now - start)


def _published(task) -> float | None:
    value = getattr(task.request, PUBLISHED_HEADER, None)
    if value is None:
        value = (getattr(task.request, "headers", None) or {}).get(PUBLISHED_HEADER)
    return value


def _current_labels(task, args: tuple) -> tuple[str, ...] | None:
    """(pool, target, device, run, source, op) for the farm's reference and search tasks."""
    if task.name not in ("farm.reference_op", "farm.search_chunk") or len(args) < 3:
        return None
    pool = "reference" if task.name == "farm.reference_op" else "search"
    target = _queue(task).rpartition(".")[2]
    run, source, op = (str(a) for a in args[:3])
    return (pool, target, metrics.device_label(), run, source, op)


@task_prerun.connect
def _started(task_id: str, task, args: tuple = (), **_: Any) -> None:
    now = time.time()
    queue, name = _queue(task), _short(task)
    wait = queue_wait(_published(task), task.request.eta, now)
    if wait is not None:
        metrics.QUEUE_WAIT.labels(queue, name).observe(wait)
    if (task.request.delivery_info or {}).get("redelivered"):
        metrics.REDELIVERIES.labels(queue, name).inc()
    labels = _current_labels(task, tuple(args or ()))
    if labels:
        metrics.CURRENT_TASK.labels(*labels).set(1)
    _running[task_id] = (time.monotonic(), labels)


def outcome(state: str | None, retval: Any) -> str:
    if state == "SUCCESS":
        if isinstance(retval, dict) and retval.get("failed"):
            return "op_failed"
        if isinstance(retval, dict) and (retval.get("skipped") or retval.get("stopped")):
            return "skipped"
        return "ok"
    if state == "RETRY":
        return "retry"
    return "error"


@task_postrun.connect
def _finished(task_id: str, task, retval: Any = None, state: str | None = None, **_: Any) -> None:
    started, labels = _running.pop(task_id, (None, None))
    queue, name = _queue(task), _short(task)
    metrics.TASKS.labels(queue, name, outcome(state, retval)).inc()
    if started is not None:
        metrics.TASK_DURATION.labels(queue, name).observe(time.monotonic() - started)
    if labels:
        metrics.CURRENT_TASK.labels(*labels).set(0)


@worker_process_shutdown.connect
@worker_shutdown.connect
def _gone(**_: Any) -> None:
    """A pool process (or the worker) that ends cleanly drops its live gauges at once; the
    supervisor reaps those of a process that was killed (farm.observe.metrics.reap)."""
    metrics.mark_dead(os.getpid())
