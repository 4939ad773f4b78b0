"""What the queue itself costs: no-op `farm.ping` tasks through a real Redis (started here on
a free port) to real Celery workers configured exactly as the farm's (prefork pool of one,
prefetch 1, late acks, task events on), one worker process per "device".

Measured:
- publish: the client's time to enqueue N tasks (apply_async, one by one);
- drain: from the first publish until the last task is acknowledged (the queue list and the
  transport's unacked hash both empty), with all N published up front;
- overhead per task: workers x drain / N, the worker-time the queue adds to every task
  (what a task of zero work costs a device);
- round trip: one task at a time on idle workers, publish to acknowledgement (median, p90).

    python bench/queue_load.py [--tasks 2000] [--workers 8] [--out bench/results/queue_load.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.redis_server import RedisServer

QUEUE = "farm"  # farm.ping's queue


def start_workers(n: int, env: dict, logs: Path) -> list[subprocess.Popen]:
    procs = []
    for i in range(n):
        cmd = [sys.executable, "-m", "celery", "-A", "farm.distributed.celery_app", "worker", "--pool", "prefork",
               "--concurrency", "1", "--prefetch-multiplier", "1", "--task-events", "-Q", QUEUE,
               "-n", f"bench-{i}@%h", "--loglevel", "WARNING", "--logfile", str(logs / f"bench-{i}.log")]
        procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.STDOUT))
    return procs


def wait_ready(app, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replies = app.control.ping(timeout=1.0) or []
        if len(replies) >= n:
            return
    raise RuntimeError(f"only {len(app.control.ping(timeout=1.0) or [])} of {n} workers answered")


def idle(r) -> bool:
    """Nothing queued and nothing unacknowledged, seen twice: between a worker's BRPOP and its
    entry in the unacked hash a message is briefly in neither."""
    for _ in range(2):
        if r.llen(QUEUE) or r.hlen("unacked"):
            return False
        time.sleep(0.001)
    return True


def drain(r, timeout: float, poll_s: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not idle(r):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{r.llen(QUEUE)} queued, {r.hlen('unacked')} unacked after {timeout:.0f} s")
        time.sleep(poll_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--round-trips", type=int, default=50)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "queue_load.json")
    args = parser.parse_args()

    redis = RedisServer().start()
    logs = Path(tempfile.mkdtemp(prefix="farm-bench-logs-"))
    env = {**os.environ, "FARM_QUEUE_BROKER_URL": redis.url()}
    os.environ["FARM_QUEUE_BROKER_URL"] = redis.url()
    from farm.config import load_settings
    from farm.distributed.celery_app import configured
    from farm.distributed.tasks import ping

    app = configured(load_settings()[0])
    r = redis.client()
    procs = start_workers(args.workers, env, logs)
    try:
        wait_ready(app, args.workers)
        ping.delay(0)  # warm the producer pool
        drain(r, 60)

        start = time.perf_counter()
        for i in range(args.tasks):
            ping.delay(i)
        published = time.perf_counter()
        drain(r, 600)
        drained = time.perf_counter()

        trips = []
        for i in range(args.round_trips):
            t0 = time.perf_counter()
            ping.delay(i)
            drain(r, 60, poll_s=0.0005)
            trips.append((time.perf_counter() - t0) * 1000)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        redis.cleanup()
        shutil.rmtree(logs, ignore_errors=True)

    publish_s, drain_s = published - start, drained - start
    trips.sort()
    import celery
    import kombu

    result = {
        "command": "python bench/queue_load.py",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "celery": celery.__version__, "kombu": kombu.__version__,
        "redis_server": subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2],
        "tasks": args.tasks, "workers": args.workers,
        "worker_config": "prefork --concurrency 1, prefetch 1, acks_late, task events on, one process per worker",
        "publish_s": round(publish_s, 3),
        "publish_per_task_ms": round(publish_s * 1000 / args.tasks, 3),
        "drain_s": round(drain_s, 3),
        "throughput_tasks_per_s": round(args.tasks / drain_s, 1),
        "overhead_per_task_ms": round(args.workers * drain_s * 1000 / args.tasks, 2),
        "round_trip_ms": {"median": round(statistics.median(trips), 2),
                          "p90": round(trips[int(0.9 * (len(trips) - 1))], 2), "n": len(trips)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
