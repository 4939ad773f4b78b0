"""Publishing the farm's tasks: their ids (derived from run, op and chunk, so that a task
enqueued twice is one task) and the queue each goes to. Light on purpose: `farm submit`, the
reconciler in the `farm worker` supervisor and the tasks all publish, and only the tasks need
the search's heavy imports."""

from __future__ import annotations

from contextlib import contextmanager

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


@contextmanager
def publisher():
    """One producer (one connection) for many tasks: `farm submit` of thousands of ops."""
    from farm.distributed.celery_app import app

    with app.producer_or_acquire() as producer:
        yield producer
