"""The metrics themselves: what the store, the S3 client, Celery's signals and the supervisor's
collector count, and that the multiprocess sums survive a killed process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from farm.ascend.target import parse_npu_smi_usages
from farm.config import Settings
from farm.errors import StorageError
from farm.observe import devices, metrics
from farm.observe.devices import DeviceReader
from farm.observe.worker_metrics import SupervisorCollector, WorkerState
from farm.storage import open_store
from farm.targets import available
from tests.s3_server import flaky_proxy, s3_server  # noqa: F401


def value(metric, *labels) -> float:
    return metric.labels(*labels)._value.get()


# ---------------------------------------------------------------- storage


def test_file_store_counts_bytes_objects_and_errors_by_kind(tmp_path):
    store = open_store(f"file://{tmp_path}")
    before = {(d, k): value(metrics.STORAGE_BYTES, "file", d, k) for d in ("put", "get") for k in ("reference", "run")}
    objects_before = value(metrics.STORAGE_OBJECTS, "file", "get", "reference")
    errors_before = value(metrics.STORAGE_ERRORS, "file", "get")
    store.put_bytes("refs/demo/op.pt", b"x" * 1000)
    store.put_bytes("runs/r/run.json", b"{}")
    assert store.get_bytes("refs/demo/op.pt") == b"x" * 1000
    src = tmp_path / "big.bin"
    src.write_bytes(b"y" * 5000)
    store.put_file("refs/demo/big.pt", src)
    store.get_file("refs/demo/big.pt", tmp_path / "copy.bin")
    assert value(metrics.STORAGE_BYTES, "file", "put", "reference") - before[("put", "reference")] == 6000
    assert value(metrics.STORAGE_BYTES, "file", "get", "reference") - before[("get", "reference")] == 6000
    assert value(metrics.STORAGE_BYTES, "file", "put", "run") - before[("put", "run")] == 2
    assert value(metrics.STORAGE_OBJECTS, "file", "get", "reference") - objects_before == 2
    with pytest.raises(StorageError):
        store.get_bytes("refs/demo/missing.pt")
    assert value(metrics.STORAGE_ERRORS, "file", "get") - errors_before == 1


def test_object_kind_is_bounded():
    assert [metrics.object_kind(k) for k in ("refs/a/b.pt", "runs/r/x.json", "kernels/cuda/a/b/best.py",
                                             "anything/else", "x")] == ["reference", "run", "kernel", "other", "other"]


def test_s3_retries_and_errors_are_counted(s3_server, flaky_proxy):  # noqa: F811
    settings = Settings(s3=s3_server.settings(endpoint_url=flaky_proxy.endpoint, max_attempts=3))
    store = open_store(f"s3://{s3_server.bucket}/farm", settings)
    retries = value(metrics.STORAGE_RETRIES, "s3", "request")
    store.put_bytes("runs/r/a.json", b"{}")
    flaky_proxy.fail_next(2, 503)
    assert store.get_bytes("runs/r/a.json") == b"{}"  # two 503s, then the third attempt succeeds
    assert value(metrics.STORAGE_RETRIES, "s3", "request") - retries == 2
    errors = value(metrics.STORAGE_ERRORS, "s3", "get")
    flaky_proxy.fail_next(10, 503)
    with pytest.raises(StorageError):
        store.get_bytes("runs/r/a.json")
    assert value(metrics.STORAGE_ERRORS, "s3", "get") - errors == 1


# ---------------------------------------------------------------- Celery signals


def test_queue_wait_counts_from_the_eta_of_a_held_back_message():
    from farm.distributed.instrument import queue_wait

    assert queue_wait(100.0, None, 105.0) == 5.0
    eta = "1970-01-01T00:01:43+00:00"  # 103 s: a retry's countdown is not waiting
    assert queue_wait(100.0, eta, 105.0) == 2.0
    assert queue_wait(None, None, 105.0) is None
    assert queue_wait(100.0, "garbage", 105.0) == 5.0


def test_outcomes():
    from farm.distributed.instrument import outcome

    assert outcome("SUCCESS", {"task": "t"}) == "ok"
    assert outcome("SUCCESS", {"task": "t", "failed": "boom"}) == "op_failed"
    assert outcome("SUCCESS", {"task": "t", "skipped": "done already"}) == "skipped"
    assert outcome("RETRY", None) == "retry"
    assert outcome("FAILURE", None) == "error"


# ---------------------------------------------------------------- multiprocess mode

CHILD = textwrap.dedent("""
    import os, sys, time
    from farm.observe import metrics
    metrics.TASKS.labels("search.cpu", "search_chunk", "ok").inc(3)
    metrics.CURRENT_TASK.labels("search", "cpu", "0", "r", "demo", "op").set(1)
    print("ready", flush=True)
    if sys.argv[1] == "hang":
        time.sleep(60)
""")


def _child(tmp_path: Path, mode: str) -> subprocess.Popen:
    env = {**os.environ, metrics.MULTIPROC_ENV: str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _scrape(path: Path) -> str:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    return generate_latest(registry).decode()


def test_counters_of_a_killed_process_stay_and_its_live_gauges_go(tmp_path):
    first = _child(tmp_path, "exit")
    first.wait()
    second = _child(tmp_path, "hang")
    try:
        text = _scrape(tmp_path)
        assert 'farm_tasks_total{outcome="ok",queue="search.cpu",task="search_chunk"} 6.0' in text
        assert "farm_worker_current_task{" in text
        second.send_signal(signal.SIGKILL)  # no shutdown hook runs
        second.wait()
        reaped = metrics.reap(tmp_path)
        assert set(reaped) == {first.pid, second.pid}
        text = _scrape(tmp_path)
        assert 'farm_tasks_total{outcome="ok",queue="search.cpu",task="search_chunk"} 6.0' in text
        assert 'farm_worker_current_task{device="0"' not in text
    finally:
        if second.poll() is None:
            second.kill()


def test_reap_keeps_live_processes(tmp_path):
    proc = _child(tmp_path, "hang")
    try:
        assert metrics.reap(tmp_path) == []
        assert "farm_worker_current_task{" in _scrape(tmp_path)
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- the supervisor's collector


def test_supervisor_collector_reports_workers_and_cpu_slots():
    states = [WorkerState("search", "cpu", 0, True, 2, os.getpid()), WorkerState("search", "cpu", 1, False, 5, None)]
    collector = SupervisorCollector(lambda: states, "cpu")
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    assert 'farm_worker_up{device="0",pool="search",target="cpu"} 1.0' in text
    assert 'farm_worker_up{device="1",pool="search",target="cpu"} 0.0' in text
    assert 'farm_worker_restarts_total{device="1",pool="search",target="cpu"} 5.0' in text
    assert 'farm_device_memory_used_bytes{device="0",target="cpu"}' in text
    # utilisation needs two readings of the CPU clock
    sum(range(2_000_000))
    time.sleep(0.05)
    collector.reader._cache = (float("-inf"), {})
    stats = collector.reader.stats(states)
    assert stats[0].utilization is not None and stats[0].utilization >= 0


def test_npu_smi_output_parses():
    npu = parse_npu_smi_usages("""
        Memory Capacity(MB)            : 15039
        Memory Usage Rate(%)           : 6
        HBM Capacity(MB)               : 65536
        HBM Usage Rate(%)              : 25
        Aicore Usage Rate(%)           : 40
    """)
    assert npu["total_bytes"] == 65536 * 2**20 and npu["used_bytes"] == 16384 * 2**20
    assert npu["utilization"] == pytest.approx(0.40)


class FakeNvml(types.ModuleType):
    """pynvml's calls as nvidia-ml-py names them, for two GPUs: the second's board does not
    report utilisation (NVML_ERROR_NOT_SUPPORTED). The real library needs a driver."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        super().__init__("pynvml")
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=(handle + 1) * 2**30, total=80 * 2**30, free=0)

    def nvmlDeviceGetUtilizationRates(self, handle):
        if handle == 1:
            raise self.NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=37, memory=5)


def test_gpu_gauges_come_from_nvml_never_from_nvidia_smi(monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    smi = tmp_path / "nvidia-smi"  # an nvidia-smi that would be found first, and leaves a trace
    smi.write_text(f"#!/bin/sh\ntouch {marker}\necho '0, 1, 2, 3'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = DeviceReader("cuda", available()["cuda"].device_monitor())
    states = [WorkerState("search", "cuda", 0, True, 0, 1), WorkerState("search", "cuda", 1, True, 0, 2)]
    stats = reader.stats(states)
    assert stats[0].used_bytes == 2**30 and stats[0].total_bytes == 80 * 2**30
    assert stats[0].utilization == pytest.approx(0.37)
    assert stats[1].used_bytes == 2 * 2**30 and stats[1].utilization is None  # not supported: no gauge
    reader._cache = (float("-inf"), {})
    reader.stats(states)
    assert fake.inits == 1 and not marker.exists()


def test_without_a_driver_nvml_reports_no_gpu_and_says_so_once(caplog):
    pytest.importorskip("pynvml")  # the real nvidia-ml-py: here, no libnvidia-ml.so
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    reader = DeviceReader("cuda", available()["cuda"].device_monitor())
    with caplog.at_level("WARNING", logger="farm.targets.cuda"):
        assert reader.stats([WorkerState("search", "cuda", 0, True, 0, 1)]) == {}
        reader._cache = (float("-inf"), {})
        assert reader.stats([WorkerState("search", "cuda", 0, True, 0, 1)]) == {}
    assert len([r for r in caplog.records if "NVML" in r.getMessage()]) == 1


def test_nvml_is_imported_only_by_a_cuda_reader():
    code = ("import sys; import farm.observe.worker_metrics; "
            "from farm.observe.devices import DeviceReader; DeviceReader('cpu').stats([]); "
            "sys.exit('pynvml imported' if 'pynvml' in sys.modules else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_cpu_utilisation_is_a_share_of_the_cpus_the_worker_may_use(monkeypatch, tmp_path):
    """Three busy processes on two CPUs are 1 (all of them), not 3; one is a half."""
    clock = iter([100.0, 101.0, 102.0])
    cpu_seconds = iter([10.0, 13.0, 14.0])  # +3 s of CPU in the first second, +1 s in the next
    monkeypatch.setattr(devices.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(devices, "process_tree_cpu_seconds", lambda pids: next(cpu_seconds))
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(devices, "CGROUP", tmp_path)  # no quota
    reader = DeviceReader("cpu")
    assert reader._cpu_stats(0, os.getpid()).utilization is None  # one reading: no rate yet
    assert reader._cpu_stats(0, os.getpid()).utilization == 1.0
    assert reader._cpu_stats(0, os.getpid()).utilization == pytest.approx(0.5)


@pytest.mark.parametrize("files, expected", [
    ({"cpu.max": "max 100000\n"}, 8.0),
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8.0),
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
])
def test_cpu_capacity_is_the_affinity_capped_by_the_cgroup_quota(monkeypatch, tmp_path, files, expected):
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: set(range(8)))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert devices.cpu_capacity(os.getpid(), cgroup=tmp_path) == expected


def test_names_follow_prometheus_conventions_and_labels_stay_bounded():
    from prometheus_client.metrics import MetricWrapperBase

    found = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(found) == 15
    unbounded = {"id", "candidate", "candidate_id", "task_id", "path", "key", "error", "message", "pid"}
    for m in found:
        assert re.fullmatch(r"farm_[a-z_]+", m._name), m._name
        assert not m._name.endswith("_total"), f"{m._name}: prometheus_client adds _total to counters"
        if m._type == "histogram" or m._name.endswith("_seconds"):
            assert m._name.endswith("_seconds"), m._name
        assert not set(m._labelnames) & unbounded, m._name
        if "run" in m._labelnames:  # a run id only where the value drops when the task ends
            assert m._name == "farm_worker_current_task"


def test_amqp_queue_lengths_through_kombu(monkeypatch):
    from kombu import Connection

    from farm.distributed.exporter import amqp_queue_lengths

    url = "memory://farm-exporter-test"
    with Connection(url) as conn:
        queue = conn.SimpleQueue("search.ascend")
        queue.put({"n": 1})
        queue.put({"n": 2})
        assert amqp_queue_lengths(url, ["search.ascend", "search.cuda"]) == {"search.ascend": 2, "search.cuda": 0}
        queue.close()
