"""Nothing stranded, end to end: real `farm worker` processes, a real Redis that loses its data,
a worker killed under the default visibility timeout (2 h). Short lock, takeover and reconcile
settings keep each test under a minute or so."""

from __future__ import annotations

import json

import pytest

from farm.distributed.runs import op_status, summarize
from farm.storage import open_store
from tests.distributed.test_distributed import FAST, Cluster, assert_complete_and_unique, wait_until
from tests.redis_server import RedisServer, redis_server  # noqa: F401

pytest.importorskip("celery")

# FAST's chunk limits (well above a chunk's time): these tests are about Redis and dead workers
QUICK = {**FAST, "FARM_QUEUE_LOCK_TTL_S": "3", "FARM_QUEUE_TAKEOVER_S": "6", "FARM_QUEUE_RECONCILE_INTERVAL_S": "2"}


def status(c: Cluster, run: str) -> dict:
    done = c.farm("status", run, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_redis_restarted_without_its_data_is_reported_and_recovered(tmp_path):
    """Redis comes back empty (no persistence): the queued reference task and the running chunk's
    lock are gone. The chunk stops (its lock lapsed), `farm status` says stalled, why, and the
    command that recovers; `farm recover` enqueues each op's next task and the run completes."""
    redis = RedisServer(appendonly=False).start()
    c = Cluster(tmp_path, {"FARM_QUEUE_BROKER_URL": redis.url(), **QUICK, "FARM_QUEUE_RECONCILE_INTERVAL_S": "0"})
    try:
        c.start_worker(0)
        c.wait_ready()
        sub = c.farm("submit", "--source", "demo", "--ops", "row_sum", "--ops", "vector_add_scale", "--target",
                     "cpu", "--max-tasks", "4", "--run", "lost", "--generators", "tune")
        assert sub.returncode == 0, sub.stderr
        wait_until(lambda: c.evaluated("lost"), 90, "the search to start")
        redis.restart(down_s=1.0)  # no append-only file: every queue, lock and mark is gone

        seen: list[dict] = []

        def stalled() -> dict | None:
            # Right after the restart a look may catch another stall for a moment (the worker's
            # consumer not yet back, a reservation the worker still reports): the one under test is
            # what Redis' lost data leaves, waited for (a fresh-clone run failed on a first look)
            view = status(c, "lost")
            seen[:] = [view]
            rows = [r for r in view["ops"] if r.get("state") == "stalled"]
            return view if rows and all("neither queued nor running" in r["stalled"] for r in rows) else None

        # each look is a `farm status` process (about 1 CPU-s of a 2-core machine the workers need)
        try:
            view = wait_until(stalled, 60, "farm status to report the stall", every=2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the last look: {seen and seen[0]['ops']}") from None
        assert view["eta_s"] is None  # no estimate for work that does not move
        assert all("neither queued nor running" in r["stalled"] and "farm recover lost" in r["fix"]
                   for r in view["ops"] if r.get("state") == "stalled")
        table = c.farm("status", "lost")
        flat = " ".join((table.stdout + table.stderr).split())
        assert "stalled" in table.stdout and "recover: farm recover lost" in flat
        assert "no ETA" in flat or "ETA -" in flat

        recovered = c.farm("recover", "lost", "--json")
        assert recovered.returncode == 0, recovered.stderr
        assert json.loads(recovered.stdout)["recovered"], recovered.stdout
        store = open_store(c.env["FARM_STORE"])
        wait_until(lambda: summarize(store, "lost")["status"] == "finished", 150, "the run to finish", every=1)
        assert_complete_and_unique(store, "lost", 4)
    finally:
        c.stop()
        redis.cleanup()


def test_a_killed_workers_chunk_is_taken_over_in_seconds_not_the_visibility_timeout(tmp_path, redis_server):  # noqa: F811
    """SIGKILL of a whole worker under the default visibility timeout (2 h): its chunk's lock
    lapses, the other worker's reconciler drops the dead message and publishes the chunk again,
    counted as a redelivery; the run finishes within a minute or two."""
    c = Cluster(tmp_path, {"FARM_QUEUE_BROKER_URL": redis_server.url(), **QUICK,
                           "FARM_QUEUE_VISIBILITY_TIMEOUT_S": "7200", "FARM_QUEUE_CHUNK_CANDIDATES": "2"})
    try:
        c.start_worker(0)
        c.start_worker(1)
        c.wait_ready()
        sub = c.farm("submit", "--source", "demo", "--ops", "row_sum", "--target", "cpu", "--max-tasks", "4",
                     "--run", "takeover", "--generators", "tune")
        assert sub.returncode == 0, sub.stderr
        victim = wait_until(lambda: next(iter(c.evaluated("takeover")), None), 90, "a first evaluation")[0]
        c.kill(victim)
        store = open_store(c.env["FARM_STORE"])
        wait_until(lambda: summarize(store, "takeover")["status"] == "finished", 120, "the run to finish", every=1)
        assert_complete_and_unique(store, "takeover", 4)
        st = op_status(store, "takeover", "demo", "row_sum")
        assert st["worker"].startswith(f"reference-search-cpu-{1 - victim}@")
        assert st["redeliveries"] >= 1 and "its worker died" in st["recovered"][-1]["reason"]
    finally:
        c.stop()
