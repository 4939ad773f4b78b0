"""The control side of distributed mode: submit a run, wait for it, cancel it, see the live
workers. `farm submit/status/cancel/workers` call these; so can any Python program.

Submitting records the run (farm.distributed.runs) and enqueues one reference task per op on
reference.<platform>; each reference task enqueues its op's first search chunk on
search.<target>, and each chunk its successor. Task ids derive from run, op and chunk, so
submitting the same run again enqueues the same ids and no work is done twice.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

from farm.config import Settings
from farm.corpus import tasks as taskfiles
from farm.distributed.queues import POOLS, QueueError, queue_name
from farm.distributed.runs import (
    TERMINAL,
    RunSpec,
    cancel_run,
    default_run_name,
    load_run,
    read_statuses,
    save_run,
    summarize,
)
from farm.errors import FarmError, WaitTimeout
from farm.evaluate.timing import check_flush, check_mode
from farm.generators import load_generator
from farm.storage import Store
from farm.targets import available, get_target

log = logging.getLogger(__name__)

POLL_S = 2.0  # how often --wait and --watch read the run's status


def connect(settings: Settings):
    """The Celery app with these settings, after checking that the broker and Redis answer."""
    from farm.distributed.celery_app import configured
    from farm.distributed.coord import Coordinator, redis_url

    app = configured(settings)
    Coordinator(redis_url(settings.queue)).ping()
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=2, interval_start=0.2, interval_step=0.5, timeout=5)
    except Exception as exc:
        raise QueueError(f"cannot reach the broker at {_redact(settings.queue.broker_url)}: {exc}") from None
    return app


def _redact(url: str) -> str:
    head, at, tail = url.rpartition("@")
    return f"{head.split('://')[0]}://****@{tail}" if at else url


def make_spec(settings: Settings, source: str, ops: list[str] | None, target: str, max_tasks: int,
              run: str | None = None, generators: tuple[str, ...] = ("tune", "port"),
              max_concurrent: int | None = None, reference_target: str | None = None, seed: int = 0,
              flush: str = "write", timing_mode: str = "auto") -> RunSpec:
    """The run as it will be stored, checked before anything is enqueued."""
    interpret = get_target(target).interpret
    reference_target = reference_target or ("cpu" if interpret else "cuda")
    queue_name("reference", reference_target)
    if max_tasks < 1:
        raise FarmError("--max-tasks must be at least 1")
    refs = taskfiles.find_tasks(settings, [source], ops)
    for name in generators:
        load_generator(name)  # an unknown name fails here, not on every worker
    return RunSpec(run=run or default_run_name(source, target), source=source, ops=[r.op for r in refs],
                   target=target, reference_target=reference_target,
                   shapes="small" if interpret else "bench", generators=list(generators),
                   max_tasks=max_tasks, chunk_candidates=settings.queue.chunk_candidates,
                   max_concurrent=max_concurrent or (1 if interpret else 4), seed=seed,
                   reference_seed=settings.reference.seed, flush=check_flush(flush),
                   timing_mode=check_mode(timing_mode))


def submit(settings: Settings, store: Store, spec: RunSpec, force: bool = False,
           require_workers: bool = False, warn: Callable[[str], None] | None = None) -> tuple[RunSpec, bool]:
    """Record the run and enqueue a reference task per op; returns (spec, created). A queue no
    live worker consumes is refused with `require_workers`, else said (`warn`): the run waits
    (a pool that autoscales from zero starts on its queue's length)."""
    from farm.distributed.publish import publish_all
    from farm.distributed.reconcile import expected_task

    connect(settings)
    idle = [q for q, ws in serving(settings, spec).items() if not ws]
    if idle:
        how = "; ".join(f"farm worker --pool {q.split('.')[0]} --target {q.split('.')[1]}" for q in idle)
        if require_workers:
            raise FarmError(f"no live worker consumes {', '.join(idle)} (--require-workers): start one ({how}), "
                            f"or pick a --target that a pool serves (farm workers)")
        (warn or log.warning)(f"no live worker consumes {', '.join(idle)} now: the run waits for one ({how}; "
                              "an autoscaled pool starts on its queue's length)")
    spec, created = save_run(store, spec)
    # an op without a status record is queued (farm.distributed.runs): a new run writes none.
    # Submitted again, each unfinished op gets the task it waits for (its reference task, or the
    # chunk its checkpoint reached), so a resubmission also restarts what a dead worker held.
    statuses = {} if created else read_statuses(store, spec.run, spec.source, spec.ops)
    tasks = []
    for op in spec.ops:
        st = statuses.get(op, {})
        row = {"source": spec.source, "op": op, "phase": st.get("phase", "queued"), "chunk": st.get("chunk", 0)}
        if row["phase"] not in TERMINAL:
            tasks.append((op, None if expected_task(spec.run, row)[1] == "reference" else int(row["chunk"] or 0)))
    publish_all(spec, tasks, force)
    return spec, created


def wait(store: Store, run: str, on_update: Callable[[dict], None] | None = None,
         timeout_s: float | None = None) -> dict[str, Any]:
    """Poll the run's status until every op has finished (or the timeout passes)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        view = summarize(store, run)
        if on_update:
            on_update(view)
        if view["status"] != "running":
            return view
        if deadline is not None and time.monotonic() > deadline:
            raise WaitTimeout(f"run {run} has not finished after {timeout_s:g} s (--timeout); it goes on: "
                              f"farm status {run}")
        time.sleep(POLL_S)


def task_ids(spec: RunSpec) -> list[str]:
    """Every id the run's tasks can have: reference per op, and each possible search chunk."""
    from farm.distributed.publish import reference_task_id, search_task_id

    chunks = math.ceil(spec.max_tasks / spec.chunk_candidates) + 1
    return [tid for op in spec.ops for tid in
            [reference_task_id(spec.run, spec.source, op)] +
            [search_task_id(spec.run, spec.source, op, c) for c in range(chunks)]]


def cancel(settings: Settings, store: Store, run: str) -> dict[str, Any]:
    """Mark the run cancelled (every task checks before it works, and no chunk enqueues a
    successor), delete its waiting messages from the queues, and revoke the ones workers
    already hold (a retry's countdown). Running chunks finish and checkpoint."""
    from farm.distributed import broker
    from farm.distributed.coord import Coordinator, redis_url

    doc = cancel_run(store, run)
    spec, _ = load_run(store, run)
    removed = None
    try:
        app = connect(settings)
        if settings.queue.broker_url.startswith(("redis://", "rediss://")):
            client = Coordinator(redis_url(settings.queue), quick=True).r
            queues = [queue_name("reference", spec.reference_target), queue_name("search", spec.target)]
            removed = broker.remove_queued(client, queues, lambda tid: tid.startswith(f"{run}:"))
            held = sorted({tid for r in broker.reserved(client) if (tid := r.task_id) and tid.startswith(f"{run}:")})
        else:
            held = task_ids(spec)  # AMQP: no way to list them; every id the run can have
        if held:
            app.control.revoke(held)
        revoked = True
    except QueueError:
        revoked = False  # the store's mark is what counts: a task that starts sees it and stops
    return {"run": run, "cancelled_at": doc["cancelled_at"], "revoked": revoked, "removed": removed}


def serving(settings: Settings, spec: RunSpec) -> dict[str, list[str]]:
    """queue -> live workers consuming it, for the run's two queues."""
    from farm.distributed.coord import Coordinator, redis_url

    live = Coordinator(redis_url(settings.queue), quick=True).live_workers()
    queues = [queue_name("reference", spec.reference_target), queue_name("search", spec.target)]
    return {q: sorted(w for w, qs in live.items() if q in qs) for q in queues}


def workers(settings: Settings, timeout_s: float = 1.0) -> dict[str, Any]:
    """Live workers (they answer a broadcast within the timeout), what each is doing, and
    the number of tasks waiting in each pool's queue."""
    from farm.distributed.coord import Coordinator, redis_url

    app = connect(settings)
    inspect = app.control.inspect(timeout=timeout_s)
    queues = inspect.active_queues() or {}
    active = inspect.active() or {}
    rows = []
    for name in sorted(set(queues) | set(active)):
        tasks = active.get(name, [])
        rows.append({"worker": name, "queues": sorted(q["name"] for q in queues.get(name, [])),
                     "state": "busy" if tasks else "idle",
                     "tasks": [{"id": t.get("id"), "name": t.get("name"), "args": t.get("args"),
                                "started": t.get("time_start")} for t in tasks]})
    waiting = {}
    if settings.queue.broker_url.startswith(("redis://", "rediss://")):
        r = Coordinator(redis_url(settings.queue)).r
        waiting = {q: r.llen(q) for q in (queue_name(p, t) for p in POOLS for t in available())}
    return {"workers": rows, "waiting": waiting}
