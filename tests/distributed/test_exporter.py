"""`farm exporter` against a real Redis broker, with messages published by Celery itself (so the
priority sub-queue names are kombu's, not our guess) and a message held unacknowledged."""

from __future__ import annotations

import json
import time

import pytest

from farm.config import load_settings
from farm.distributed.exporter import FarmCollector, registry, run_views
from farm.distributed.runs import RunSpec, save_run, update_op
from farm.storage import open_store
from tests.redis_server import redis_server  # noqa: F401

pytest.importorskip("celery")


def samples(reg) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in reg.collect() for s in m.samples}


def _spec(run: str, ops: list[str]) -> RunSpec:
    return RunSpec(run=run, source="demo", ops=ops, target="cpu", reference_target="cpu", shapes="small",
                   generators=["tune"], max_tasks=8, chunk_candidates=2, max_concurrent=1)


@pytest.fixture
def broker(redis_server, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("FARM_QUEUE_BROKER_URL", redis_server.url())
    monkeypatch.setenv("FARM_STORE", f"file://{tmp_path / 'store'}")
    monkeypatch.setenv("FARM_METRICS_EXPORTER_REFRESH_S", "0")
    from celery import Celery

    app = Celery("farm-test", broker=redis_server.url())  # a publisher of its own: kombu's key layout
    yield redis_server, app
    app.close()


def test_queue_lengths_by_priority_and_reserved(broker):
    server, app = broker
    for priority in (0, 0, 5, 9):
        app.send_task("farm.ping", queue="search.cpu", priority=priority)
    app.send_task("farm.ping", queue="reference.cuda")
    with app.connection_for_write() as conn:  # a consumer takes one message and does not ack it yet
        held = conn.SimpleQueue("search.ascend")
        app.send_task("farm.ping", queue="search.ascend")
        app.send_task("farm.ping", queue="search.ascend")
        message = held.get(timeout=5)
        settings = load_settings()[0]
        reg = registry(settings, open_store(settings.store, settings))
        got = samples(reg)
        q = lambda queue, prio: got[("farm_queue_messages", (("priority", str(prio)), ("queue", queue)))]  # noqa: E731
        assert [q("search.cpu", p) for p in (0, 3, 6, 9)] == [2, 1, 0, 1]  # kombu rounds 5 down to the step 3
        assert q("reference.cuda", 0) == 1 and q("search.ascend", 0) == 1
        assert got[("farm_queue_reserved_messages", (("queue", "search.ascend"),))] == 1
        assert got[("farm_queue_reserved_messages", (("queue", "search.cpu"),))] == 0
        message.ack()
        held.close()
    assert samples(reg)[("farm_queue_reserved_messages", (("queue", "search.ascend"),))] == 0


def test_run_progress_and_the_finished_window(broker, tmp_path):
    settings = load_settings()[0]
    store = open_store(settings.store, settings)
    save_run(store, _spec("live", ["row_sum", "swiglu"]))
    update_op(store, "live", "demo", "row_sum", phase="searching", tried=4, passed=3, best_speedup=1.25,
              verdicts={"pass": 3, "incorrect": 1})
    update_op(store, "live", "demo", "swiglu", phase="done", tried=8, passed=8, best_speedup=2.0)
    save_run(store, _spec("old", ["row_sum"]))
    update_op(store, "old", "demo", "row_sum", phase="done", tried=8, passed=1, best_speedup=1.0)
    got = samples(registry(settings, store))
    assert got[("farm_run_info", (("run", "live"), ("source", "demo"), ("status", "running"), ("target", "cpu")))] == 1
    assert got[("farm_run_candidates", (("run", "live"),))] == 12
    assert got[("farm_run_budget_candidates", (("run", "live"),))] == 16
    assert got[("farm_run_ops", (("phase", "searching"), ("run", "live")))] == 1
    assert got[("farm_run_op_best_speedup", (("op", "row_sum"), ("run", "live"), ("source", "demo")))] == 1.25
    assert got[("farm_run_op_phase", (("op", "swiglu"), ("phase", "done"), ("run", "live"), ("source", "demo")))] == 1
    assert got[("farm_run_op_verdict_candidates",
                (("op", "row_sum"), ("run", "live"), ("source", "demo"), ("verdict", "incorrect")))] == 1
    assert abs(got[("farm_run_last_progress_timestamp_seconds", (("run", "live"),))] - time.time()) < 60
    assert ("farm_run_info", (("run", "old"), ("source", "demo"), ("status", "finished"), ("target", "cpu"))) in got
    # a finished run drops out after the window; a running one never does
    later = time.time() + 25 * 3600
    assert [v["run"] for v in run_views(store, 24.0, now=later)] == ["live"]


def test_a_broker_outage_is_counted_not_fatal(broker, tmp_path):
    server, _app = broker
    settings = load_settings()[0]
    collector = FarmCollector(settings, open_store(settings.store, settings))
    server.stop()
    names = {m.name for m in collector.collect()}
    assert "farm_queue_messages" not in names and "farm_run_info" in names
    assert collector.errors["broker"] == 1


def test_exporter_once_prints_metrics_and_json(cli, broker):
    server, app = broker
    app.send_task("farm.ping", queue="search.cuda")
    text = cli("exporter", "--once").stdout
    assert 'farm_queue_messages{priority="0",queue="search.cuda"} 1.0' in text
    doc = json.loads(cli("exporter", "--once", "--json").stdout)
    assert any(s["labels"] == {"queue": "search.cuda", "priority": "0"} and s["value"] == 1
               for s in doc["farm_queue_messages"])


def test_exporter_port_in_use_is_a_clear_error(cli, broker):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = cli("--set", "metrics.addr=127.0.0.1", "exporter", "--port", str(port))
    assert result.exit_code != 0 and "cannot serve on port" in result.output and "Traceback" not in result.output


def test_amqp_queue_lengths_from_a_real_rabbitmq():
    """The machine's RabbitMQ (guest/guest on 5672), with queue names of this test's own."""
    import os
    import socket
    import uuid

    from kombu import Connection

    from farm.distributed.exporter import amqp_queue_lengths

    url = os.environ.get("FARM_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        if os.environ.get("CI"):
            pytest.fail("RabbitMQ is not running on 127.0.0.1:5672")
        pytest.skip("RabbitMQ is not running on 127.0.0.1:5672")
    name = f"farm-test-{uuid.uuid4().hex[:8]}"
    with Connection(url, connect_timeout=5) as conn:
        queue = conn.SimpleQueue(name)
        try:
            for n in range(3):
                queue.put({"n": n})
            deadline = time.monotonic() + 5
            while (got := amqp_queue_lengths(url, [name, name + "-missing"]))[name] < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert got == {name: 3, name + "-missing": 0}
        finally:
            queue.queue.delete()
            queue.close()
