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
from tests.s3_server import flaky_proxy, s3_server  # noqa: F401

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
        collector = FarmCollector(settings, open_store(settings.store, settings))
        reg = registry(settings, None, collector)
        collector.refresh()
        got = samples(reg)
        q = lambda queue, prio: got[("farm_queue_messages", (("priority", str(prio)), ("queue", queue)))]  # noqa: E731
        assert [q("search.cpu", p) for p in (0, 3, 6, 9)] == [2, 1, 0, 1]  # kombu rounds 5 down to the step 3
        assert q("reference.cuda", 0) == 1 and q("search.ascend", 0) == 1
        assert got[("farm_queue_reserved_messages", (("queue", "search.ascend"),))] == 1
        assert got[("farm_queue_reserved_messages", (("queue", "search.cpu"),))] == 0
        message.ack()
        held.close()
    assert samples(reg)[("farm_queue_reserved_messages", (("queue", "search.ascend"),))] == 1  # served from the cache
    collector.refresh("broker")
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


def test_a_broker_outage_keeps_the_last_series_and_says_so(broker, tmp_path):
    server, app = broker
    settings = load_settings()[0]
    store = open_store(settings.store, settings)
    save_run(store, _spec("live", ["row_sum"]))
    app.send_task("farm.ping", queue="search.cpu")
    collector = FarmCollector(settings, store)
    reg = registry(settings, store, collector)
    collector.refresh()
    server.stop()
    collector.refresh()
    got = samples(reg)
    assert got[("farm_queue_messages", (("priority", "0"), ("queue", "search.cpu")))] == 1  # the last it read
    assert got[("farm_exporter_source_up", (("part", "broker"),))] == 0
    assert got[("farm_exporter_source_up", (("part", "store"),))] == 1
    assert got[("farm_exporter_errors_total", (("part", "broker"),))] == 1 and collector.errors["store"] == 0
    assert ("farm_run_info", (("run", "live"), ("source", "demo"), ("status", "running"), ("target", "cpu"))) in got


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


# ---------------------------------------------------------------- a store that fails or hangs


class Silent:
    """A TCP server that accepts every connection and never answers: a hung S3."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture
def s3_store_env(broker, s3_server, monkeypatch):  # noqa: F811
    def use(endpoint: str):
        monkeypatch.setenv("FARM_STORE", f"s3://{s3_server.bucket}/farm")
        monkeypatch.setenv("FARM_S3_ENDPOINT_URL", endpoint)
        for key, value in {"MAX_ATTEMPTS": "1", "CONNECT_TIMEOUT_S": "1", "READ_TIMEOUT_S": "3"}.items():
            monkeypatch.setenv(f"FARM_S3_{key}", value)
        settings = load_settings()[0]
        return settings, open_store(settings.store, settings)

    return use


def test_a_store_that_refuses_keeps_the_run_series_and_shows_as_its_own_metric(s3_store_env, flaky_proxy,  # noqa: F811
                                                                               broker):
    _server, app = broker
    settings, store = s3_store_env(flaky_proxy.endpoint)
    save_run(store, _spec("live", ["row_sum"]))
    update_op(store, "live", "demo", "row_sum", phase="searching", tried=3)
    collector = FarmCollector(settings, store)
    reg = registry(settings, store, collector)
    collector.refresh()
    flaky_proxy.stop()  # connections refused from now on
    app.send_task("farm.ping", queue="search.cpu")
    collector.refresh()
    got = samples(reg)
    assert got[("farm_run_candidates", (("run", "live"),))] == 3  # the run's series stay, as last read
    assert got[("farm_exporter_source_up", (("part", "store"),))] == 0
    assert got[("farm_exporter_errors_total", (("part", "store"),))] == 1
    assert got[("farm_queue_messages", (("priority", "0"), ("queue", "search.cpu")))] == 1  # the broker is read
    assert got[("farm_exporter_source_up", (("part", "broker"),))] == 1


def test_a_hung_store_blocks_neither_the_scrape_nor_the_queue_lengths(s3_store_env, broker):
    """S3 accepts connections and never answers: the store's loop waits for its read timeout,
    scrapes answer at once from the cache, and queue lengths keep being read."""
    _server, app = broker
    hung = Silent()
    try:
        settings, store = s3_store_env(f"http://127.0.0.1:{hung.port}")
        collector = FarmCollector(settings, store).start()
        reg = registry(settings, store, collector)
        app.send_task("farm.ping", queue="search.cpu")
        deadline = time.monotonic() + 10
        while collector.parts["broker"].ok_at is None or time.time() - collector.parts["broker"].ok_at > 1:
            assert time.monotonic() < deadline, "the broker's loop never refreshed"
            time.sleep(0.1)
        for _ in range(3):
            started = time.monotonic()
            text = collector.render().decode()  # what the endpoint sends
            assert time.monotonic() - started < 1.0
            time.sleep(0.3)
        assert 'farm_queue_messages{priority="0",queue="search.cpu"} 1.0' in text
        assert 'farm_exporter_source_up{part="store"} 0.0' in text
        got = samples(reg)
        assert got[("farm_exporter_last_refresh_age_seconds", (("part", "store"),))] >= 0.9
        assert got[("farm_exporter_last_refresh_age_seconds", (("part", "broker"),))] < 2
        collector.stop()
    finally:
        hung.close()


def test_only_runs_that_changed_are_read_again(broker):
    settings = load_settings()[0]
    store = open_store(settings.store, settings)
    save_run(store, _spec("a", ["row_sum"]))
    save_run(store, _spec("b", ["row_sum", "swiglu"]))
    collector = FarmCollector(settings, store)
    collector.refresh("store")
    assert collector.runs.reads == 2
    collector.refresh("store")
    assert collector.runs.reads == 2  # nothing changed: nothing read but the stamps
    update_op(store, "b", "demo", "swiglu", phase="searching", tried=5)
    collector.refresh("store")
    assert collector.runs.reads == 3
    assert samples(registry(settings, store, collector))[("farm_run_candidates", (("run", "b"),))] == 5


def test_a_scrape_at_ten_thousand_ops_serves_from_the_cache_in_under_a_second(broker):
    """The run series of 10,000 ops (70,000 samples) are rendered when the store's loop reads
    them; a scrape sends those bytes, with the parts' health rendered fresh, over HTTP."""
    import urllib.request

    from farm.distributed.exporter import render, run_families, serve
    from tests.s3_server import free_port

    settings = load_settings()[0]
    ops = [{"source": "demo", "op": f"op{i:05d}", "phase": "searching", "tried": 3, "passed": 1, "best_speedup": 1.1,
            "updated_at": "2026-01-01T00:00:00+00:00", "verdicts": {"pass": 1, "incorrect": 2}} for i in range(10_000)]
    view = {"run": "big", "spec": {"source": "demo", "target": "cpu"}, "status": "running", "eta_s": 60.0,
            "last_progress": time.time(), "ops": ops,
            "totals": {"tried": 30_000, "passed": 10_000, "budget": 80_000}}
    collector = FarmCollector(settings, open_store(settings.store, settings))
    collector.parts["store"].text = render(run_families([view]))  # as a refresh leaves it
    port = free_port()
    server = serve(collector, "127.0.0.1", port)
    try:
        started = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read()
        took = time.monotonic() - started
    finally:
        server.shutdown()
    assert text.count(b"farm_run_op_candidates{") == 10_000 and b"farm_exporter_source_up" in text
    assert took < 1.0, took
