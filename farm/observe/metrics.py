"""The farm's Prometheus metrics: every name, its labels and what it counts (docs/operations.md).

Workers are Celery prefork pools: the process that runs a task is a child that Celery replaces
after `queue.worker_max_tasks_per_child` tasks or a crash. So the metrics live in
prometheus_client's multiprocess mode: `farm worker` gives every process it starts a fresh
PROMETHEUS_MULTIPROC_DIR (the variable must be set before prometheus_client is imported, which
is why the supervisor sets it in the children's environment and never in its own), each
process writes its values to files there, and the supervisor serves their sum
(farm.distributed.workers). Counters and histograms of a dead process keep counting; its live gauges are
dropped (`mark_dead`).

Outside a worker (farm run, farm search, tests) the same objects are ordinary in-process
metrics nobody scrapes: instrumented code never needs to know which.

Labels are bounded: pool, queue, target, task, stage, verdict, generator, source, op, device;
never a candidate id, a run id only on the gauge of the task a worker is running now.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram

from farm.procs import pid_alive

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
SLOT_ENV = "FARM_WORKER_SLOT"  # set by `farm worker`: the device index (cpu: slot) that labels a worker's series
QUEUES_ENV = "FARM_WORKER_QUEUES"  # set by `farm worker`: the queues a worker consumes, comma-separated

# A search chunk is bounded by queue.chunk_time_limit_s (default 30 min), a reference task by
# reference.timeout_s: buckets reach two hours.
TASK_BUCKETS = (0.05, 0.25, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
WAIT_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# ---------------------------------------------------------------- tasks (Celery signals, farm.distributed.instrument)

TASKS = Counter("farm_tasks", "Tasks finished, by queue, task and outcome "
                "(ok, op_failed, skipped, retry, error).", ["queue", "task", "outcome"])
TASK_DURATION = Histogram("farm_task_duration_seconds", "Wall time of a task on its worker.",
                          ["queue", "task"], buckets=TASK_BUCKETS)
QUEUE_WAIT = Histogram("farm_task_queue_wait_seconds", "Time from a task's publication (or its ETA) to its start.",
                       ["queue", "task"], buckets=WAIT_BUCKETS)
REDELIVERIES = Counter("farm_task_redeliveries", "Tasks started from a redelivered message "
                       "(their worker died or hit the hard time limit).", ["queue", "task"])
CURRENT_TASK = Gauge("farm_worker_current_task", "1 for the run and op a worker's process is working on now.",
                     ["pool", "target", "device", "run", "source", "op"], multiprocess_mode="livesum")

# ---------------------------------------------------------------- search (farm.distributed.work)

CANDIDATES = Counter("farm_candidates", "Candidates evaluated, by target, source, op, generator and verdict.",
                     ["target", "source", "op", "generator", "verdict"])
STAGE_SECONDS = Histogram("farm_evaluation_stage_seconds", "Time of one evaluation stage (compile, verify, time) "
                          "of a candidate.", ["target", "stage"], buckets=STAGE_BUCKETS)
BEST_SPEEDUP = Gauge("farm_best_speedup", "An op's best speedup over the original Model as `farm status` shows it "
                     "(the re-timed figure once its search finished, the search's best so far before), set by the "
                     "worker that last checkpointed it.", ["target", "source", "op"], multiprocess_mode="mostrecent")
DEVICE_BUSY = Gauge("farm_device_busy_ratio", "Fraction of the last search chunk's wall time that candidates spent in "
                    "compile, verify and timing on the device.", ["target", "device"], multiprocess_mode="livemax")
# the search's pipeline (farm.evaluate.ahead, farm.evaluate.lease, docs/search.md "Pipeline")
COMPILE_QUEUE = Gauge("farm_compile_queue_depth", "Candidates waiting for a compile-ahead runner (stage=compile) "
                      "or, compiled, for the device (stage=device).", ["target", "device", "stage"],
                      multiprocess_mode="livesum")
DEVICE_TIME_SHARE = Gauge("farm_device_time_share", "Share of the last search chunk's wall time the device was held "
                          "for timing, for verification, or idle.", ["target", "device", "phase"],
                          multiprocess_mode="livemax")

# ---------------------------------------------------------------- storage (farm.storage.metered, farm.storage.s3)

STORAGE_BYTES = Counter("farm_storage_bytes", "Bytes moved to (put) or from (get) the store, by kind of object "
                        "(reference, run, kernel, other).", ["backend", "direction", "kind"])
STORAGE_OBJECTS = Counter("farm_storage_objects", "Objects moved to (put) or from (get) the store.",
                          ["backend", "direction", "kind"])
STORAGE_ERRORS = Counter("farm_storage_errors", "Store operations that failed after the client's own retries.",
                         ["backend", "operation"])
STORAGE_RETRIES = Counter("farm_storage_retries", "Requests sent again: by the S3 client (reason=request) or by a "
                          "document update that lost a race (reason=conflict).", ["backend", "reason"])


def object_kind(key: str) -> str:
    """The kind label of a store key: its first segment, where that names one of the farm's areas."""
    return {"refs": "reference", "runs": "run", "kernels": "kernel"}.get(key.split("/", 1)[0], "other")


def device_label() -> str:
    """This worker's device index, as farm_worker_up labels it ('' outside `farm worker`)."""
    return os.environ.get(SLOT_ENV, "")


# ---------------------------------------------------------------- multiprocess plumbing


def multiprocess_dir() -> Path | None:
    value = os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower())
    return Path(value) if value else None


def mark_dead(pid: int, path: Path | None = None) -> None:
    """Drop a finished process's live gauges (its counters stay in the sums)."""
    from prometheus_client import multiprocess

    folder = path or multiprocess_dir()
    if folder is not None:
        multiprocess.mark_process_dead(pid, str(folder))


def reap(path: Path) -> list[int]:
    """mark_dead every process that left files in `path` and no longer runs: a pool process
    killed with SIGKILL never ran its shutdown hook."""
    dead = []
    for pid in sorted({pid for f in path.glob("*_*.db") if (pid := _pid_of(f.name)) is not None}):
        if not pid_alive(pid):
            mark_dead(pid, path)
            dead.append(pid)
    return dead


def _pid_of(name: str) -> int | None:
    tail = name.rsplit("_", 1)[-1].removesuffix(".db")
    return int(tail) if tail.isdigit() else None


