"""Target ascend on a host without an NPU: the ascend:cpu stand-in (CPU interpreter for
correctness, triton-ascend's frontend for compilation, no Ascend timing)."""

import glob
import json
import logging
import textwrap

import pytest

from farm.corpus.tasks import ref_from_file
from farm.reference.generate import generate_references
from farm.storage import open_store
from farm.targets import on_this_host, resolve_device
from tests.conftest import GOOD_TASK, NEWER_TRITON_API, scale_candidate, write_task

pytestmark = pytest.mark.skipif(bool(glob.glob("/dev/davinci[0-9]*")), reason="this host has an Ascend NPU")

GOOD = scale_candidate()
NEWER_API = scale_candidate(NEWER_TRITON_API)


@pytest.fixture(scope="module")
def scale_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("stand-in")
    task = write_task(root / "tasks" / "mini", "scale2", GOOD_TASK)
    store = open_store(f"file://{root / 'store'}")
    [made] = generate_references([ref_from_file(task, "mini")], store, resolve_device("cpu"), 0, "small", 120)
    assert made["success"], made
    pt = root / "scale2.bin"
    store.get_file(made["key"], pt)
    return task, pt


def evaluate(cli, tmp_path, scale_task, source: str, target: str):
    task, pt = scale_task
    cand = tmp_path / "cand.py"
    cand.write_text(textwrap.dedent(source))
    done = cli("eval", "--candidate", cand, "--task", task, "--ref-pt", pt, "--target", target, "--json")
    return done, json.loads(done.stdout)


def test_ascend_without_an_npu_runs_as_the_stand_in():
    spec = on_this_host(resolve_device("ascend"))
    assert spec.label == "ascend:cpu" and spec.target.interpret and not spec.target.device_timing
    assert resolve_device("ascend:cpu") == spec and spec.target.name == "ascend"
    assert "no Ascend timing" in spec.target.device_name()


def test_eval_target_ascend_gives_compile_error_for_an_api_triton_ascend_lacks(cli, tmp_path, scale_task,
                                                                              ascend_frontend_python, monkeypatch):
    monkeypatch.setenv("FARM_ASCEND_FRONTEND_PYTHON", str(ascend_frontend_python))
    on_cpu, doc = evaluate(cli, tmp_path, scale_task, NEWER_API, "cpu")
    assert on_cpu.exit_code == 0 and doc["verdict"] == "pass"  # the kernel is right, where its Triton has the API
    on_ascend, doc = evaluate(cli, tmp_path, scale_task, NEWER_API, "ascend")
    assert on_ascend.exit_code == 1 and doc["verdict"] == "compile_error"
    assert "kernel _scale fails at stage frontend" in doc["reason"] and "squeeze" in doc["reason"]
    assert doc["frontend"]["ran"] and doc["timing"] is None and "compile" not in doc["stage_s"]  # before any run


def test_eval_target_ascend_passes_a_good_kernel_labelled_no_ascend_timing(cli, tmp_path, scale_task,
                                                                          ascend_frontend_python, monkeypatch):
    monkeypatch.setenv("FARM_ASCEND_FRONTEND_PYTHON", str(ascend_frontend_python))
    done, doc = evaluate(cli, tmp_path, scale_task, GOOD, "ascend")
    assert done.exit_code == 0 and doc["verdict"] == "pass", done.stdout
    assert doc["frontend"]["ok"] and doc["frontend"]["results"][0]["stage"] == "linalg"
    assert doc["device"]["label"] == "ascend:cpu" and doc["device"]["device_timing"] is False
    assert "no Ascend timing" in doc["device"]["name"]
    assert "running as ascend:cpu" in done.stderr
    text = cli("eval", "--candidate", tmp_path / "cand.py", "--task", scale_task[0], "--ref-pt", scale_task[1],
               "--target", "ascend")
    assert "no Ascend timing" in text.stdout and "frontend check: pass" in text.stdout


def test_an_unconfigured_frontend_is_said_once_and_the_stand_in_still_verifies(cli, tmp_path, scale_task,
                                                                             monkeypatch, caplog):
    from farm.ascend import frontend

    monkeypatch.setattr(frontend, "DEFAULT_VENV", tmp_path / "no-venv")
    monkeypatch.setattr(frontend, "_said_unconfigured", False)
    with caplog.at_level(logging.WARNING):
        done, doc = evaluate(cli, tmp_path, scale_task, GOOD, "ascend")
    assert done.exit_code == 0 and doc["verdict"] == "pass"
    assert doc["frontend"] == {"ran": False, "note": frontend.not_configured_notice()}
    assert sum("not configured" in r.message for r in caplog.records) == 1


def test_farm_run_target_ascend_searches_without_an_npu(tmp_path, ascend_frontend_python):
    """The whole Ascend-bound flow, reference data to promotion, on the stand-in."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    write_task(tmp_path / "tasks" / "mini", "scale2", GOOD_TASK)
    (tmp_path / "farm.yaml").write_text(f"corpus:\n  tasks_dir: {tmp_path / 'tasks'}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "FARM_CONFIG": str(tmp_path / "farm.yaml"),
           "FARM_ASCEND_FRONTEND_PYTHON": str(ascend_frontend_python)}
    store = tmp_path / "store"
    run = subprocess.run([sys.executable, "-m", "farm", "run", "--source", "mini", "--target", "ascend",
                          "--store", f"file://{store}", "--max-tasks", "2", "--generators", "port", "--json"],
                         check=False, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "running as ascend:cpu" in run.stderr
    [op] = json.loads(run.stdout)["ops"]
    assert op["status"] == "succeeded" and op["promoted"], op
    best = json.loads((store / "kernels" / "ascend" / "mini" / "scale2" / "best.json").read_text())
    assert "no Ascend timing" in best["device_name"]
