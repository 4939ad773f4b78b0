"""The farm's Celery app: `celery -A farm.distributed.celery_app worker -Q search.cpu ...` works."""

from __future__ import annotations

import multiprocessing

from celery import Celery
from celery.signals import worker_process_init

from farm.config import Settings

app = Celery("farm", include=["farm.distributed.tasks"])
app.config_from_object("farm.distributed.celeryconfig")

import farm.distributed.instrument  # noqa: E402,F401  (connects the task metrics to Celery's signals)


@worker_process_init.connect
def _allow_child_processes(**_) -> None:
    """Let a pool process start multiprocessing children (farm.runtime.isolation runs reference
    generation and compiler captures in them, and kills them on timeout itself). Billiard
    installs its own process object as multiprocessing's current process: daemonic, which
    multiprocessing refuses to start children from, and with an authkey of billiard's type,
    which multiprocessing's forkserver cannot send."""
    proc = multiprocessing.current_process()
    proc._config["daemon"] = False
    proc._config["authkey"] = multiprocessing.process.AuthenticationString(bytes(proc._config["authkey"]))


def configured(settings: Settings) -> Celery:
    """The app with the settings of this command (its --config and --set), not only the environment's."""
    from farm.distributed.options import values

    app.conf.update(values(settings))
    return app
