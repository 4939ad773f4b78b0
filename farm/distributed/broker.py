"""What a Redis broker holds, read and pruned the way kombu's Redis transport lays it out.

A queue is a list per priority step: `<queue>` for priority 0 and `<queue>\\x06\\x16<step>` for
the steps 3, 6 and 9. A message a worker has taken but not yet acknowledged (with acks_late: a
running task, or one held for its retry countdown) sits in the `unacked` hash (tag -> [message,
exchange, routing key]) with its delivery time in the `unacked_index` sorted set; kombu hands
it out again only after the visibility timeout. A message is JSON whose `headers.id` is the
Celery task id, which the farm derives from run, op and chunk.

The reconciler (farm.distributed.reconcile) and `farm cancel` read the ids; the exporter reads
the lengths. Lists are read in pages, so a queue of ten thousand messages never blocks Redis.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, Iterable

PRIORITY_STEPS = (0, 3, 6, 9)  # kombu's Redis transport default
PRIORITY_SEP = "\x06\x16"
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"
PAGE = 500


def redis_list_key(queue: str, priority: int) -> str:
    return f"{queue}{PRIORITY_SEP}{priority}" if priority else queue


def list_keys(queues: Iterable[str]) -> list[str]:
    return [redis_list_key(q, p) for q in queues for p in PRIORITY_STEPS]


def message_id(raw: bytes | str) -> str | None:
    """The task id of a queued message, None for something that is not a Celery message."""
    try:
        return _id_of(json.loads(raw))
    except (ValueError, TypeError):
        return None


def _id_of(message) -> str | None:
    headers = message.get("headers") if isinstance(message, dict) else None
    task_id = headers.get("id") if isinstance(headers, dict) else None
    return task_id if isinstance(task_id, str) else None


def _pages(client, key: str):
    start = 0
    while True:
        page = client.lrange(key, start, start + PAGE - 1)
        yield from page
        if len(page) < PAGE:
            return
        start += PAGE


def queued_ids(client, queues: Iterable[str]) -> set[str]:
    """Task ids waiting in these queues, every priority step."""
    return {tid for key in list_keys(queues) for raw in _pages(client, key) if (tid := message_id(raw))}


@dataclass(frozen=True)
class Reserved:
    """A message a worker took and has not acknowledged."""

    tag: str
    task_id: str | None
    routing_key: str | None
    delivered_at: float | None


def reserved(client) -> list[Reserved]:
    found = []
    delivered = dict(client.zscan_iter(UNACKED_INDEX_KEY, count=PAGE))
    for tag, value in client.hscan_iter(UNACKED_KEY, count=PAGE):
        try:
            message, _exchange, routing_key = json.loads(value)
        except (ValueError, TypeError):
            continue
        found.append(Reserved(tag.decode() if isinstance(tag, bytes) else tag, _id_of(message),
                              routing_key if isinstance(routing_key, str) else None, delivered.get(tag)))
    return found


def started_at(client) -> float | None:
    """When the Redis server last started, on this host's clock (None where it does not say).
    A restart closes every worker's connection, and a worker forgets what it had taken and not
    started (Celery drops its reserved and countdown-held requests on a new connection), while
    Redis, with its append-only file, still lists those messages as taken."""
    from redis.exceptions import ResponseError  # INFO may be renamed away on a managed Redis

    try:
        uptime = float(client.info("server")["uptime_in_seconds"])
    except (ResponseError, KeyError, TypeError, ValueError):
        return None
    return time.time() - uptime


def drop_reserved(client, tag: str) -> None:
    """Forget a taken message whose worker is gone (kombu would restore it only after the
    visibility timeout): the reconciler publishes its task again instead."""
    pipe = client.pipeline()
    pipe.hdel(UNACKED_KEY, tag)
    pipe.zrem(UNACKED_INDEX_KEY, tag)
    pipe.execute()


def remove_queued(client, queues: Iterable[str], drop: Callable[[str], bool]) -> int:
    """Delete the waiting messages whose task id `drop` accepts; returns how many went."""
    removed = 0
    for key in list_keys(queues):
        doomed = [raw for raw in _pages(client, key) if (tid := message_id(raw)) and drop(tid)]
        for raw in doomed:
            removed += int(client.lrem(key, 1, raw))
    return removed


def lengths(client, queues: list[str]) -> tuple[dict[tuple[str, int], int], dict[str, int]]:
    """({(queue, priority): waiting}, {queue: reserved}): what the exporter and KEDA read."""
    pipe = client.pipeline(transaction=False)
    keys = [(q, p) for q in queues for p in PRIORITY_STEPS]
    for q, p in keys:
        pipe.llen(redis_list_key(q, p))
    waiting = dict(zip(keys, pipe.execute()))
    held = {q: 0 for q in queues}
    for _tag, value in client.hscan_iter(UNACKED_KEY, count=PAGE):
        routing_key = _routing_key(value)
        if routing_key in held:
            held[routing_key] += 1
    return waiting, held


def _routing_key(value: bytes | str) -> str | None:
    try:
        _message, _exchange, routing_key = json.loads(value)
    except (ValueError, TypeError):
        return None
    return routing_key if isinstance(routing_key, str) else None
