"""Publishing the farm's tasks: their ids (derived from run, op and chunk, so that a task
enqueued twice is one task) and the queue each goes to. Light on purpose: `farm submit`, the
reconciler in the `farm worker` supervisor and the tasks all publish, and only the tasks need
the search's heavy imports."""

from __future__ import annotations

from farm.distributed.queues import REFERENCE_TASK, SEARCH_TASK, queue_name
from farm.distributed.runs import RunSpec


def reference_task_id(run: str, source: str, op: str) -> str:
    return f"{run}:{source}:{op}:reference"


def search_task_id(run: str, source: str, op: str, chunk: int) -> str:
    return f"{run}:{source}:{op}:search:{chunk}"


# By task name, not through the task objects (farm.distributed.tasks imports the heavy work), and a
# name is also what a worker of another version still understands.
def enqueue_reference(spec: RunSpec, op: str, force: bool, producer=None) -> str:
    from farm.distributed.celery_app import app

    task_id = reference_task_id(spec.run, spec.source, op)
    app.send_task(REFERENCE_TASK, (spec.run, spec.source, op, force), task_id=task_id, ignore_result=True,
                  queue=queue_name("reference", spec.reference_target), producer=producer)
    return task_id


def enqueue_search(spec: RunSpec, source: str, op: str, chunk: int, producer=None) -> str:
    from farm.distributed.celery_app import app

    task_id = search_task_id(spec.run, source, op, chunk)
    app.send_task(SEARCH_TASK, (spec.run, source, op, chunk), task_id=task_id, ignore_result=True,
                  queue=queue_name("search", spec.target), producer=producer)
    return task_id


PUBLISHERS = 4  # connections publishing at once: each message costs a Redis round trip


def publish_all(spec: RunSpec, tasks: list[tuple[str, int | None]], force: bool = False) -> None:
    """Enqueue many tasks, (op, None) for a reference task and (op, k) for search chunk k:
    `farm submit` of thousands of ops. Over a few connections at once, and without the
    task-sent event, which would double the messages (the workers' received, started and
    succeeded events stay; nothing of the farm reads task-sent)."""
    from concurrent.futures import ThreadPoolExecutor

    from farm.distributed.celery_app import app

    def one(group: list[tuple[str, int | None]]) -> None:
        with app.producer_or_acquire() as producer:
            for op, chunk in group:
                if chunk is None:
                    enqueue_reference(spec, op, force, producer)
                else:
                    enqueue_search(spec, spec.source, op, chunk, producer)

    sent_event = app.conf.task_send_sent_event
    app.conf.task_send_sent_event = False
    try:
        with ThreadPoolExecutor(PUBLISHERS, thread_name_prefix="farm-publish") as pool:
            list(pool.map(one, [tasks[i::PUBLISHERS] for i in range(PUBLISHERS)]))
    finally:
        app.conf.task_send_sent_event = sent_event
