"""Distributed mode against the real parts: a Redis server, an S3-compatible server (moto), and
real `farm worker` processes (target cpu, Triton in the interpreter). Each fault of the issue
has a test, and each ends with the run complete and nothing lost or counted twice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.distributed.runs import RunSpec, op_status, save_run, summarize
from farm.storage import open_store
from tests.redis_server import RedisServer, redis_server  # noqa: F401
from tests.s3_server import flaky_proxy, s3_server  # noqa: F401

pytest.importorskip("celery")

# A chunk's time limit far above its candidates' time on a loaded 2-core machine (CI runs two
# test processes beside the workers; a candidate took up to 18 s there): under a limit of 20 s,
# chunks were cut after one candidate and hit their soft limit, so they ran again, and ops failed
# on the redelivery cap. The visibility timeout must exceed the chunk's hard limit.
FAST = {"FARM_QUEUE_VISIBILITY_TIMEOUT_S": "300", "FARM_QUEUE_CHUNK_TIME_LIMIT_S": "120",
        "FARM_QUEUE_CHUNK_CANDIDATES": "2", "FARM_METRICS_PORT": "0"}
# Where a killed worker's message must come back by the visibility timeout: no candidate starts
# after 25 s of a chunk (half its limit), and the message is handed out again after 65 s.
REDELIVER = {"FARM_QUEUE_VISIBILITY_TIMEOUT_S": "65", "FARM_QUEUE_CHUNK_TIME_LIMIT_S": "50"}
# A message a worker had taken when Redis went down stays in Redis' unacked set after the restart
# (the worker's new connection no longer knows it): the reconciler hands it out again at its next
# turns, or, taken in the restart's last 2 s, after queue.takeover_s. The defaults (150 s, looked
# at every 30 s) outlast the test's wait for the run.
TAKEOVER = {"FARM_QUEUE_TAKEOVER_S": "20", "FARM_QUEUE_RECONCILE_INTERVAL_S": "5"}
EVALUATED = re.compile(r"evaluated run=(\S+) op=(\S+) candidate=(\S+)")


class Cluster:
    """`farm worker` processes (each in its own process group) and `farm` commands, sharing one
    environment: broker, store, settings."""

    def __init__(self, tmp_path: Path, env: dict[str, str]):
        self.env = {**os.environ, **env}
        self.logs = tmp_path / "logs"
        self.logs.mkdir(exist_ok=True)
        self.workers: dict[int, subprocess.Popen] = {}

    def start_worker(self, device: int, pools: str = "reference,search") -> None:
        out = open(self.logs / f"farm-worker-{device}.out", "wb")
        self.workers[device] = subprocess.Popen(
            [sys.executable, "-m", "farm", "worker", "--pool", pools, "--target", "cpu", "--devices", str(device),
             "--log-dir", str(self.logs)], env=self.env, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)

    def log(self, device: int) -> str:
        found = list(self.logs.glob(f"*-cpu-{device}.log"))
        return found[0].read_text(errors="replace") if found else ""

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(" ready." in self.log(d) for d in self.workers):
                return
            for d, proc in self.workers.items():
                assert proc.poll() is None, f"worker {d} exited: {(self.logs / f'farm-worker-{d}.out').read_text()}"
            time.sleep(0.2)
        raise AssertionError("workers did not become ready")

    def kill(self, device: int) -> None:
        """SIGKILL the whole worker: supervisor, Celery main process, pool process."""
        os.killpg(self.workers[device].pid, signal.SIGKILL)
        self.workers[device].wait()

    def stop(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
            except ProcessLookupError:
                pass

    def farm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "farm", *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def evaluated(self, run: str) -> list[tuple[int, str, str]]:
        """(device, op, candidate) for every evaluation any worker logged for the run."""
        rows = []
        for d in self.workers:
            rows += [(d, m.group(2), m.group(3)) for m in EVALUATED.finditer(self.log(d)) if m.group(1) == run]
        return rows


@pytest.fixture
def cluster(tmp_path, redis_server):  # noqa: F811
    made = []

    def make(**env: str) -> Cluster:
        c = Cluster(tmp_path, {"FARM_QUEUE_BROKER_URL": redis_server.url(), **FAST, **env})
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def wait_until(predicate, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def assert_complete_and_unique(store, run: str, max_tasks: int) -> dict:
    """Every op finished its search (the budget spent, or the generator out of new candidates),
    every candidate it counts is recorded, and none was evaluated twice."""
    view = summarize(store, run)
    assert view["status"] == "finished", view
    for row in view["ops"]:
        outcome = op_status(store, run, row["source"], row["op"])["outcome"]
        assert row["phase"] == "done" and outcome["stop_reason"] in ("budget", "exhausted"), row
        assert row["tried"] == outcome["submitted"] <= max_tasks and (row["tried"] == max_tasks
                                                                       or outcome["stop_reason"] == "exhausted")
        report = json.loads(store.get_bytes(f"runs/{run}/{row['source']}/{row['op']}/report.json"))
        ids = [c["id"] for c in report["candidates"]]
        state = store.read_json(f"runs/{run}/{row['source']}/{row['op']}/state.json")
        hashes = [r["source_hash"] for r in state["db"]["records"]]
        assert len(ids) == len(set(ids)) == row["tried"] and len(hashes) == len(set(hashes)) == row["tried"]
    return view


# ---------------------------------------------------------------- end to end


def test_submit_wait_fetch_end_to_end_over_s3(cluster, s3_server, tmp_path, cli, monkeypatch):  # noqa: F811
    url = f"s3://{s3_server.bucket}/farm"
    monkeypatch.setenv("FARM_S3_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("FARM_STORE", url)
    c = cluster(FARM_STORE=url, FARM_S3_ENDPOINT_URL=s3_server.endpoint)
    c.start_worker(0)
    c.start_worker(1)
    c.wait_ready()
    workers = json.loads(c.farm("workers", "--json", "--timeout", "2").stdout)
    assert sorted(w["worker"].split("@")[0] for w in workers["workers"]) == ["reference-search-cpu-0",
                                                                            "reference-search-cpu-1"]
    assert all(w["queues"] == ["reference.cpu", "search.cpu"] for w in workers["workers"])

    # one chunk per op: the chunks that continue a search, across workers, are the fault tests' subject;
    # two ops, one for each worker
    done = c.farm("submit", "--source", "demo", "--ops", "row_sum", "--ops", "vector_add_scale", "--target", "cpu",
                  "--max-tasks", "2", "--run", "e2e", "--wait")
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.splitlines()[0] == "e2e" and "2/2 ops finished" in done.stdout
    store = s3_server.store("farm")
    view = assert_complete_and_unique(store, "e2e", 2)
    assert view["totals"]["passed"] >= 2 and {r["reference"] for r in view["ops"]} <= {"generated", "current"}
    assert all(r["worker"].startswith("reference-search-cpu-") for r in view["ops"])
    # both workers took part
    assert {d for d, _, _ in c.evaluated("e2e")} == {0, 1}

    status = json.loads(c.farm("status", "--json").stdout)  # the latest run
    assert status["run"] == "e2e" and status["eta_s"] == 0.0

    out = tmp_path / "fetched"
    fetched = c.farm("fetch", "--latest", "--out", str(out), "--json")
    assert fetched.returncode == 0, fetched.stderr
    index = json.loads((out / "index.json").read_text())
    assert [k["module"] for k in index["kernels"]] == ["cpu.demo.row_sum", "cpu.demo.vector_add_scale"]
    readme = (out / "README.md").read_text()
    assert "from cpu.demo.row_sum import ModelNew" in readme and "fresh" in readme and "speedup" in readme
    # submit --wait published the run's report into the store (S3 here); fetch brought it home
    assert "report: reports/e2e/index.html (also in the store: runs/e2e/report/index.html)" in done.stdout
    assert index["report"] == "report/index.html" and "[report/index.html]" in readme
    assert "demo/vector_add_scale" in (out / "report/index.html").read_text()
    assert (out / "report/plots/speedup.svg").is_file()
    # every fetched kernel verifies again, from the fetched file, against the stored reference data
    for k in index["kernels"]:
        result = cli("eval", "--candidate", out / k["file"], "--source", "demo", "--op", k["op"],
                     "--target", "cpu", "--json")
        verdict = json.loads(result.stdout)
        assert result.exit_code == 0 and verdict["verdict"] == "pass", (k["module"], verdict["verdict"],
                                                                         verdict["reason"])
    # and imports as a package
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from cpu.demo.vector_add_scale import ModelNew; "
            "print(ModelNew.__name__)")
    imported = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True,
                              env={**os.environ, "TRITON_INTERPRET": "1"})
    assert imported.stdout.strip() == "ModelNew", imported.stderr


# ---------------------------------------------------------------- faults


def test_search_worker_killed_mid_chunk_completes_elsewhere(cluster, tmp_path):
    """SIGKILL of a whole worker (supervisor, Celery, pool process) in the middle of a chunk:
    Redis hands the unacked chunk out again after the visibility timeout, the other worker
    resumes from the last checkpoint; at most that chunk's work is lost, nothing counted twice."""
    c = cluster(FARM_QUEUE_CHUNK_CANDIDATES="2", **REDELIVER)
    c.start_worker(0)
    c.start_worker(1)
    c.wait_ready()
    sub = c.farm("submit", "--source", "demo", "--ops", "row_sum", "--target", "cpu", "--max-tasks", "4",
                 "--run", "kill", "--generators", "tune")
    assert sub.returncode == 0, sub.stderr
    victim = wait_until(lambda: next(iter(c.evaluated("kill")), None), 90, "a first evaluation")[0]
    c.kill(victim)  # the chunk's next candidate is in flight; the chunk's checkpoint is not written
    survivor = 1 - victim

    store = open_store(c.env["FARM_STORE"])
    wait_until(lambda: summarize(store, "kill")["status"] == "finished", 240, "the run to finish", every=1)
    assert_complete_and_unique(store, "kill", 4)
    st = op_status(store, "kill", "demo", "row_sum")
    assert st["worker"].startswith(f"reference-search-cpu-{survivor}@") and st["redeliveries"] >= 1
    evaluated = c.evaluated("kill")
    lost = len(evaluated) - summarize(store, "kill")["totals"]["tried"]
    assert 1 <= lost <= 2, evaluated  # the killed chunk's evaluations (2 candidates a chunk), and no more
    redone = [cand for d, _, cand in evaluated if d == victim]
    assert all(cand in {x for d, _, x in evaluated if d == survivor} for cand in redone)  # ids reused: resumed
    assert store.read_json("runs/kill/demo/row_sum/state.json")["chunks_done"] >= 2


def test_redis_restart_mid_run_loses_nothing(tmp_path):
    redis = RedisServer(appendonly=True).start()
    c = Cluster(tmp_path, {"FARM_QUEUE_BROKER_URL": redis.url(), **FAST, **TAKEOVER})
    try:
        c.start_worker(0)
        c.start_worker(1)
        c.wait_ready()
        sub = c.farm("submit", "--source", "demo", "--ops", "row_sum", "--ops", "vector_add_scale",
                     "--target", "cpu", "--max-tasks", "4", "--run", "restart", "--generators", "tune")
        assert sub.returncode == 0, sub.stderr
        wait_until(lambda: len(c.evaluated("restart")) >= 2, 90, "the search to start")
        redis.restart(down_s=3.0)  # SIGTERM: Redis writes its append-only file; then back on the same port
        store = open_store(c.env["FARM_STORE"])
        wait_until(lambda: summarize(store, "restart")["status"] == "finished", 180, "the run to finish", every=1)
        view = assert_complete_and_unique(store, "restart", 4)
        assert len(c.evaluated("restart")) - view["totals"]["tried"] <= 2 * 2  # at most a chunk per op redone
    finally:
        c.stop()
        redis.cleanup()


def test_s3_unavailable_for_a_while(cluster, s3_server, flaky_proxy, monkeypatch):  # noqa: F811
    """The store goes away mid-search: tasks retry with backoff and the run completes."""
    url = f"s3://{s3_server.bucket}/farm"
    c = cluster(FARM_STORE=url, FARM_S3_ENDPOINT_URL=flaky_proxy.endpoint, FARM_S3_MAX_ATTEMPTS="2",
                FARM_S3_CONNECT_TIMEOUT_S="1", FARM_S3_READ_TIMEOUT_S="5")
    c.start_worker(0)  # one worker: the outage and its retries are the subject, not spreading
    c.wait_ready()
    sub = c.farm("submit", "--source", "demo", "--ops", "row_sum", "--target", "cpu", "--max-tasks", "4",
                 "--run", "s3down", "--generators", "tune")
    assert sub.returncode == 0, sub.stderr
    store = s3_server.store("farm")  # the test reads past the proxy
    wait_until(lambda: c.evaluated("s3down"), 180, "the search to start")
    flaky_proxy.stop()
    # down until a task has met the outage and been put off (its next write fails: a candidate's time)
    wait_until(lambda: re.search(r"retry \d+/10 in", c.log(0)), 120, "the outage to be noticed")
    flaky_proxy.start()
    wait_until(lambda: summarize(store, "s3down")["status"] == "finished", 180, "the run to finish", every=1)
    assert_complete_and_unique(store, "s3down", 4)


def test_same_run_submitted_twice_does_no_work_twice(cluster):
    c = cluster()
    c.start_worker(0)
    c.start_worker(1)
    args = ("submit", "--source", "demo", "--ops", "row_sum", "--target", "cpu",
            "--max-tasks", "2", "--run", "twice", "--generators", "tune")
    first = c.farm(*args)
    second = c.farm(*args)  # before any worker is ready: every task is in the queue twice
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "submitted again" in second.stderr
    c.wait_ready()
    store = open_store(c.env["FARM_STORE"])
    wait_until(lambda: summarize(store, "twice")["status"] == "finished", 150, "the run to finish", every=1)
    view = assert_complete_and_unique(store, "twice", 2)
    evaluated = c.evaluated("twice")
    assert len(evaluated) == len(set(evaluated)) == view["totals"]["tried"]  # each candidate evaluated once

    def skipped() -> str | None:  # the second copy may have found the op locked: it tries again 5 s later
        logs = c.log(0) + c.log(1)
        return logs if "'skipped': 'done already'" in logs else None

    logs = wait_until(skipped, 30, "the second copy to be skipped")
    assert logs.count("'reference': 'generated'") == 1  # one reference run for the op, queued twice
    third = c.farm(*args[:-2], "--generators", "tune,port")
    assert third.returncode == 2 and "exists with other parameters (generators)" in third.stderr
    again = c.farm(*args)  # after it finished: nothing is enqueued
    assert again.returncode == 0 and summarize(store, "twice")["status"] == "finished"


def test_cancel_stops_the_run(cluster):
    c = cluster()
    c.start_worker(0)
    c.wait_ready()
    # two ops on one worker: one op's task waits in the queue while the other runs, and cancel deletes it
    sub = c.farm("submit", "--source", "demo", "--ops", "row_sum", "--ops", "vector_add_scale", "--target", "cpu",
                 "--max-tasks", "40", "--run", "stopme", "--generators", "tune")
    assert sub.returncode == 0, sub.stderr
    wait_until(lambda: c.evaluated("stopme"), 90, "the search to start")
    cancelled = c.farm("cancel", "stopme")
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout

    def idle() -> bool:
        view = json.loads(c.farm("workers", "--json").stdout)
        return all(w["state"] == "idle" for w in view["workers"]) and not any(view["waiting"].values())

    wait_until(idle, 60, "the worker to go idle", every=2)  # each look is a `farm` process: about 1 CPU-s
    store = open_store(c.env["FARM_STORE"])
    view = summarize(store, "stopme")
    assert view["status"] == "cancelled" and {r["phase"] for r in view["ops"]} == {"cancelled"}
    tried = len(c.evaluated("stopme"))
    assert view["totals"]["tried"] <= tried < 2 * 40
    time.sleep(3)
    assert len(c.evaluated("stopme")) == tried  # nothing runs after it


# ---------------------------------------------------------------- delivery rules, one process


@pytest.fixture
def work_env(redis_server, tmp_path, monkeypatch):  # noqa: F811
    from farm.distributed import work

    monkeypatch.setenv("FARM_QUEUE_BROKER_URL", redis_server.url())
    monkeypatch.setenv("FARM_QUEUE_MAX_REDELIVERIES", "1")
    monkeypatch.setattr(work, "_env", None)
    store = open_store(os.environ["FARM_STORE"])
    save_run(store, RunSpec(run="rules", source="demo", ops=["row_sum"], target="cpu", reference_target="cpu",
                            shapes="small", generators=["tune"], max_tasks=2, chunk_candidates=2, max_concurrent=1))
    yield work, store, redis_server
    monkeypatch.setattr(work, "_env", None)


def test_redeliveries_past_the_cap_fail_the_op(work_env):
    work, store, _ = work_env
    tid = work.search_task_id("rules", "demo", "row_sum", 0)
    # two redeliveries of a chunk whose worker died each time (max_redeliveries=1)
    work.env().coord.count("redelivered", tid)
    result = work.search_chunk(work.Delivery(tid, "w@h", redelivered=True), "rules", "demo", "row_sum", 0)
    assert "delivered 3 times" in result["failed"]
    st = op_status(store, "rules", "demo", "row_sum")
    assert st["phase"] == "failed" and st["redeliveries"] == 2 and "queue.max_redeliveries=1" in st["error"]
    # a later copy of the same task is a duplicate now
    assert work.search_chunk(work.Delivery(tid, "w@h"), "rules", "demo", "row_sum", 0)["skipped"] == "done already"
    assert summarize(store, "rules")["ops"][0]["phase"] == "failed"


def test_a_locked_op_makes_a_second_copy_wait(work_env):
    work, _, _ = work_env
    tid = work.reference_task_id("rules", "demo", "row_sum")
    lock = work.env().coord.lock("rules:demo:row_sum", "other@host")
    assert lock.acquire()
    try:
        with pytest.raises(work.Retry, match="busy on other@host"):
            work.reference_op(work.Delivery(tid, "w@h"), "rules", "demo", "row_sum")
    finally:
        lock.release()
    assert lock.acquire() and not work.env().coord.lock("rules:demo:row_sum", "x").acquire()
    lock.release()


def test_a_lock_lapses_when_its_holder_stops_renewing(work_env):
    from farm.distributed import coord

    work, _, redis = work_env
    lock = work.env().coord.lock("lapse", "dead@host")
    assert lock.acquire()
    lock._stop.set()  # the holder died: no more renewals
    ttl = redis.client().pttl("farm:lock:lapse")
    assert 0 < ttl <= coord.LOCK_TTL_S * 1000


def test_unknown_run_and_unreachable_broker_are_clear_errors(cli, tmp_path, monkeypatch):
    from tests.s3_server import free_port

    monkeypatch.setenv("FARM_QUEUE_BROKER_URL", f"redis://127.0.0.1:{free_port()}/0")
    res = cli("submit", "--source", "demo", "--target", "cpu", "--max-tasks", "2")
    assert res.exit_code == 3 and "cannot reach Redis" in res.stderr
    res = cli("submit", "--source", "demo", "--target", "tpu")
    assert res.exit_code == 2 and "unknown target 'tpu'" in res.stderr
    res = cli("submit", "--source", "demo", "--target", "cpu", "--timing-mode", "fastest")
    assert res.exit_code == 2 and "--timing-mode" in res.stderr and "Traceback" not in res.output
    res = cli("status", "nope")
    assert res.exit_code == 2 and "no run 'nope'" in res.stderr
    res = cli("fetch", "--out", tmp_path / "k")
    assert res.exit_code == 2 and "no kernels to fetch" in res.stderr


def test_a_submitted_timing_mode_reaches_the_workers_search():
    """farm submit --timing-mode is stored with the run and rebuilt by every worker, as --flush is."""
    from farm.config import load_settings
    from farm.distributed.control import make_spec

    settings, _ = load_settings()
    spec = make_spec(settings, "demo", ["row_sum"], "cpu", 4, timing_mode="graph", flush="clean")
    again = RunSpec.from_dict(json.loads(json.dumps(spec.params())))  # as stored in run.json
    assert again.evaluation().timing_mode == "graph" and again.evaluation().flush == "clean"
    assert make_spec(settings, "demo", ["row_sum"], "cpu", 4).evaluation().timing_mode == "auto"
