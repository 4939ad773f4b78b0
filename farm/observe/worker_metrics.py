"""What `farm worker` serves on its metrics port: the sum of its processes' metrics files
(farm.observe.metrics, multiprocess mode) and what only the supervisor knows: which of its Celery
workers are up, how often each was restarted, and the memory and utilisation of their devices
(farm.observe.devices: the target's device monitor, else the process tree).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from farm.observe.devices import DeviceReader


@dataclass
class WorkerState:
    """One Celery worker as the supervisor sees it."""

    pool: str  # 'reference,search' when a worker consumes both
    target: str
    device: int
    up: bool
    restarts: int
    pid: int | None


# ---------------------------------------------------------------- the supervisor's collector


class SupervisorCollector:
    """farm_worker_up, farm_worker_restarts_total and the device gauges, read at scrape time."""

    def __init__(self, workers: Callable[[], list[WorkerState]], target: str, monitor=None):
        """`monitor`: the target's (farm.targets.base.Target.device_monitor), or None."""
        self.workers = workers
        self.reader = DeviceReader(target, monitor)
        self.target = target

    def collect(self) -> Iterable:
        states = self.workers()
        labels = ["pool", "target", "device"]
        up = GaugeMetricFamily("farm_worker_up", "1 while a worker's Celery process runs, 0 while it is "
                               "being restarted.", labels=labels)
        restarts = CounterMetricFamily("farm_worker_restarts", "Times the supervisor restarted a worker that exited.",
                                       labels=labels)
        for w in states:
            key = [w.pool, w.target, str(w.device)]
            up.add_metric(key, 1.0 if w.up else 0.0)
            restarts.add_metric(key, float(w.restarts))
        yield up
        yield restarts
        yield from self._devices(states)

    def _devices(self, states: list[WorkerState]) -> Iterable:
        stats = self.reader.stats(states)
        families = {
            "used_bytes": GaugeMetricFamily("farm_device_memory_used_bytes", "Device memory in use (cpu: the worker "
                                            "process tree's resident memory).", labels=["target", "device"]),
            "total_bytes": GaugeMetricFamily("farm_device_memory_total_bytes", "Device memory in all (cpu: the "
                                             "host's).", labels=["target", "device"]),
            "utilization": GaugeMetricFamily("farm_device_utilization_ratio", "Device utilisation, 0 to 1 (NVML "
                                             "GPU utilisation, npu-smi Aicore usage; cpu: the worker tree's CPU "
                                             "time per second over the CPUs it may use).",
                                             labels=["target", "device"]),
        }
        for w in states:
            s = stats.get(w.device)
            for attr, family in families.items():
                value = getattr(s, attr, None) if s else None
                if value is not None:
                    family.add_metric([self.target, str(w.device)], value)
        yield from families.values()


def serve(port: int, multiproc_dir: Path, extra: list | None = None, addr: str = "0.0.0.0"):
    """Serve the processes' metrics files plus `extra` collectors on `port`; returns the server."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(multiproc_dir))
    for collector in extra or []:
        registry.register(collector)
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
