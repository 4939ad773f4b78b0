"""What `farm worker` serves on its metrics port: the sum of its processes' metrics files
(farm.observe.metrics, multiprocess mode) and what only the supervisor knows: which of its Celery
workers are up, how often each was restarted, and the memory and utilisation of their devices
as the device's own tool reports them (nvidia-smi; npu-smi on Ascend; the process tree's RSS
for cpu workers).

npu-smi's `info -t usages` output is parsed from Huawei's documentation of it; no Ascend
device has run this code (docs/ascend.md).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

log = logging.getLogger(__name__)

SMI_TIMEOUT_S = 5.0
DEVICE_CACHE_S = 5.0  # one device query per this, however often Prometheus scrapes
MIB = 1024 * 1024


@dataclass
class DeviceStats:
    used_bytes: float | None = None
    total_bytes: float | None = None
    utilization: float | None = None  # 0..1, as the device's tool reports it


@dataclass
class WorkerState:
    """One Celery worker as the supervisor sees it."""

    pool: str  # 'reference,search' when a worker consumes both
    target: str
    device: int
    up: bool
    restarts: int
    pid: int | None


# ---------------------------------------------------------------- device tools


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s: %s", cmd[0], exc)
        return None
    return done.stdout if done.returncode == 0 else None


def parse_nvidia_smi(text: str) -> dict[int, DeviceStats]:
    """`nvidia-smi --query-gpu=index,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits`."""
    stats = {}
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        stats[int(parts[0])] = DeviceStats(_num(parts[1], MIB), _num(parts[2], MIB), _num(parts[3], 0.01))
    return stats


def parse_npu_smi_usages(text: str) -> DeviceStats:
    """`npu-smi info -t usages -i N`: 'HBM Capacity(MB) : 65536', 'HBM Usage Rate(%) : 3',
    'Aicore Usage Rate(%) : 40' lines (devices without HBM report Memory Capacity instead)."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[re.sub(r"\s+", " ", key.strip()).lower()] = value.strip()
    capacity = _num(fields.get("hbm capacity(mb)") or fields.get("memory capacity(mb)"), MIB)
    rate = _num(fields.get("hbm usage rate(%)") or fields.get("memory usage rate(%)"), 0.01)
    used = capacity * rate if capacity is not None and rate is not None else None
    return DeviceStats(used, capacity, _num(fields.get("aicore usage rate(%)"), 0.01))


def _num(text: str | None, scale: float) -> float | None:
    try:
        return float(text) * scale
    except (TypeError, ValueError):
        return None  # '[N/A]', '[Not Supported]', missing


def _tree(root_pid: int) -> list[int]:
    """A process and all its descendants."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def process_tree_rss(pids: list[int]) -> float | None:
    """Resident bytes of these processes (a cpu worker's tree: its 'device memory')."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return float(total) if total else None


def process_tree_cpu_seconds(pids: list[int]) -> float:
    """CPU time of these processes, with that of children they have reaped (evaluation sandboxes)."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        except (OSError, IndexError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def _mem_total() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class DeviceProbe:
    """Stats of the devices of one target, cached for DEVICE_CACHE_S."""

    def __init__(self, target: str):
        self.target = target
        self._cache: tuple[float, dict[int, DeviceStats]] = (float("-inf"), {})
        self._cpu_last: dict[int, tuple[int, float, float]] = {}  # device -> (pid, when, cpu seconds)
        self._lock = threading.Lock()

    def stats(self, workers: list[WorkerState]) -> dict[int, DeviceStats]:
        with self._lock:
            at, cached = self._cache
            if time.monotonic() - at > DEVICE_CACHE_S:
                cached = self._query(workers)
                self._cache = (time.monotonic(), cached)
            return cached

    def _query(self, workers: list[WorkerState]) -> dict[int, DeviceStats]:
        if self.target == "cuda":
            out = _run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total,utilization.gpu",
                        "--format=csv,noheader,nounits"])
            return parse_nvidia_smi(out) if out else {}
        if self.target == "ascend":
            found = {}
            for w in workers:
                out = _run(["npu-smi", "info", "-t", "usages", "-i", str(w.device)])
                if out:
                    found[w.device] = parse_npu_smi_usages(out)
            return found
        return {w.device: self._cpu_stats(w.device, w.pid) for w in workers if w.pid}

    def _cpu_stats(self, device: int, pid: int) -> DeviceStats:
        """A cpu slot: the worker tree's memory, and its CPU time since the last query as a
        fraction of one core (utilisation)."""
        pids = _tree(pid)
        now, cpu = time.monotonic(), process_tree_cpu_seconds(pids)
        last = self._cpu_last.get(device)
        self._cpu_last[device] = (pid, now, cpu)
        busy = None
        if last and last[0] == pid and now > last[1]:
            busy = max(0.0, (cpu - last[2]) / (now - last[1]))
        return DeviceStats(process_tree_rss(pids), _mem_total(), busy)


# ---------------------------------------------------------------- the supervisor's collector


class SupervisorCollector:
    """farm_worker_up, farm_worker_restarts_total and the device gauges, read at scrape time."""

    def __init__(self, workers: Callable[[], list[WorkerState]], target: str):
        self.workers = workers
        self.probe = DeviceProbe(target)
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
        stats = self.probe.stats(states)
        families = {
            "used_bytes": GaugeMetricFamily("farm_device_memory_used_bytes", "Device memory in use (cpu: the worker "
                                            "process tree's resident memory).", labels=["target", "device"]),
            "total_bytes": GaugeMetricFamily("farm_device_memory_total_bytes", "Device memory in all (cpu: the "
                                             "host's).", labels=["target", "device"]),
            "utilization": GaugeMetricFamily("farm_device_utilization_ratio", "Device utilisation as its tool "
                                             "reports it (nvidia-smi utilization.gpu, npu-smi Aicore usage; cpu: "
                                             "the worker tree's CPU time per second, in cores).",
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
