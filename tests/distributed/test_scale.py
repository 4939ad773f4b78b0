"""`farm scale` (the exact k8s and compose commands; local worker processes really start and
stop) and `farm worker` (one Celery worker per device, masked; SIGTERM forwarded)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.redis_server import redis_server  # noqa: F401

pytest.importorskip("celery")

COMPOSE = """
services:
  redis: {image: redis:7}
  search-cuda-0: {image: farm-cuda}
  search-cuda-1: {image: farm-cuda}
  search-cuda-10: {image: farm-cuda}
  search-cuda-2: {image: farm-cuda}
  search-cuda-3: {image: farm-cuda}
  reference-cuda-0: {image: farm-cuda}
"""


def test_k8s_dry_run_prints_the_exact_command(cli):
    res = cli("scale", "search-ascend", "16", "--via", "k8s", "--dry-run")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "kubectl scale deployment/farm-search-ascend --replicas=16 --namespace farm"
    res = cli("scale", "reference.cuda", "0", "--via", "k8s", "--namespace", "kf", "--dry-run", "--json")
    assert json.loads(res.stdout)["commands"] == [
        ["kubectl", "scale", "deployment/farm-reference-cuda", "--replicas=0", "--namespace", "kf"]]


def test_k8s_without_kubectl_is_a_clear_error(cli, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    res = cli("scale", "search-ascend", "2")
    assert res.exit_code == 2 and "kubectl is not installed here" in res.stderr


def test_compose_dry_run_starts_the_first_n_device_services_and_stops_the_rest(cli, tmp_path):
    compose = tmp_path / "compose.yml"
    compose.write_text(COMPOSE)
    res = cli("scale", "search-cuda", "2", "--via", "compose", "--compose-file", compose, "--dry-run")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == [
        f"docker compose -f {compose} up -d --no-recreate search-cuda-0 search-cuda-1",
        f"docker compose -f {compose} stop search-cuda-2 search-cuda-3 search-cuda-10",
    ]
    res = cli("scale", "search-cuda", "0", "--via", "compose", "--compose-file", compose, "--dry-run")
    assert res.stdout.splitlines() == [
        f"docker compose -f {compose} stop search-cuda-0 search-cuda-1 search-cuda-2 search-cuda-3 search-cuda-10"]
    res = cli("scale", "reference-cuda", "1", "--via", "compose", "--compose-file", compose, "--dry-run")
    assert res.stdout.splitlines() == [f"docker compose -f {compose} up -d --no-recreate reference-cuda-0"]
    res = cli("scale", "search-cuda", "6", "--via", "compose", "--compose-file", compose, "--dry-run")
    assert res.exit_code == 2 and "declares 5 service(s) for search-cuda" in res.stderr
    res = cli("scale", "search-cuda", "1", "--via", "compose", "--compose-file", tmp_path / "no.yml", "--dry-run")
    assert res.exit_code == 2 and "does not exist" in res.stderr


@pytest.mark.parametrize("args, message", [
    (("gpu-cuda", "2"), "unknown pool gpu.cuda"),
    (("search", "2"), "expected <pool>-<target>"),
    (("search-cuda", "2", "--via", "swarm"), "unknown --via 'swarm'"),
    (("search-cuda", "--", "-1"), "greater than or equal to 0"),
])
def test_bad_scale_arguments_are_usage_errors(cli, args, message):
    res = cli("scale", *args)
    assert res.exit_code == 2 and message in res.stderr


def test_worker_specs_pin_one_device_each():
    from farm.distributed.workers import WorkerSpec, parse_devices

    cuda = WorkerSpec(("search",), "cuda", 3)
    env = cuda.env({"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["FARM_WORKER_DEVICE"] == "cuda:3" and env["PATH"] == "/bin"
    cmd = cuda.command()
    assert cmd[cmd.index("-Q") + 1] == "search.cuda" and cmd[cmd.index("-n") + 1] == f"search-cuda-3@{socket.gethostname()}"
    assert cmd[cmd.index("--concurrency") + 1] == "1" and cmd[cmd.index("--pool") + 1] == "prefork"
    npu = WorkerSpec(("reference", "search"), "ascend", 2).env({})
    assert npu["ASCEND_RT_VISIBLE_DEVICES"] == "2" and npu["FARM_WORKER_DEVICE"] == "ascend:2"
    cpu = WorkerSpec(("search",), "cpu", 1)
    assert cpu.env({})["TRITON_INTERPRET"] == "1" and cpu.env({})["CUDA_VISIBLE_DEVICES"] == ""
    assert WorkerSpec(("reference", "search"), "cpu", 0).queues == ["reference.cpu", "search.cpu"]
    assert parse_devices("cuda", "0, 1 2") == [0, 1, 2]
    shared = WorkerSpec(("search",), "cuda", 0, concurrency=3).command()  # queue.ops_per_device
    assert shared[shared.index("--concurrency") + 1] == "3"


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_worker_runs_one_masked_celery_worker_per_device_and_forwards_sigterm(tmp_path, redis_server):  # noqa: F811
    env = {**os.environ, "FARM_QUEUE_BROKER_URL": redis_server.url(), "FARM_METRICS_PORT": "0"}
    logs = tmp_path / "logs"
    proc = subprocess.Popen([sys.executable, "-m", "farm", "--set", "queue.chunk_candidates=3", "worker",
                             "--pool", "search", "--target", "cpu", "--devices", "0,1", "--log-dir", str(logs)],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        _wait(lambda: all(" ready." in (logs / f"search-cpu-{d}.log").read_text(errors="replace")
                          for d in (0, 1) if (logs / f"search-cpu-{d}.log").exists())
              and len(list(logs.glob("*.log"))) == 2, 90, "two ready workers")
        children = _children(proc.pid)
        assert len(children) == 2
        envs = [_environ(c) for c in children]
        # the mask is in each worker's environment from exec on, and the --set reaches it
        assert all(e["TRITON_INTERPRET"] == "1" and e["FARM_WORKER_DEVICE"] == "cpu" for e in envs)
        assert all(e["FARM_QUEUE_CHUNK_CANDIDATES"] == "3" for e in envs)
        pool_procs = [p for c in children for p in _children(c)]
        assert pool_procs, "a prefork pool process per worker"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert all(_gone(p) for p in children + pool_procs)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_local_scale_starts_and_stops_worker_processes(cli, tmp_path, redis_server, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FARM_QUEUE_BROKER_URL", redis_server.url())
    state = tmp_path / "workers"
    dry = cli("scale", "search-cpu", "2", "--via", "local", "--state-dir", state, "--dry-run")
    lines = dry.stdout.splitlines()
    assert len(lines) == 2 and all(" -m farm worker --pool search --target cpu --devices " in line for line in lines)
    started = json.loads(cli("scale", "search-cpu", "2", "--via", "local", "--state-dir", state, "--json").stdout)
    pids = {int(d): pid for d, pid in started["started"].items()}
    try:
        assert sorted(pids) == [0, 1] and sorted(started["running"]) == ["0", "1"]
        pool = state / "search-cpu"
        _wait(lambda: all(" ready." in (pool / f"search-cpu-{d}.log").read_text(errors="replace")
                          for d in (0, 1) if (pool / f"search-cpu-{d}.log").exists())
              and len(list(pool.glob("*.log"))) == 2, 90, "two ready workers")
        live = json.loads(cli("workers", "--json", "--timeout", "2").stdout)
        assert sorted(w["worker"].split("@")[0] for w in live["workers"]) == ["search-cpu-0", "search-cpu-1"]
        again = json.loads(cli("scale", "search-cpu", "2", "--via", "local", "--state-dir", state, "--json").stdout)
        assert again["started"] == {} and again["stopped"] == []  # already there
        down = json.loads(cli("scale", "search-cpu", "1", "--via", "local", "--state-dir", state, "--json").stdout)
        assert down["stopped"] == [pids[1]] and _gone(pids[1]) and not _gone(pids[0])
        dry = cli("scale", "search-cpu", "0", "--via", "local", "--state-dir", state, "--dry-run")
        assert dry.stdout.strip() == f"kill -TERM {pids[0]}"
        cli("scale", "search-cpu", "0", "--via", "local", "--state-dir", state)
        assert _gone(pids[0]) and not list(pool.glob("*.pid"))
    finally:
        for pid in pids.values():
            if not _gone(pid):
                os.killpg(pid, signal.SIGKILL)
