"""Memory and utilisation of a worker's devices, for the supervisor's gauges
(farm.observe.worker_metrics):

- cuda: NVML, through nvidia-ml-py (`pynvml`, the extra `nvml`), imported on first use: the
  driver's own counters, no child process and no text to parse. Without it the gauges are left
  out and the cluster's DCGM exporter is the place to look (docs/operations.md, "Metrics").
- ascend: `npu-smi info -t usages`, parsed from Huawei's documentation of it; no Ascend device
  has run this code (docs/ascend.md).
- cpu: the worker's process tree: resident memory, and CPU time per second as a share of the
  CPUs it may use (its affinity, capped by its cgroup's quota), so 1 means all of them.
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
from typing import Protocol

log = logging.getLogger(__name__)

SMI_TIMEOUT_S = 5.0
DEVICE_CACHE_S = 5.0  # one device query per this, however often Prometheus scrapes
MIB = 1024 * 1024
CGROUP = Path("/sys/fs/cgroup")


@dataclass
class DeviceStats:
    used_bytes: float | None = None
    total_bytes: float | None = None
    utilization: float | None = None  # 0..1


class Worker(Protocol):  # what the probe needs of farm.observe.worker_metrics.WorkerState
    device: int
    pid: int | None


# ---------------------------------------------------------------- cuda: NVML


class Nvml:
    """NVML, initialised once per process on first use; a host without the driver or without
    nvidia-ml-py reports no devices (said once in the log, not on every scrape)."""

    def __init__(self):
        self._lib = None
        self._failed = ""

    def _load(self):
        if self._lib is None and not self._failed:
            try:
                import pynvml  # nvidia-ml-py: only cuda workers need it

                pynvml.nvmlInit()
                self._lib = pynvml
            except ImportError:
                self._failed = "nvidia-ml-py is not installed (pip install 'kernel-farm[nvml]')"
            except Exception as exc:  # noqa: BLE001 - pynvml.NVMLError: no driver, no device
                self._failed = f"NVML cannot start: {exc}"
            if self._failed:
                log.warning("GPU gauges off: %s; the cluster's DCGM exporter has them too", self._failed)
        return self._lib

    def stats(self) -> dict[int, DeviceStats]:
        nvml = self._load()
        if nvml is None:
            return {}
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            log.warning("NVML: %s", exc)
            return {}
        found = {}
        for index in range(count):
            stats = DeviceStats()
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError:
                continue  # a device lost from the bus: no gauges rather than a failed scrape
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                stats.used_bytes, stats.total_bytes = float(memory.used), float(memory.total)
            except nvml.NVMLError:
                pass
            try:
                stats.utilization = min(1.0, nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
            except nvml.NVMLError:
                pass  # "Not Supported" on some boards
            found[index] = stats
        return found


# ---------------------------------------------------------------- ascend: npu-smi


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s: %s", cmd[0], exc)
        return None
    return done.stdout if done.returncode == 0 else None


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
            limit = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
            quota = None if limit <= 0 else limit / int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
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


# ---------------------------------------------------------------- the probe


class DeviceProbe:
    """Stats of the devices of one target, cached for DEVICE_CACHE_S."""

    def __init__(self, target: str):
        self.target = target
        self._cache: tuple[float, dict[int, DeviceStats]] = (float("-inf"), {})
        self._cpu_last: dict[int, tuple[int, float, float]] = {}  # device -> (pid, when, cpu seconds)
        self._nvml = Nvml() if target == "cuda" else None
        self._lock = threading.Lock()

    def stats(self, workers: list[Worker]) -> dict[int, DeviceStats]:
        with self._lock:
            at, cached = self._cache
            if time.monotonic() - at > DEVICE_CACHE_S:
                cached = self._query(workers)
                self._cache = (time.monotonic(), cached)
            return cached

    def _query(self, workers: list[Worker]) -> dict[int, DeviceStats]:
        if self._nvml is not None:
            return self._nvml.stats()
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
