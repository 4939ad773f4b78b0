"""Celery's settings, computed from the farm's settings tree (farm/config.py), so that a
worker, `farm submit` and `celery -A farm.distributed.celery_app ...` all agree. The Celery app
loads them by module name (farm.distributed.celeryconfig); a command applies its own --config and
--set through farm.distributed.celery_app.configured."""

from __future__ import annotations

from typing import Any

from celery.app.defaults import DEFAULTS
from kombu import Exchange, Queue

from farm.config import QueueSettings, Settings
from farm.distributed.queues import PING_QUEUE, all_queues

REFERENCE_GRACE_S = 120.0  # a reference task's limit above reference.timeout_s (child start, upload)


def result_backend_url(q: QueueSettings) -> str | None:
    if q.result_backend:
        return q.result_backend
    return q.broker_url if q.broker_url.startswith(("redis://", "rediss://")) else None


def _queue(name: str) -> Queue:
    """A queue with a direct exchange and routing key of its own name: a message reaches it alone."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def _ack_on_timeout_off() -> dict[str, bool]:
    """A task that hits its hard time limit is requeued (and counted), not acknowledged.
    Newer Celery splits the setting in two; older versions only know the combined one."""
    if "task_acks_on_timeout" in DEFAULTS:
        return {"task_acks_on_failure": True, "task_acks_on_timeout": False}
    return {"task_acks_on_failure_or_timeout": False}


def values(settings: Settings) -> dict[str, Any]:
    q = settings.queue
    # The one pitfall of Redis brokers: an unacked task older than the visibility timeout is
    # handed out again. Celery reads the value in three places; all three get it.
    transport = {
        "visibility_timeout": q.visibility_timeout_s,
        # how often a worker looks for tasks whose worker died (unacked past the timeout)
        "unacked_restore_interval": max(1.0, min(10.0, q.visibility_timeout_s / 20)),
        "unacked_restore_throttle": 1,
    }
    reference_limit = settings.reference.timeout_s + REFERENCE_GRACE_S
    return {
        "broker_url": q.broker_url,
        "result_backend": result_backend_url(q),
        "broker_transport_options": transport,
        "result_backend_transport_options": {"visibility_timeout": q.visibility_timeout_s},
        "visibility_timeout": q.visibility_timeout_s,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,  # a worker outlives a broker restart
        # ... and its running chunk goes on: a copy redelivered meanwhile waits on the op's lock
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "task_queues": [_queue(name) for name in all_queues()],
        "task_default_queue": PING_QUEUE,
        "task_routes": {"farm.ping": {"queue": PING_QUEUE}},  # reference/search: queue chosen per target
        # one task at a time per device, acknowledged only when done
        "worker_prefetch_multiplier": 1,
        "worker_disable_prefetch": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,  # requeued; tasks count redeliveries and give up after the cap
        **_ack_on_timeout_off(),
        "task_soft_time_limit": q.chunk_time_limit_s,
        "task_time_limit": q.chunk_hard_limit_s,
        "task_annotations": {"farm.reference_op": {"soft_time_limit": reference_limit,
                                                   "time_limit": reference_limit + 30}},
        "task_publish_retry": True,
        "task_publish_retry_policy": {"max_retries": 60, "interval_start": 0.2, "interval_step": 0.5,
                                      "interval_max": 2.0},
        "task_track_started": True,
        "result_expires": 24 * 3600,
        "result_backend_always_retry": True,
        "result_backend_max_retries": 60,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "worker_max_tasks_per_child": q.worker_max_tasks_per_child or None,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
    }

