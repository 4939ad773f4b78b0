"""Runs compared with what the queues and the workers hold, against a real Redis and real
Celery messages (no worker processes: each state is set up as a worker would leave it).
The end-to-end cases (Redis losing its data under running workers, a killed worker's chunk
taken over) are in test_recovery.py."""

from __future__ import annotations

import json
import os
import time

import pytest

from farm.distributed.runs import RunSpec, save_run, summarize, update_op
from farm.storage import open_store
from tests.redis_server import RedisServer, redis_server  # noqa: F401

pytest.importorskip("celery")

QUICK = {"FARM_QUEUE_LOCK_TTL_S": "2", "FARM_QUEUE_TAKEOVER_S": "5", "FARM_QUEUE_RECONCILE_INTERVAL_S": "2"}


@pytest.fixture
def farm_env(redis_server, monkeypatch):  # noqa: F811
    from farm.config import load_settings
    from farm.distributed.celery_app import configured
    from farm.distributed.coord import Coordinator

    monkeypatch.setenv("FARM_QUEUE_BROKER_URL", redis_server.url())
    for key, value in QUICK.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()[0]
    configured(settings)
    store = open_store(os.environ["FARM_STORE"])
    yield settings, store, Coordinator(redis_server.url(), settings.queue.lock_ttl_s), redis_server.client()


def make_run(store, name: str = "r", ops=("row_sum", "swiglu", "vector_add_scale")) -> RunSpec:
    spec = RunSpec(run=name, source="demo", ops=list(ops), target="cpu", reference_target="cpu", shapes="small",
                   generators=["tune"], max_tasks=4, chunk_candidates=2, max_concurrent=1)
    save_run(store, spec)
    return spec


def queued(client, queue: str) -> list[str]:
    from farm.distributed import broker

    return sorted(broker.queued_ids(client, [queue]))


def look(settings, store, run: str) -> dict:
    from farm.distributed.reconcile import observe

    return observe(settings, summarize(store, run))


def test_an_op_neither_queued_nor_running_is_stalled_and_recover_enqueues_its_next_task(farm_env):
    """Redis lost its data: the ops' records say where they are, the queues hold nothing."""
    from farm.distributed import reconcile

    settings, store, coord, client = farm_env
    make_run(store)
    update_op(store, "r", "demo", "row_sum", phase="searching", chunk=1, tried=2, running="r:demo:row_sum:search:1")
    update_op(store, "r", "demo", "swiglu", phase="queued")
    update_op(store, "r", "demo", "vector_add_scale", phase="done")
    coord.beat("w1@h", ["reference.cpu", "search.cpu"])  # a live worker serves both queues

    view = look(settings, store, "r")
    states = {r["op"]: r.get("state") for r in view["ops"]}
    assert states == {"row_sum": "stalled", "swiglu": "stalled", "vector_add_scale": None}
    assert view["status"] == "stalled" and view["eta_s"] is None
    row = next(r for r in view["ops"] if r["op"] == "row_sum")
    assert "neither queued nor running" in row["stalled"] and "farm recover r" in row["fix"]

    done = reconcile.recover(settings, store, "r")
    assert sorted(d["task"] for d in done) == ["r:demo:row_sum:search:1", "r:demo:swiglu:reference"]
    assert queued(client, "search.cpu") == ["r:demo:row_sum:search:1"]
    assert queued(client, "reference.cpu") == ["r:demo:swiglu:reference"]
    view = look(settings, store, "r")
    assert {r["op"]: r.get("state") for r in view["ops"]}["row_sum"] == "queued" and view["status"] == "running"
    st = next(r for r in summarize(store, "r")["ops"] if r["op"] == "row_sum")
    assert st["recovered"][-1]["task"] == "r:demo:row_sum:search:1" and st["running"] is None
    assert reconcile.recover(settings, store, "r") == []  # queued now: nothing enqueued twice


def test_a_task_taken_by_a_dead_worker_is_taken_over_and_counted(farm_env):
    """A worker took the chunk, then died: its message sits unacknowledged (for the visibility
    timeout, 2 h by default) and the op's lock has lapsed. The reconciler drops the message,
    counts a redelivery and publishes the chunk again, after seeing it stranded twice."""
    from farm.distributed import broker
    from farm.distributed.publish import enqueue_search
    from farm.distributed.reconcile import Reconciler

    settings, store, coord, client = farm_env
    spec = make_run(store, ops=("row_sum",))
    update_op(store, "r", "demo", "row_sum", phase="searching", chunk=0, worker="dead@h")
    coord.beat("alive@h", ["search.cpu"])
    enqueue_search(spec, "demo", "row_sum", 0)
    raw = client.rpop("search.cpu")  # what a worker's fetch does: the message moves to unacked
    client.hset(broker.UNACKED_KEY, "tag-1", json.dumps([json.loads(raw), "search.cpu", "search.cpu"]))
    client.zadd(broker.UNACKED_INDEX_KEY, {"tag-1": time.time()})

    rec = Reconciler(settings, store, coord)
    view = look(settings, store, "r")
    assert view["ops"][0]["state"] == "queued"  # just taken: it starts (or waits for a retry)
    # taken longer ago than queue.takeover_s, no lock since (aged for real: a time stamp before this
    # Redis started would say the message outlived a restart, a case of its own, below)
    time.sleep(settings.queue.takeover_s + 0.5)
    view = look(settings, store, "r")
    assert view["ops"][0]["state"] == "stalled" and "its worker died" in view["ops"][0]["stalled"]
    assert rec.run_once() == []  # first sighting
    time.sleep(settings.queue.reconcile_interval_s / 2 + 0.1)
    [done] = rec.run_once()
    assert done["task"] == "r:demo:row_sum:search:0"
    assert client.hlen(broker.UNACKED_KEY) == 0 and queued(client, "search.cpu") == ["r:demo:row_sum:search:0"]
    assert coord.counter("redelivered", "r:demo:row_sum:search:0") == 1  # queue.max_redeliveries still caps it


def test_a_task_taken_before_redis_restarted_is_stalled_at_once_and_recovered_uncounted(monkeypatch):
    """Redis restarts with its append-only file: a message a worker had taken (held for a retry's
    countdown, or not started yet) is still listed as taken, but the worker's new connection has
    forgotten it. With its op unlocked it is stalled at once, not after queue.takeover_s (600 s
    here), and published again without counting a redelivery; one taken since the restart waits."""
    from farm.config import load_settings
    from farm.distributed import broker, reconcile
    from farm.distributed.celery_app import configured
    from farm.distributed.coord import Coordinator
    from farm.distributed.publish import enqueue_search

    server = RedisServer(appendonly=True).start()
    try:
        monkeypatch.setenv("FARM_QUEUE_BROKER_URL", server.url())
        for key, value in {**QUICK, "FARM_QUEUE_TAKEOVER_S": "600"}.items():
            monkeypatch.setenv(key, value)
        settings = load_settings()[0]
        configured(settings)
        store = open_store(os.environ["FARM_STORE"])
        spec = make_run(store, ops=("row_sum", "swiglu"))
        for op in spec.ops:
            update_op(store, "r", "demo", op, phase="searching", chunk=0)
            enqueue_search(spec, "demo", op, 0)
        take(server.client(), "tag-before")  # row_sum's chunk, taken now
        time.sleep(reconcile.RESTART_MARGIN_S + 1.5)  # Redis counts its uptime in whole seconds
        Coordinator(server.url()).beat("w@h", ["search.cpu"])
        assert [r["state"] for r in look(settings, store, "r")["ops"]] == ["queued", "queued"]

        server.restart()
        client = server.client()
        coord = Coordinator(server.url(), settings.queue.lock_ttl_s)
        coord.beat("w@h", ["search.cpu"])
        take(client, "tag-after")  # swiglu's chunk, taken by a worker since the restart
        rows = {r["op"]: r for r in look(settings, store, "r")["ops"]}
        assert rows["swiglu"]["state"] == "queued"
        assert rows["row_sum"]["state"] == "stalled" and "before Redis restarted" in rows["row_sum"]["stalled"]

        [done] = reconcile.recover(settings, store, "r")
        assert done["task"] == "r:demo:row_sum:search:0"
        assert queued(client, "search.cpu") == ["r:demo:row_sum:search:0"]
        assert [r.tag for r in broker.reserved(client)] == ["tag-after"]
        assert coord.counter("redelivered", "r:demo:row_sum:search:0") == 0  # the restart is not the chunk's fault
    finally:
        server.cleanup()


def test_a_redis_without_info_leaves_the_takeover_rule(monkeypatch):
    """A managed Redis may rename INFO away: the restart is unknown (None, not an error that would
    stop every reconciler pass and `farm status`), and a taken message waits for the takeover rule."""
    from farm.distributed import broker

    server = RedisServer(args=("--rename-command", "INFO", "")).start()
    try:
        assert broker.started_at(server.client()) is None
    finally:
        server.cleanup()


def take(client, tag: str) -> None:
    """What a worker's fetch does: the queue's first message moves to the unacked set, stamped now."""
    from farm.distributed import broker

    raw = client.rpop("search.cpu")
    client.hset(broker.UNACKED_KEY, tag, json.dumps([json.loads(raw), "search.cpu", "search.cpu"]))
    client.zadd(broker.UNACKED_INDEX_KEY, {tag: time.time()})


def test_a_running_op_holds_its_lock_and_is_left_alone(farm_env):
    from farm.distributed.reconcile import Reconciler

    settings, store, coord, _ = farm_env
    make_run(store, ops=("row_sum",))
    update_op(store, "r", "demo", "row_sum", phase="searching", chunk=3)
    lock = coord.lock("r:demo:row_sum", "busy@h")
    assert lock.acquire()
    try:
        view = look(settings, store, "r")
        assert view["ops"][0]["state"] == "running" and view["ops"][0]["worker"] == "busy@h"
        rec = Reconciler(settings, store, coord, confirm=False)
        assert rec.run_once() == []
    finally:
        lock.release()


def test_a_queue_no_worker_consumes_is_stalled_with_the_command_that_starts_one(farm_env):
    from farm.distributed.publish import enqueue_reference

    settings, store, coord, _ = farm_env
    spec = make_run(store, ops=("row_sum",))
    update_op(store, "r", "demo", "row_sum", phase="queued")
    enqueue_reference(spec, "row_sum", False)
    row = look(settings, store, "r")["ops"][0]
    assert row["state"] == "stalled" and row["stalled"] == "no live worker consumes reference.cpu"
    assert "farm worker --pool reference --target cpu" in row["fix"]
    coord.beat("w@h", ["reference.cpu"])
    assert look(settings, store, "r")["ops"][0]["state"] == "queued"


def test_status_says_so_when_redis_does_not_answer(farm_env, redis_server, cli):  # noqa: F811
    settings, store, _, _ = farm_env
    make_run(store, ops=("row_sum",))
    update_op(store, "r", "demo", "row_sum", phase="searching", tried=1, started_at="2020-01-01T00:00:00+00:00")
    redis_server.stop()
    started = time.monotonic()
    view = look(settings, store, "r")
    assert time.monotonic() - started < 10
    assert view["broker"].startswith("unreachable") and view["eta_s"] is None
    result = cli("status", "r")
    assert result.exit_code == 0 and "broker unreachable" in " ".join(result.output.split())


def test_cancel_removes_the_runs_queued_messages_and_says_cancelling_while_a_chunk_runs(farm_env):
    from farm.distributed import control
    from farm.distributed.publish import enqueue_reference, enqueue_search

    settings, store, coord, client = farm_env
    spec = make_run(store, ops=("row_sum", "swiglu", "vector_add_scale"))
    other = make_run(store, "other", ops=("row_sum",))
    update_op(store, "r", "demo", "row_sum", phase="searching", running="r:demo:row_sum:search:0")
    update_op(store, "r", "demo", "swiglu", phase="queued")
    update_op(store, "r", "demo", "vector_add_scale", phase="searching", chunk=1)
    enqueue_reference(spec, "swiglu", False)
    enqueue_search(spec, "demo", "vector_add_scale", 1)
    enqueue_reference(other, "row_sum", False)
    lock = coord.lock("r:demo:row_sum", "w@h")  # its chunk runs
    assert lock.acquire()
    try:
        result = control.cancel(settings, store, "r")
        assert result["removed"] == 2
        assert queued(client, "reference.cpu") == ["other:demo:row_sum:reference"]
        assert queued(client, "search.cpu") == []
        view = look(settings, store, "r")
        assert view["status"] == "cancelling"  # not "cancelled" while a chunk still runs
        assert {r["op"]: r["phase"] for r in view["ops"]} == {"row_sum": "cancelling", "swiglu": "cancelled",
                                                               "vector_add_scale": "cancelled"}
    finally:
        lock.release()
    update_op(store, "r", "demo", "row_sum", phase="cancelled", running=None)  # the chunk ended
    assert look(settings, store, "r")["status"] == "cancelled"


def test_submit_to_a_queue_no_worker_serves_warns_or_refuses_and_a_wait_timeout_has_its_own_code(farm_env, cli):
    result = cli("submit", "--source", "demo", "--ops", "row_sum", "--target", "cpu", "--max-tasks", "2",
                 "--run", "lonely", "--require-workers")
    assert result.exit_code == 2 and "no live worker consumes reference.cpu, search.cpu" in result.output
    assert "farm worker --pool search --target cpu" in " ".join(result.output.split())
    result = cli("submit", "--source", "demo", "--ops", "row_sum", "--target", "cpu", "--max-tasks", "2",
                 "--run", "lonely", "--wait", "--timeout", "1")
    flat = " ".join(result.output.split())
    assert "the run waits for one" in flat
    assert result.exit_code == 4 and "has not finished after 1 s (--timeout)" in flat


def test_a_chunk_that_loses_its_op_lock_stops_without_checkpoint_or_continuation(farm_env, monkeypatch):
    """Redis forgets the lock while a chunk runs (a restart without its data): another copy may
    take the op, so this one stops at its next candidate, writes no checkpoint past the one it
    resumed from, enqueues nothing and leaves no done mark (the task may run again)."""
    import threading

    from farm.config import load_settings
    from farm.corpus.tasks import find_tasks
    from farm.distributed import work
    from farm.reference.generate import generate_references
    from farm.targets import resolve_device

    settings, store, coord, client = farm_env
    monkeypatch.setenv("FARM_QUEUE_LOCK_TTL_S", "1.5")  # renewed every 0.5 s
    monkeypatch.setattr(work, "_env", None)
    [entry] = generate_references(find_tasks(load_settings()[0], ["demo"], ["row_sum"]), store, resolve_device("cpu"),
                                  0, "small", 120)
    assert entry["success"], entry
    save_run(store, RunSpec(run="lock", source="demo", ops=["row_sum"], target="cpu", reference_target="cpu",
                            shapes="small", generators=["tune"], max_tasks=6, chunk_candidates=6, max_concurrent=1))
    first = threading.Event()
    seen = []
    original = work.CandidateLog.__call__

    def record(self, kind, info):
        original(self, kind, info)
        if kind == "candidate":
            seen.append(info["id"])
            first.set()

    monkeypatch.setattr(work.CandidateLog, "__call__", record)

    def forget_lock():
        first.wait(120)
        client.delete("farm:lock:lock:demo:row_sum")

    threading.Thread(target=forget_lock, daemon=True).start()
    tid = work.search_task_id("lock", "demo", "row_sum", 0)
    result = work.search_chunk(work.Delivery(tid, "w@h"), "lock", "demo", "row_sum", 0)
    assert "lock lapsed" in result.get("stopped", ""), result
    assert 1 <= len(seen) < 6
    assert not work.env().coord.is_done(tid) and queued(client, "search.cpu") == []
    assert store.read_json("runs/lock/demo/row_sum/state.json").get("chunks_done", 0) == 0
    monkeypatch.setattr(work, "_env", None)


def test_status_of_a_big_run_lists_the_ops_that_need_a_look_and_counts_the_rest(farm_env, cli):
    settings, store, coord, _ = farm_env
    make_run(store, "big", ops=[f"op{i:03d}" for i in range(120)])
    for i in range(0, 120, 2):
        update_op(store, "big", "demo", f"op{i:03d}", phase="done", tried=4)
    update_op(store, "big", "demo", "op007", phase="failed", error="boom")
    coord.beat("w@h", ["reference.cpu", "search.cpu"])
    result = cli("status", "big")
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("│")]
    assert len(lines) == 41 and all("stalled" in ln for ln in lines[:40])  # what needs a look comes first
    flat = " ".join(result.stdout.split())
    assert "... 80 more" in flat and "1 failed" in flat and "59 stalled" in flat and "--json lists every op" in flat
    assert len(json.loads(cli("status", "big", "--json").stdout)["ops"]) == 120
