"""`farm exporter`: what no single worker can report: queue lengths per pool, and the progress
of every run that is going on or finished within metrics.finished_runs_window_h. Dashboards
and autoscalers (KEDA's prometheus trigger) read it; docs/operations.md lists the series.

A scrape never waits on the broker or the store: it serves what two background loops last
read, each every metrics.exporter_refresh_s, apart, so a hung store cannot hold back queue
lengths. A part that fails keeps its last series and says so in its own series: seconds since
its last good refresh, refreshes that failed, and whether the last one worked. The store's
loop reads only what changed: one small object per run tells whether any of its ops moved
(farm.distributed.runs.touch), and a run that did not is served from the cache.

Redis keeps a queue as kombu lays it out (farm.distributed.broker): "reserved" counts messages
a worker holds unacknowledged, its running task included. An AMQP broker answers a passive
queue declaration with its ready count only.
"""

from __future__ import annotations

import datetime as _dt
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from farm.config import Settings
from farm.distributed import broker
from farm.distributed.broker import redis_list_key  # noqa: F401  (the key layout, for the deploy checks)
from farm.distributed.queues import all_queues
from farm.distributed.runs import PHASES, list_runs, run_version, summarize
from farm.errors import FarmError, StorageError
from farm.storage import Store

log = logging.getLogger(__name__)
PARTS = ("broker", "store")


def amqp_queue_lengths(broker_url: str, queues: list[str]) -> dict[str, int]:
    """Ready messages per queue from an AMQP broker (passive declare: a missing queue is 0)."""
    from kombu import Connection

    found = {}
    with Connection(broker_url, connect_timeout=5) as conn:
        for q in queues:
            channel = conn.channel()
            try:
                found[q] = channel.queue_declare(queue=q, passive=True).message_count
            except conn.channel_errors:
                found[q] = 0
            finally:
                try:
                    channel.close()
                except conn.connection_errors + conn.channel_errors:
                    pass
    return found


# ---------------------------------------------------------------- runs


def _ts(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return _dt.datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def run_views(store: Store, window_h: float, now: float | None = None) -> list[dict[str, Any]]:
    """`farm status` views of the runs to export: going on, or finished within the window."""
    return RunCache(store, window_h).views(now)


# ---------------------------------------------------------------- the collector


@dataclass
class Part:
    """One source of series, refreshed by its own loop."""

    name: str
    read: Callable[[], list]
    families: list = field(default_factory=list)
    text: bytes = b""  # the families in the exposition format, rendered once per refresh
    ok_at: float | None = None
    errors: int = 0
    up: bool = False
    took_s: float = 0.0


class FarmCollector:
    """Serves the series the parts last read; `refresh` reads them (the loops call it)."""

    def __init__(self, settings: Settings, store: Store, redis_factory: Callable[[], Any] | None = None):
        self.settings = settings
        self.store = store
        self.redis_factory = redis_factory or (lambda: _redis_client(settings.queue.broker_url))
        self._redis = None
        self.started = time.time()
        self.parts = {"broker": Part("broker", self._queues), "store": Part("store", self._runs)}
        self.runs = RunCache(store, settings.metrics.finished_runs_window_h)
        self._stop = threading.Event()

    @property
    def errors(self) -> dict[str, int]:
        return {name: part.errors for name, part in self.parts.items()}

    def refresh(self, name: str | None = None) -> None:
        for part in [self.parts[name]] if name else self.parts.values():
            started = time.monotonic()
            try:
                families = part.read()
                part.families, part.text = families, render(families)
                part.ok_at, part.up = time.time(), True
            except Exception as exc:  # noqa: BLE001 - an outage is a series of its own, never a dead exporter
                part.errors += 1
                part.up = False
                log.warning("%s: %s", part.name, exc)
            part.took_s = time.monotonic() - started

    def start(self) -> FarmCollector:
        """A loop per part, so a hung store never holds back the queue lengths."""
        every = max(self.settings.metrics.exporter_refresh_s, 0.5)
        for name in self.parts:
            def loop(name: str = name) -> None:
                while True:
                    self.refresh(name)
                    if self._stop.wait(every):
                        return

            threading.Thread(target=loop, name=f"farm-exporter-{name}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def collect(self) -> Iterable:
        for part in self.parts.values():
            yield from part.families
        yield from self._health()

    def render(self) -> bytes:
        """What a scrape gets: the parts as last rendered, and their health as of now. Rendering
        tens of thousands of series takes a second or more, so it happens at refresh, not here."""
        return b"".join(part.text for part in self.parts.values()) + render(self._health())

    def _health(self) -> list:
        now = time.time()
        age = GaugeMetricFamily("farm_exporter_last_refresh_age_seconds", "Seconds since the exporter last read this "
                                "part (broker, store) successfully (since it started, if never).", labels=["part"])
        up = GaugeMetricFamily("farm_exporter_source_up", "1 if the exporter's last read of this part worked; its "
                               "series are as old as farm_exporter_last_refresh_age_seconds.", labels=["part"])
        errors = CounterMetricFamily("farm_exporter_errors", "Refreshes in which the broker or the store could not "
                                     "be read.", labels=["part"])
        took = GaugeMetricFamily("farm_exporter_refresh_seconds", "Time the last refresh of this part took.",
                                 labels=["part"])
        for name, part in self.parts.items():
            age.add_metric([name], now - (part.ok_at or self.started))
            up.add_metric([name], 1.0 if part.up else 0.0)
            errors.add_metric([name], part.errors)
            took.add_metric([name], part.took_s)
        return [age, up, errors, took]

    def _queues(self) -> list:
        waiting = GaugeMetricFamily("farm_queue_messages", "Messages waiting in a pool's queue, by priority step.",
                                    labels=["queue", "priority"])
        reserved = GaugeMetricFamily("farm_queue_reserved_messages", "Messages taken by a worker and not yet "
                                     "acknowledged (running or about to run).", labels=["queue"])
        queues = all_queues()
        if urlparse(self.settings.queue.broker_url).scheme in ("redis", "rediss"):
            try:
                if self._redis is None:
                    self._redis = self.redis_factory()
                lengths, held = broker.lengths(self._redis, queues)
            except Exception:
                self._redis = None  # a new connection next time
                raise
            for (q, p), n in lengths.items():
                waiting.add_metric([q, str(p)], n)
            for q, n in held.items():
                reserved.add_metric([q], n)
        else:
            for q, n in amqp_queue_lengths(self.settings.queue.broker_url, queues).items():
                waiting.add_metric([q, "all"], n)
        return [waiting, reserved]

    def _runs(self) -> list:
        return run_families(self.runs.views())


class RunCache:
    """The `farm status` view of each run, re-read only when the run changed (its version: the
    stamp every op update writes, a local run's ledger and catalogue entry)."""

    def __init__(self, store: Store, window_h: float):
        self.store, self.window_h = store, window_h
        self.cached: dict[str, tuple[Any, dict]] = {}
        self.reads = 0  # runs summarised: how much work the incremental refresh did

    def views(self, now: float | None = None) -> list[dict[str, Any]]:
        now = time.time() if now is None else now
        entries = list_runs(self.store)
        self.cached = {run: got for run, got in self.cached.items() if run in entries}
        views = []
        for run in sorted(entries):
            version = run_version(self.store, run, entries[run])
            hit = self.cached.get(run)
            if hit is None or hit[0] != version:
                try:
                    view = _with_progress(summarize(self.store, run))
                except StorageError:
                    raise  # the store itself failed: the whole refresh did, and says so
                except FarmError as exc:  # an index entry whose records are gone: skip it, say so
                    log.warning("run %s: %s", run, exc)
                    continue
                self.reads += 1
                hit = self.cached[run] = (version, view)
            view = hit[1]
            if view["status"] not in ("running", "cancelling") and now - view["last_progress"] > self.window_h * 3600:
                continue
            views.append(view)
        return views


def _with_progress(view: dict) -> dict:
    view["last_progress"] = max([t for r in view["ops"] if (t := _ts(r["updated_at"]))]
                                + [_ts(view["created_at"]) or 0.0])
    return view


def run_families(views: list[dict[str, Any]]) -> list:
    g = GaugeMetricFamily
    info = g("farm_run_info", "1 per run shown: its source, target and status (running, finished, cancelled).",
             labels=["run", "source", "target", "status"])
    ops = g("farm_run_ops", "Ops of a run in each phase.", labels=["run", "phase"])
    tried = g("farm_run_candidates", "Candidates evaluated in a run.", labels=["run"])
    passed = g("farm_run_passed_candidates", "Candidates of a run that passed verification.", labels=["run"])
    budget = g("farm_run_budget_candidates", "Candidates a run may evaluate in all (max_tasks x ops).", labels=["run"])
    eta = g("farm_run_eta_seconds", "Estimated seconds until a run finishes.", labels=["run"])
    progress = g("farm_run_last_progress_timestamp_seconds", "When an op of the run last reported progress.",
                 labels=["run"])
    op_phase = g("farm_run_op_phase", "1 for the phase an op is in.", labels=["run", "source", "op", "phase"])
    op_tried = g("farm_run_op_candidates", "Candidates evaluated for an op.", labels=["run", "source", "op"])
    op_passed = g("farm_run_op_passed_candidates", "Candidates of an op that passed.", labels=["run", "source", "op"])
    op_best = g("farm_run_op_best_speedup", "Best verified speedup over the original Model of an op so far.",
                labels=["run", "source", "op"])
    op_updated = g("farm_run_op_last_progress_timestamp_seconds", "When an op last reported progress.",
                   labels=["run", "source", "op"])
    op_verdicts = g("farm_run_op_verdict_candidates", "Candidates of an op evaluated, by verdict (as of its last "
                    "finished chunk).", labels=["run", "source", "op", "verdict"])
    for v in views:
        run, spec = v["run"], v["spec"]
        info.add_metric([run, spec["source"], spec["target"], v["status"]], 1)
        for phase in PHASES:
            ops.add_metric([run, phase], sum(1 for r in v["ops"] if r["phase"] == phase))
        tried.add_metric([run], v["totals"]["tried"])
        passed.add_metric([run], v["totals"]["passed"])
        budget.add_metric([run], v["totals"]["budget"])
        if v["eta_s"] is not None:
            eta.add_metric([run], v["eta_s"])
        progress.add_metric([run], v["last_progress"])
        for r in v["ops"]:
            key = [run, r["source"], r["op"]]
            op_phase.add_metric([*key, r["phase"]], 1)
            op_tried.add_metric(key, r["tried"])
            op_passed.add_metric(key, r["passed"])
            if r["best_speedup"] is not None:
                op_best.add_metric(key, r["best_speedup"])
            if (t := _ts(r["updated_at"])) is not None:
                op_updated.add_metric(key, t)
            for verdict, n in (r.get("verdicts") or {}).items():
                op_verdicts.add_metric([*key, verdict], n)
    return [info, ops, tried, passed, budget, eta, progress, op_phase, op_tried, op_passed, op_best, op_updated,
            op_verdicts]


def _redis_client(url: str):
    import redis

    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


class _Fixed:
    def __init__(self, families: list):
        self.families = families

    def collect(self) -> Iterable:
        return iter(self.families)


def render(families: list) -> bytes:
    from prometheus_client import generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Fixed(families))
    return generate_latest(reg)


def serve(collector: FarmCollector, addr: str, port: int):
    """The exporter's HTTP endpoint: /metrics answers from the collector's rendered cache."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prometheus_client import CONTENT_TYPE_LATEST

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?")[0] not in ("/", "/metrics"):
                self.send_error(404)
                return
            body = collector.render()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((addr, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="farm-exporter-http", daemon=True).start()
    return server


def registry(settings: Settings, store: Store, collector: FarmCollector | None = None) -> CollectorRegistry:
    """A registry of the exporter's series; without a running collector, read once now."""
    if collector is None:
        collector = FarmCollector(settings, store)
        collector.refresh()
    reg = CollectorRegistry()
    reg.register(collector)
    return reg
