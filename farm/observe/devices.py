"""Memory and utilisation of a worker's devices, for the supervisor's gauges
(farm.observe.worker_metrics):

- a target with a device monitor (`Target.device_monitor`, handed in by the caller: this stage
  imports no other): its driver's counters (cuda: NVML, farm.targets.cuda; ascend: npu-smi,
  farm.ascend.target). Where the monitor has none, the gauges are left out and the cluster's
  DCGM exporter is the place to look (docs/operations.md, "Metrics").
- any other (cpu): the worker's process tree: resident memory, and CPU time per second as a
  share of the CPUs it may use (its affinity, capped by its cgroup's quota), so 1 means all of them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

DEVICE_CACHE_S = 5.0  # one device query per this, however often Prometheus scrapes
CGROUP = Path("/sys/fs/cgroup")


@dataclass
class DeviceStats:
    used_bytes: float | None = None
    total_bytes: float | None = None
    utilization: float | None = None  # 0..1


class Worker(Protocol):  # what the reader needs of farm.observe.worker_metrics.WorkerState
    device: int
    pid: int | None


class Monitor(Protocol):  # farm.targets.base.Target.device_monitor
    def stats(self, devices: list[int]) -> dict[int, dict]: ...


# ---------------------------------------------------------------- cpu: the process tree


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


def cpu_capacity(pid: int, cgroup: Path = CGROUP) -> float:
    """CPUs a process may use: its affinity, capped by its cgroup's CPU quota (v2 cpu.max,
    v1 cfs_quota_us / cfs_period_us) where one is set, as in a pod with a CPU limit."""
    try:
        cores = float(len(os.sched_getaffinity(pid)))
    except OSError:
        cores = float(os.cpu_count() or 1)
    quota = None
    try:
        limit, period = (cgroup / "cpu.max").read_text().split()
        quota = None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        try:
            quota_us = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
            quota = None if quota_us <= 0 else quota_us / int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError, ZeroDivisionError):
            pass
    return max(min(cores, quota) if quota else cores, 1e-9)


def _mem_total() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# ---------------------------------------------------------------- the reader


class DeviceReader:
    """Stats of the devices of one target, cached for DEVICE_CACHE_S: from the target's
    `monitor` where it has one, else from the workers' process trees."""

    def __init__(self, target: str, monitor: Monitor | None = None):
        self.target = target
        self._cache: tuple[float, dict[int, DeviceStats]] = (float("-inf"), {})
        self._cpu_last: dict[int, tuple[int, float, float]] = {}  # device -> (pid, when, cpu seconds)
        self._monitor = monitor
        self._lock = threading.Lock()

    def stats(self, workers: Sequence[Worker]) -> dict[int, DeviceStats]:
        with self._lock:
            at, cached = self._cache
            if time.monotonic() - at > DEVICE_CACHE_S:
                cached = self._query(workers)
                self._cache = (time.monotonic(), cached)
            return cached

    def _query(self, workers: Sequence[Worker]) -> dict[int, DeviceStats]:
        if self._monitor is not None:
            found = self._monitor.stats([w.device for w in workers])
            return {device: DeviceStats(**values) for device, values in found.items()}
        return {w.device: self._cpu_stats(w.device, w.pid) for w in workers if w.pid}

    def _cpu_stats(self, device: int, pid: int) -> DeviceStats:
        """A cpu slot: the worker tree's memory, and its CPU time since the last query as a
        share of the CPUs it may use (at most 1: a tree of busy processes fills them, no more)."""
        pids = _tree(pid)
        now, cpu = time.monotonic(), process_tree_cpu_seconds(pids)
        last = self._cpu_last.get(device)
        self._cpu_last[device] = (pid, now, cpu)
        busy = None
        if last and last[0] == pid and now > last[1]:
            cores_busy = max(0.0, (cpu - last[2]) / (now - last[1]))
            busy = min(1.0, cores_busy / cpu_capacity(pid))
        return DeviceStats(process_tree_rss(pids), _mem_total(), busy)
