"""The farm's Celery app: `celery -A farm.distributed.celery_app worker -Q search.cpu ...` works."""

from __future__ import annotations

import multiprocessing

from celery import Celery
from celery.signals import worker_process_init, worker_ready, worker_shutdown

from farm.config import Settings

app = Celery("farm", include=["farm.distributed.tasks"])
app.config_from_object("farm.distributed.celeryconfig")

import farm.distributed.instrument  # noqa: E402,F401  (connects the task metrics to Celery's signals)


@worker_process_init.connect
def _allow_child_processes(**_) -> None:
    """Let a pool process start multiprocessing children (farm.runtime.children runs reference
    generation and compiler captures in them, and kills them on timeout itself). Billiard
    installs its own process object as multiprocessing's current process: daemonic, which
    multiprocessing refuses to start children from, and with an authkey of billiard's type,
    which multiprocessing's forkserver cannot send."""
    # multiprocessing's private settings and authkey type, which its stubs do not declare
    config: dict = multiprocessing.current_process()._config  # type: ignore[attr-defined]
    config["daemon"] = False
    config["authkey"] = multiprocessing.process.AuthenticationString(  # type: ignore[attr-defined]
        bytes(config["authkey"]))


@worker_ready.connect
def _start_beat(sender=None, **_) -> None:
    """Say in Redis, while this worker lives, which queues it consumes (farm submit and farm
    status tell a queue that nobody serves)."""
    from farm.distributed.coord import WorkerBeat, redis_url_of
    from farm.distributed.queues import QueueError

    try:
        url = redis_url_of(app.conf.broker_url or "", app.conf.result_backend or "")
    except QueueError:
        return  # no Redis: the tasks themselves refuse to run and say why
    queues = [q.name for q in getattr(sender.task_consumer, "queues", None) or []]
    _beat.append(WorkerBeat(url, getattr(sender, "hostname", "") or "", queues).start())


@worker_shutdown.connect
def _stop_beat(**_) -> None:
    while _beat:
        _beat.pop().stop()


_beat: list = []


def configured(settings: Settings) -> Celery:
    """The app with the settings of this command (its --config and --set), not only the environment's."""
    from farm.distributed.options import values

    new = values(settings)
    if new["broker_url"] != app.conf.broker_url and app._pool is not None:
        app._pool.force_close_all()  # connections to the old broker: publish to the new one
        app._pool = None
        app.amqp._producer_pool = None
    app.conf.update(new)
    return app
