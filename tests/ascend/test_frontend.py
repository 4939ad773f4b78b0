"""The Ascend frontend check (farm.ascend.frontend): launches recorded under the CPU
interpreter, compiled by triton-ascend 3.2 itself (a virtualenv of its own) up to Linalg."""

import json
import logging
import textwrap
from pathlib import Path

import pytest

from farm.ascend import frontend
from tests.conftest import GOOD_TASK, NEWER_TRITON_API, scale_candidate, write_task

NEWER_API = NEWER_TRITON_API


def candidate(value: str = "x", block: int = 64) -> str:
    return scale_candidate(value, block)


def test_each_launch_is_compiled_to_linalg_and_a_newer_api_fails_at_the_frontend(ascend_frontend_python):
    import torch

    good = frontend.check_source(ascend_frontend_python, candidate(), "ModelNew", [], [torch.randn(100)])
    assert good.ok and good.triton_version == "3.2.0"
    assert [(r.kernel, r.stage, r.ok) for r in good.results] == [("_scale", "linalg", True)]
    bad = frontend.check_source(ascend_frontend_python, candidate(NEWER_API), "ModelNew", [], [torch.randn(100)])
    [result] = bad.results
    assert not bad.ok and (result.kernel, result.stage) == ("_scale", "frontend")
    assert "has no attribute 'squeeze'" in result.message  # the compiler's own words
    assert "kernel _scale fails at stage frontend" in bad.summary()


def test_grid_over_the_ascend_limit_fails_at_launch_and_autotune_compiles_every_config(ascend_frontend_python):
    import torch

    over = frontend.check_source(ascend_frontend_python, candidate(block=1), "ModelNew", [], [torch.randn(70000)])
    assert [(r.stage, r.ok) for r in over.results] == [("launch", False)]
    assert "grid should be less than 65536" in over.results[0].message
    tuned = candidate().replace("@triton.jit", "@triton.autotune(configs=[triton.Config({}, num_warps=4), "
                                               "triton.Config({}, num_warps=8)], key=['n'])\n@triton.jit")
    report = frontend.check_source(ascend_frontend_python, tuned, "ModelNew", [], [torch.randn(100)])
    assert report.ok and len(report.results) == 2  # one compile per config, as autotuning does


def test_host_code_reading_cuda_only_device_properties_fails_as_on_ascend(ascend_frontend_python):
    """While recording, the Triton driver answers as triton-ascend's does (no SM count)."""
    import torch

    src = candidate().replace(
        "        y = torch.empty_like(x)\n",
        "        y = torch.empty_like(x)\n"
        "        sms = triton.runtime.driver.active.utils.get_device_properties(0)['multiprocessor_count']\n")
    report = frontend.check_source(ascend_frontend_python, src, "ModelNew", [], [torch.randn(100)])
    assert [r.stage for r in report.results] == ["record"]
    assert "multiprocessor_count" in report.results[0].message


def test_cli_lint_compile_reports_the_frontend_and_fails_on_its_errors(cli, tmp_path, ascend_frontend_python,
                                                                       monkeypatch):
    monkeypatch.setenv("FARM_ASCEND_FRONTEND_PYTHON", str(ascend_frontend_python))
    task = write_task(tmp_path / "tasks" / "mini", "scale2", GOOD_TASK)
    ok = cli("lint", "--target", "ascend", "--compile", task, "--json")
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    [report] = json.loads(ok.stdout)["frontend"].values()
    assert report["ok"] and report["results"][0]["kernel"] == "_scale" and report["results"][0]["stage"] == "linalg"
    assert "bishengir" in report["note"]
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent(candidate(NEWER_API)))
    failed = cli("lint", "--target", "ascend", "--compile", bad, "--task", task)
    assert failed.exit_code == 1
    assert "frontend" in failed.stdout and "fail the triton-ascend frontend" in failed.stderr
    assert "Traceback" not in failed.stdout + failed.stderr
    usage = cli("lint", "--target", "ascend", "--compile", bad)  # a candidate needs --task for its inputs
    assert usage.exit_code == 2 and "pass --task" in usage.stdout + usage.stderr


def test_not_configured_is_said_plainly(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(frontend, "DEFAULT_VENV", tmp_path / "none")
    monkeypatch.delenv("FARM_ASCEND_FRONTEND_PYTHON", raising=False)
    assert frontend.configured_python() is None
    task = write_task(tmp_path / "tasks" / "mini", "scale2", GOOD_TASK)
    done = cli("lint", "--target", "ascend", "--compile", task)
    assert done.exit_code == 2 and "farm ascend setup-frontend" in done.stdout + done.stderr
    monkeypatch.setenv("FARM_ASCEND_FRONTEND_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(Exception, match="does not exist"):
        frontend.configured_python()


def test_said_once_per_process(caplog, monkeypatch):
    monkeypatch.setattr(frontend, "_said_unconfigured", False)
    with caplog.at_level(logging.WARNING):
        frontend.say_not_configured_once()
        frontend.say_not_configured_once()
    assert sum("not configured" in r.message for r in caplog.records) == 1


def test_setup_frontend_reuses_a_ready_virtualenv(ascend_frontend_python):
    said = []
    again = frontend.setup_frontend(Path(ascend_frontend_python).parent.parent, progress=said.append)
    assert again == ascend_frontend_python and said == []  # nothing created or installed twice
    assert "ascend" in frontend.probe(again)["backends"]


def test_lint_agrees_with_the_frontend_on_a_newer_triton_api(ascend_frontend_python):
    """The lint rule newer-triton-api came from this comparison (AKG's pack_bitmatrix: tl.reduce_or)."""
    import torch

    from farm.ascend.lint import lint

    for source, expect_fail in ((candidate(), False), (candidate(NEWER_API), True)):
        lint_fail = any(f.severity == "error" for f in lint(source, "ascend"))
        report = frontend.check_source(ascend_frontend_python, source, "ModelNew", [], [torch.randn(100)])
        assert (lint_fail, not report.ok) == (expect_fail, expect_fail)
    assert {f.rule for f in lint(candidate(NEWER_API), "ascend") if f.severity == "error"} == {"newer-triton-api"}


def test_with_the_evaluators_boundary_candidate_code_cannot_write_outside(ascend_frontend_python, tmp_path):
    """Both children execute candidate code (the forward; the kernels' module top level): the
    evaluator passes its bubblewrap boundary, so a write outside the scratch folder is lost."""
    import torch

    from farm.evaluate import sandbox

    if not sandbox.probe().on:
        pytest.skip(f"no sandbox here: {sandbox.probe().why}")
    marker = tmp_path / "leaked"
    source = candidate().replace("import torch\n", f"import torch\ntry:\n    open({str(marker)!r}, 'w').write('x')\n"
                                                    "except OSError:\n    pass\n", 1)
    calls = []

    def wrap(argv, scratch, env, read_only):
        calls.append(argv[0])
        return sandbox.wrap(argv, scratch=scratch, env=env, read_only=read_only)

    report = frontend.check_source(ascend_frontend_python, source, "ModelNew", [], [torch.randn(100)], wrap=wrap)
    assert len(calls) == 2 and not marker.exists()  # recording and compiling, both inside
    assert report.ok, report.summary()
    unwrapped = frontend.check_source(ascend_frontend_python, source, "ModelNew", [], [torch.randn(100)])
    assert unwrapped.ok and marker.exists()  # the control: without the boundary the write lands


def test_setup_frontend_never_fills_a_folder_that_is_not_a_virtualenv(tmp_path):
    from farm.errors import FarmError

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "pyvenv.cfg").write_text("mine")
    with pytest.raises(FarmError, match=r"mine \(--venv\) exists and is not a virtualenv"):
        frontend.setup_frontend(tmp_path / "mine", python="/nonexistent/python")
    assert (tmp_path / "mine" / "pyvenv.cfg").read_text() == "mine"
