"""`farm exporter`: what no single worker can report, read from the broker and the store at
scrape time (at most once per metrics.exporter_refresh_s): queue lengths per pool, and the
progress of every run that is going on or finished within metrics.finished_runs_window_h.
Dashboards and autoscalers (KEDA's prometheus trigger) read it; docs/operations.md lists the
series.

Redis keeps a queue as lists, one per priority step: kombu's `<queue>` for priority 0 and
`<queue>\\x06\\x16<step>` for the steps 3, 6 and 9, and messages a worker has taken but not yet
acknowledged in the `unacked` hash (value: [message, exchange, routing key]). A worker with
acks_late holds its running task there, so "reserved" counts the pool's busy workers too. An
AMQP broker answers a passive queue declaration with its ready count only.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import threading
import time
from typing import Any, Callable, Iterable
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from farm.config import Settings
from farm.distributed.queues import all_queues
from farm.distributed.runs import PHASES, list_runs, summarize
from farm.errors import FarmError, StorageError
from farm.storage import Store

log = logging.getLogger(__name__)

PRIORITY_STEPS = (0, 3, 6, 9)  # kombu's Redis transport default
PRIORITY_SEP = "\x06\x16"
UNACKED_KEY = "unacked"


def redis_list_key(queue: str, priority: int) -> str:
    return f"{queue}{PRIORITY_SEP}{priority}" if priority else queue


# ---------------------------------------------------------------- broker


def redis_queue_lengths(client, queues: list[str]) -> tuple[dict[tuple[str, int], int], dict[str, int]]:
    """({(queue, priority): waiting}, {queue: reserved}) from a Redis broker."""
    pipe = client.pipeline(transaction=False)
    keys = [(q, p) for q in queues for p in PRIORITY_STEPS]
    for q, p in keys:
        pipe.llen(redis_list_key(q, p))
    waiting = dict(zip(keys, pipe.execute()))
    reserved = {q: 0 for q in queues}
    for _tag, value in client.hscan_iter(UNACKED_KEY, count=500):
        routing_key = _routing_key(value)
        if routing_key in reserved:
            reserved[routing_key] += 1
    return waiting, reserved


def _routing_key(value: bytes | str) -> str | None:
    try:
        _message, _exchange, routing_key = json.loads(value)
    except (ValueError, TypeError):
        return None
    return routing_key if isinstance(routing_key, str) else None


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
    now = time.time() if now is None else now
    views = []
    for run in sorted(list_runs(store)):
        try:
            view = summarize(store, run)
        except FarmError as exc:  # an index entry whose run.json is gone: skip it, say so
            log.warning("run %s: %s", run, exc)
            continue
        view["last_progress"] = max([t for r in view["ops"] if (t := _ts(r["updated_at"]))]
                                    + [_ts(view["created_at"]) or 0.0])
        if view["status"] != "running" and now - view["last_progress"] > window_h * 3600:
            continue
        views.append(view)
    return views


# ---------------------------------------------------------------- the collector


class FarmCollector:
    """Queue and run gauges, recomputed at most every `refresh_s`."""

    def __init__(self, settings: Settings, store: Store, redis_factory: Callable[[], Any] | None = None):
        self.settings = settings
        self.store = store
        self.redis_factory = redis_factory or (lambda: _redis_client(settings.queue.broker_url))
        self._redis = None
        self._lock = threading.Lock()
        self._cached: tuple[float, list] = (float("-inf"), [])
        self.errors = {"broker": 0, "store": 0}

    def collect(self) -> Iterable:
        with self._lock:
            at, families = self._cached
            if time.monotonic() - at >= self.settings.metrics.exporter_refresh_s:
                families = self._compute()
                self._cached = (time.monotonic(), families)
        yield from families

    def _compute(self) -> list:
        started = time.monotonic()
        families = self._queues() + self._runs()
        errors = CounterMetricFamily("farm_exporter_errors", "Scrapes in which the broker or the store could not "
                                     "be read.", labels=["part"])
        for part, n in self.errors.items():
            errors.add_metric([part], n)
        took = GaugeMetricFamily("farm_exporter_refresh_seconds", "Time the last refresh took.")
        took.add_metric([], time.monotonic() - started)
        return families + [errors, took]

    def _queues(self) -> list:
        waiting = GaugeMetricFamily("farm_queue_messages", "Messages waiting in a pool's queue, by priority step.",
                                    labels=["queue", "priority"])
        reserved = GaugeMetricFamily("farm_queue_reserved_messages", "Messages taken by a worker and not yet "
                                     "acknowledged (running or about to run).", labels=["queue"])
        queues = all_queues()
        try:
            if urlparse(self.settings.queue.broker_url).scheme in ("redis", "rediss"):
                if self._redis is None:
                    self._redis = self.redis_factory()
                lengths, held = redis_queue_lengths(self._redis, queues)
                for (q, p), n in lengths.items():
                    waiting.add_metric([q, str(p)], n)
                for q, n in held.items():
                    reserved.add_metric([q], n)
            else:
                for q, n in amqp_queue_lengths(self.settings.queue.broker_url, queues).items():
                    waiting.add_metric([q, "all"], n)
        except Exception as exc:  # noqa: BLE001 - a broker outage must not take the exporter down
            self.errors["broker"] += 1
            self._redis = None
            log.warning("broker: %s", exc)
            return []
        return [waiting, reserved]

    def _runs(self) -> list:
        try:
            views = run_views(self.store, self.settings.metrics.finished_runs_window_h)
        except (StorageError, OSError) as exc:
            self.errors["store"] += 1
            log.warning("store: %s", exc)
            return []
        return run_families(views)


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


def registry(settings: Settings, store: Store) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(FarmCollector(settings, store))
    return reg
