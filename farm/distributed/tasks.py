"""The farm's Celery tasks: thin, explicitly named, idempotent. Each passes names and keys to
a library function (farm.distributed.work) and returns a small dict; tensors and kernels travel
through the store, never through the broker."""

from __future__ import annotations

from farm.distributed.celery_app import app
from farm.distributed.coord import BACKOFF_MAX_S, BACKOFF_S, Transient
from farm.distributed.queues import REFERENCE_TASK, SEARCH_TASK


def _delivery(task):
    from farm.distributed.work import Delivery

    req = task.request
    return Delivery(task_id=req.id, hostname=req.hostname or "",
                    redelivered=bool((req.delivery_info or {}).get("redelivered")))


def _run(task, fn, *args):
    from farm.distributed.work import Retry

    try:
        return fn(_delivery(task), *args)
    except Retry as exc:  # a fixed wait (a busy op lock, a soft time limit), not an error's backoff
        raise task.retry(countdown=exc.countdown, exc=exc, max_retries=None) from None


# Transient errors (store or broker unreachable) are retried by Celery with exponential backoff
# and full jitter, so that after an outage the fleet does not come back in one thundering herd;
# farm.distributed.work counts them and fails the op past MAX_ERROR_RETRIES, with the reason, so
# Celery's own cap stays off. Results go nowhere: tasks write to the store, nobody reads them.
RETRIES = {"autoretry_for": (Transient,), "retry_backoff": BACKOFF_S, "retry_backoff_max": BACKOFF_MAX_S,
           "retry_jitter": True, "max_retries": None, "ignore_result": True}


@app.task(name=REFERENCE_TASK, bind=True, **RETRIES)
def reference_op(self, run: str, source: str, op: str, force: bool = False) -> dict:
    """Reference data for one op, then its first search chunk."""
    from farm.distributed import work

    return _run(self, work.reference_op, run, source, op, force)


@app.task(name=SEARCH_TASK, bind=True, **RETRIES)
def search_chunk(self, run: str, source: str, op: str, chunk: int) -> dict:
    """One bounded chunk of an op's search, from its checkpoint; then the next chunk."""
    from farm.distributed import work

    return _run(self, work.search_chunk, run, source, op, chunk)


@app.task(name="farm.ping", ignore_result=True)
def ping(n: int = 0) -> int:
    """Does nothing: the load bench measures the queue's own cost with it."""
    return n
