"""Distributed mode: the Celery app (celery_app), its settings (celeryconfig), the thin tasks
(tasks), what they run (work) and how they coordinate through Redis (coord).

Only this package and the commands that enqueue import celery; `farm run` never does.
"""

from __future__ import annotations

from farm import targets
from farm.errors import EXIT_STORAGE, FarmError

POOLS = ("reference", "search")
# Celery task names: never renamed, so work queued before an upgrade is still understood after it
REFERENCE_TASK = "farm.reference_op"
SEARCH_TASK = "farm.search_chunk"
PING_QUEUE = "farm"  # the default queue: control and the load bench's ping tasks
DEVICE_ENV = "FARM_WORKER_DEVICE"  # set by `farm worker`: the device this worker owns, e.g. cuda:3


class QueueError(FarmError):
    """The broker (or the Redis that coordinates tasks) cannot be reached."""

    exit_code = EXIT_STORAGE


def queue_name(pool: str, target: str) -> str:
    """reference.cuda, search.ascend, ...: one queue per pool of workers."""
    if pool not in POOLS or target not in targets.available():
        raise FarmError(f"unknown pool {pool}.{target}: pools are {', '.join(POOLS)}, "
                        f"targets {', '.join(targets.available())}")
    return f"{pool}.{target}"


def parse_pool(name: str) -> tuple[str, str]:
    """'search-ascend' or 'search.ascend' -> ('search', 'ascend')."""
    pool, sep, target = name.replace(".", "-").partition("-")
    if not sep:
        raise FarmError(f"pool {name!r}: expected <pool>-<target>, e.g. search-ascend or reference-cuda")
    queue_name(pool, target)
    return pool, target


def all_queues() -> list[str]:
    """Every queue the farm declares: the ping queue, then one per pool and target."""
    return [PING_QUEUE] + [queue_name(p, t) for p in POOLS for t in targets.available()]
