"""A run is a run wherever it came from: `farm run`, `farm search` and `farm submit` enter their
runs in one catalogue (runs/index.json), `farm status` shows each, and `--latest` names the same
run in status, fetch, export and report."""

import json
import os
import time

from farm.distributed.runs import RunSpec, save_run, summarize, update_op
from farm.search import catalog, ledger
from farm.storage import open_store


def submitted(store, name: str) -> None:
    save_run(store, RunSpec(run=name, source="demo", ops=["row_sum"], target="cpu", reference_target="cpu",
                            shapes="small", generators=["tune"], max_tasks=1, chunk_candidates=1, max_concurrent=1))
    update_op(store, name, "demo", "row_sum", phase="done", tried=1, passed=1)


def test_after_farm_run_every_command_agrees_on_the_run(cli, tmp_path):
    store = open_store(os.environ["FARM_STORE"])
    submitted(store, "older-submitted")  # a distributed run started before the local one
    time.sleep(1.1)  # start times have a resolution of a second
    done = cli("run", "--ops", "row_sum", "--max-tasks", "1", "--no-report")
    assert done.exit_code == 0, done.output

    status = cli("status")  # no name: the newest run, the local one
    assert status.exit_code == 0, status.output
    assert "run local-demo-cpu (demo -> cpu): finished, 1/1 ops finished" in " ".join(status.stdout.split())
    named = cli("status", "local-demo-cpu", "--json")
    assert named.exit_code == 0 and "Traceback" not in named.output, named.output
    view = json.loads(named.stdout)
    assert view["kind"] == "local" and [(r["op"], r["phase"], r["tried"]) for r in view["ops"]] == [
        ("row_sum", "done", 1)]

    listed = json.loads(cli("status", "--all", "--json").stdout)
    assert [(r["run"], r["kind"]) for r in listed["runs"]] == [("local-demo-cpu", "local"),
                                                                ("older-submitted", "distributed")]
    assert json.loads(cli("status", "--json").stdout)["run"] == "local-demo-cpu"
    fetched = cli("fetch", "--latest", "--out", tmp_path / "k", "--json")
    assert fetched.exit_code == 0, fetched.output
    assert {k["run"] for k in json.loads(fetched.stdout)["kernels"]} == {"local-demo-cpu"}
    exported = cli("export", "--latest", "--out", tmp_path / "pkg", "--aot", "off", "--json")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["run"] == "local-demo-cpu"
    report = cli("report", "--latest", "--out", tmp_path / "page", "--json")
    assert report.exit_code in (0, 2), report.output  # 2: matplotlib missing; the run it names is what counts
    if report.exit_code == 0:
        assert json.loads(report.stdout)["run"] == "local-demo-cpu"


def test_a_local_run_whose_process_died_is_interrupted_not_running(tmp_path):
    store = open_store(os.environ["FARM_STORE"])
    catalog.record(store, "cut", "local", ["demo"], "cpu", planned=2)
    ledger.record(store, "cut", "demo/row_sum", "done", {"status": "succeeded", "submitted": 2, "passed": 1})
    store.put_bytes("runs/cut/demo/swiglu/state.json", json.dumps(
        {"chunks_done": 1, "db": {"records": [{"id": "c0001", "verdict": "pass"}]}}).encode())
    assert summarize(store, "cut")["status"] == "running"  # this very process writes it
    store.update_json(catalog.INDEX_KEY, lambda d: {"runs": {"cut": {**d["runs"]["cut"], "pid": dead_pid()}}})
    view = summarize(store, "cut")
    assert view["status"] == "interrupted" and view["eta_s"] is None
    rows = {r["op"]: r for r in view["ops"]}
    assert rows["row_sum"]["phase"] == "done" and rows["swiglu"]["phase"] == "interrupted"
    assert rows["swiglu"]["tried"] == 1 and "run the same command again" in rows["swiglu"]["error"]


def test_a_single_op_search_keeps_no_ledger_and_is_a_run_all_the_same(cli):
    """`farm search --op` leaves the op's report and the catalogue entry, no ledger."""
    store = open_store(os.environ["FARM_STORE"])
    catalog.record(store, "one-op", "local", ["demo"], "cpu")
    store.put_bytes("runs/one-op/demo/row_sum/report.json", json.dumps(
        {"status": "succeeded", "submitted": 3, "passed": 2, "best": {"speedup_vs_model": 1.5, "time_ms": 2.0}}).encode())
    view = json.loads(cli("status", "--json").stdout)
    assert view["run"] == "one-op" and view["status"] == "finished", view
    assert [(r["op"], r["phase"], r["tried"], r["best_speedup"]) for r in view["ops"]] == [("row_sum", "done", 3, 1.5)]


def test_latest_with_no_runs_names_both_ways_to_make_one(cli):
    result = cli("fetch", "--latest", "--out", "k")
    assert result.exit_code == 2 and "`farm run` or `farm submit` makes one" in result.output


def dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid

