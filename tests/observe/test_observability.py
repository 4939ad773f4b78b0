"""Dashboards and alerts against the real thing: a Prometheus server (Debian's package) scrapes
real `farm worker` processes and `farm exporter` during a demo run over Redis and S3 (moto), and
every PromQL expression in the Grafana dashboards and in the recording rules must return data
through Prometheus' HTTP API. promtool checks the configurations and runs the alert unit tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from farm.config import Settings
from farm.storage import open_store
from tests.prometheus_server import PrometheusServer
from tests.redis_server import redis_server  # noqa: F401
from tests.s3_server import free_port, s3_server  # noqa: F401
from tests.tools import require_tool

pytest.importorskip("celery")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "rules" / "farm-rules.yml"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
# Grafana's variables, as a dashboard with "All" selected sends them
GRAFANA_VARS = {"$__rate_interval": "1m", "$queue": ".*", "$target": ".*", "$run": ".*", "$source": ".*", "$op": ".*"}
LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$")


# ---------------------------------------------------------------- what the files hold


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every variable of every dashboard."""
    found = []
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        for panel in doc["panels"]:
            for target in panel["targets"]:
                found.append((f"{path.name}: {panel['title']} [{target['refId']}]", target["expr"]))
        for var in doc["templating"]["list"]:
            if var["type"] == "datasource":
                continue  # a list of datasources, no PromQL
            m = LABEL_VALUES.match(var["query"]["query"])
            assert m, f"{path.name}: variable {var['name']} is not label_values(...)"
            found.append((f"{path.name}: variable {var['name']}", f"count by ({m.group(2)}) ({m.group(1)})"))
    return [(where, substitute(expr)) for where, expr in found]


def substitute(expr: str) -> str:
    for name in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_VARS[name])
    assert "$" not in expr, f"an unknown Grafana variable in {expr}"
    return expr


def rules() -> tuple[list[dict], list[dict]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    every = [r for g in groups for r in g["rules"]]
    return [r for r in every if "record" in r], [r for r in every if "alert" in r]


# ---------------------------------------------------------------- static checks


def test_promtool_checks_the_configs_and_rules_and_the_alerts_fire(tmp_path):
    promtool = require_tool("promtool")
    run = lambda *args, cwd=None: subprocess.run([promtool, *args], capture_output=True, text=True, cwd=cwd)  # noqa: E731
    for args in (["check", "rules", str(RULES)], ["check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                 ["test", "rules", str(RULES.with_name("farm-rules.test.yml"))]):
        done = run(*args)
        assert done.returncode == 0, done.stdout + done.stderr
    # compose's and Kubernetes' configs expect the rules where their containers mount them
    compose = tmp_path / "compose"
    (compose / "rules").mkdir(parents=True)
    (compose / "rules" / "farm-rules.yml").write_text(RULES.read_text())
    (compose / "prometheus.yml").write_text((DEPLOY / "compose" / "prometheus.yml").read_text())
    k8s = [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "prometheus.yaml").read_text())
           if d["kind"] == "ConfigMap"][0]["data"]["prometheus.yml"]
    (tmp_path / "k8s.yml").write_text(k8s.replace("/etc/prometheus/rules/*.yml", str(compose / "rules" / "*.yml")))
    for config in (compose / "prometheus.yml", tmp_path / "k8s.yml"):
        done = run("check", "config", str(config))
        assert done.returncode == 0, done.stdout + done.stderr


def test_alerts_compare_recording_rules_with_thresholds():
    records, alerts = rules()
    names = {r["record"] for r in records}
    assert {a["alert"] for a in alerts} == {"FarmWorkerDown", "FarmTaskFailureRateHigh", "FarmQueueNotDraining",
                                            "FarmRunWithoutProgress", "FarmExporterStale"}
    for alert in alerts:
        used = set(re.findall(r"farm:[a-z_:0-9]+", alert["expr"]))
        assert used and used <= names, alert["alert"]
        assert not re.search(r"\bfarm_[a-z_]+", alert["expr"]), f"{alert['alert']}: use a recording rule"


def test_dashboards_pick_their_prometheus_through_a_datasource_variable():
    """No datasource uid written in a dashboard (a cluster's Grafana has its own): every query and
    variable names `${datasource}`, a variable of type datasource that the provisioned
    Prometheus (the default datasource) fills in the standalone layout."""
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["isDefault"] is True
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/farm.yml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/farm"
    docs = [json.loads(p.read_text()) for p in DASHBOARDS]
    assert {d["uid"] for d in docs} == {"farm-fleet", "farm-search"}
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for doc in docs:
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)), doc["uid"]
        variables = doc["templating"]["list"]
        assert variables[0]["type"] == "datasource" and variables[0]["name"] == "datasource"
        assert variables[0]["query"] == "prometheus", doc["uid"]
        for var in variables[1:]:
            assert var["datasource"] == ref, (doc["uid"], var["name"])
        for panel in doc["panels"]:
            assert panel["datasource"] == ref and panel["targets"], panel["title"]
            assert all(t["datasource"] == ref for t in panel["targets"]), panel["title"]
        assert not _uids(doc) - {"${datasource}"}, f"{doc['uid']}: a hard-coded datasource uid"
    assert len(dashboard_queries()) >= 40


def _uids(node) -> set[str]:
    """Every datasource uid anywhere in a dashboard (panels in rows, annotations included)."""
    if isinstance(node, dict):
        own = {node["datasource"]["uid"]} if isinstance(node.get("datasource"), dict) and "uid" in node["datasource"] \
            else set()
        return own.union(*(_uids(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_uids(v) for v in node))
    return set()


# ---------------------------------------------------------------- the live test


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _pool_pids(supervisor: int) -> list[int]:
    """The Celery pool processes under a `farm worker` supervisor (grandchildren)."""
    def children(pid: int) -> list[int]:
        path = Path(f"/proc/{pid}/task/{pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    return [g for c in children(supervisor) for g in children(c)]


def _total(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.fixture
def live_farm(tmp_path, redis_server, s3_server):  # noqa: F811
    worker_port, exporter_port = free_port(), free_port()
    env = {**os.environ, "FARM_QUEUE_BROKER_URL": redis_server.url(), "FARM_STORE": f"s3://{s3_server.bucket}/farm",
           "AWS_ENDPOINT_URL": s3_server.endpoint, "FARM_QUEUE_VISIBILITY_TIMEOUT_S": "60",
           "FARM_QUEUE_CHUNK_TIME_LIMIT_S": "20", "FARM_QUEUE_CHUNK_CANDIDATES": "2",
           "FARM_METRICS_ADDR": "127.0.0.1", "FARM_METRICS_EXPORTER_REFRESH_S": "1"}
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = {
        "worker": subprocess.Popen(
            [sys.executable, "-m", "farm", "worker", "--pool", "reference,search", "--target", "cpu", "--devices",
             "0,1", "--log-dir", str(logs), "--metrics-port", str(worker_port)],
            env=env, stdout=open(logs / "worker.out", "wb"), stderr=subprocess.STDOUT, start_new_session=True),
        "exporter": subprocess.Popen(
            [sys.executable, "-m", "farm", "exporter", "--port", str(exporter_port)],
            env=env, stdout=open(logs / "exporter.out", "wb"), stderr=subprocess.STDOUT, start_new_session=True),
    }
    prom = PrometheusServer({"farm-workers": [f"127.0.0.1:{worker_port}"],
                             "farm-exporter": [f"127.0.0.1:{exporter_port}"]}, [RULES], tmp_path / "prom")
    farm = lambda *args: subprocess.run([sys.executable, "-m", "farm", *args], env=env, capture_output=True,  # noqa: E731
                                        text=True, timeout=120)
    try:
        prom.start()
        yield {"prom": prom, "farm": farm, "env": env, "procs": procs, "logs": logs, "s3": s3_server,
               "worker_url": f"http://127.0.0.1:{worker_port}/metrics", "worker_port": worker_port,
               "exporter_port": exporter_port}
    finally:
        farm("cancel", "obs")
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        prom.stop()


def test_a_live_farm_answers_every_query_and_keeps_its_counts_when_a_pool_process_dies(live_farm):
    """One live farm (two workers, the exporter, Prometheus) for both halves: starting it and
    making the demo's reference data is most of the time. First every dashboard and rule query
    returns data and no alert expression holds on the healthy farm; then a pool process is killed,
    Celery replaces it, its counts stay and its live gauges are reaped; the health check says up or
    refused."""
    prom, farm, logs, url = live_farm["prom"], live_farm["farm"], live_farm["logs"], live_farm["worker_url"]
    _wait(lambda: len([p for p in logs.glob("*-cpu-*.log") if " ready." in p.read_text(errors="replace")]) == 2,
          90, "two ready workers")
    health = lambda port, *flags: subprocess.run([sys.executable, "-m", "farm.observe.health", "--port", str(port), *flags],  # noqa: E731
                                                 capture_output=True, text=True, env=live_farm["env"])
    ok = health(live_farm["worker_port"])
    assert ok.returncode == 0 and "2 worker(s) up" in ok.stdout
    assert health(live_farm["exporter_port"], "--exporter").returncode == 0
    bad = health(free_port())
    assert bad.returncode == 1 and "Connection refused" in bad.stderr
    # a budget far beyond what the test waits for: the run is still going when the queries run
    done = farm("submit", "--source", "demo", "--target", "cpu", "--reference-on", "cpu", "--max-tasks", "40",
                "--run", "obs", "--flush", "clean")
    assert done.returncode == 0, done.stderr
    records, alerts = rules()
    queries = dashboard_queries() + [(f"rule {r['record']}", r["expr"]) for r in records]

    def missing() -> list[str]:
        empty = []
        for where, expr in queries:
            answer = prom.query(expr)
            assert answer["status"] == "success", f"{where}: {expr}: {answer}"
            if not answer["data"]["result"]:
                empty.append(f"{where}: {expr}")
        return empty

    try:
        _wait(lambda: not missing(), 150, "every query to return data")
    except AssertionError:
        pytest.fail("no data for:\n" + "\n".join(missing()) + "\n\nworker log tail:\n"
                    + (logs / "worker.out").read_text(errors="replace")[-3000:])
    def firing() -> list[str]:  # they parse and evaluate; with a healthy farm none holds for long
        out = []
        for alert in alerts:
            answer = prom.query(alert["expr"])
            assert answer["status"] == "success", alert["alert"]
            out += [alert["alert"]] if answer["data"]["result"] else []
        return out

    # the raw expressions, without their `for:`: a queue's backlog before its first task has
    # finished reads as "not draining" for a moment on a loaded CI machine
    try:
        _wait(lambda: not firing(), 120, "no alert expression to hold")
    except AssertionError:
        pytest.fail(f"alert expressions holding on a healthy farm: {firing()}")
    up = prom.query('farm_worker_up{job="farm-workers"}')["data"]["result"]
    assert sorted(r["metric"]["device"] for r in up) == ["0", "1"] and all(r["value"][1] == "1" for r in up)
    assert float(prom.query("sum(farm_candidates_total)")["data"]["result"][0]["value"][1]) > 0
    status = json.loads(farm("status", "obs", "--json").stdout)
    assert status["status"] == "running"  # the run-progress queries saw a run in progress
    # the run's timer flush reached the workers' searches (their checkpoints record it)
    store = open_store(live_farm["env"]["FARM_STORE"], Settings(s3=live_farm["s3"].settings()))
    searched = next(r["op"] for r in status["ops"] if r["tried"])
    state = store.read_json(f"runs/obs/demo/{searched}/state.json")
    assert status["spec"]["flush"] == "clean" and state["config"]["flush"] == "clean"

    # the second half: a pool process dies while the run goes on
    _wait(lambda: _total(_get(url), "farm_tasks_total") >= 3, 90, "tasks to finish")
    before = _total(_get(url), "farm_tasks_total")
    pools = _pool_pids(live_farm["procs"]["worker"].pid)
    assert len(pools) == 2
    os.kill(pools[0], signal.SIGKILL)  # Celery replaces the pool process; its counts must stay
    _wait(lambda: len(_pool_pids(live_farm["procs"]["worker"].pid)) == 2
          and pools[0] not in _pool_pids(live_farm["procs"]["worker"].pid), 60, "a new pool process")
    after = _total(_get(url), "farm_tasks_total")
    assert after >= before
    # the killed process's live gauges are reaped within a few seconds (farm_worker_current_task)
    _wait(lambda: not any(f.name.endswith(f"_{pools[0]}.db") and f.name.startswith("gauge_live")
                          for f in _metrics_dirs(live_farm["procs"]["worker"].pid)), 30, "the dead pid reaped")


def _metrics_dirs(supervisor: int) -> list[Path]:
    env = Path(f"/proc/{_pool_pids(supervisor)[0]}/environ").read_bytes().split(b"\0")
    folder = next(e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"PROMETHEUS_MULTIPROC_DIR="))
    return list(Path(folder).iterdir())
