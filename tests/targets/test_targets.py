"""Targets: resolution, pinning and plug-ins, checked without an accelerator (Ascend included)."""

import pytest

from farm.errors import FarmError
from farm.targets import available, resolve_device

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, label, torch_dev, env", [
    ("cpu", "cpu", "cpu", {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}),
    ("cuda:3", "cuda:3", "cuda:0", {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                   "TRITON_DEFAULT_BACKEND": "nvidia"}),
    ("npu:2", "ascend:2", "npu:0", {"ASCEND_RT_VISIBLE_DEVICES": "2", "TRITON_DEFAULT_BACKEND": "ascend"}),
    ("ascend", "ascend:0", "npu:0", {"ASCEND_RT_VISIBLE_DEVICES": "0", "TRITON_DEFAULT_BACKEND": "ascend"}),
    ("5", "cuda:5", "cuda:0", {"CUDA_VISIBLE_DEVICES": "5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                             "TRITON_DEFAULT_BACKEND": "nvidia"}),
])
def test_device_resolution_pins_one_device_per_process(text, label, torch_dev, env):
    spec = resolve_device(text, default_target="cuda")
    assert spec.label == label and spec.torch_device == torch_dev
    assert spec.child_env() == env


def test_auto_without_accelerator_is_cpu_and_bad_names_are_errors(monkeypatch):
    monkeypatch.setattr("farm.targets.accelerator_present", lambda: None)
    assert resolve_device("auto").target.name == "cpu"
    with pytest.raises(FarmError, match="unknown device 'tpu:0'"):
        resolve_device("tpu:0")
    with pytest.raises(FarmError, match="must be a number"):
        resolve_device("cuda:x")


def test_flush_sizes_follow_the_design():
    assert available()["cuda"].flush_bytes == 256 * 1024**2
    assert available()["ascend"].flush_bytes == 192 * 1024**2
    assert available()["ascend"].torch_device == "npu"


def test_a_plugin_target_is_found_and_named_devices_resolve(plugin_target_path, monkeypatch):
    import subprocess
    import sys

    code = ("from farm.targets import available, resolve_device; t = available()['interp']; "
            "s = resolve_device('interp'); print(t.interpret, s.label, s.torch_device, sorted(s.child_env()))")
    env = {**__import__("os").environ, "PYTHONPATH": f"{plugin_target_path}:{REPO}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "interp", "cpu", "['CUDA_VISIBLE_DEVICES',", "'TRITON_INTERPRET']"]


def test_a_plugin_target_runs_the_whole_flow_reference_to_export(plugin_target_path, tmp_path):
    """`farm run --target interp` with the target installed from another package, then fetch,
    then `farm export` and the exported package's own tests: reference, search, promotion and
    export all take the target's word (its hooks) for what to do."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": f"{plugin_target_path}:{REPO}", "HOME": str(tmp_path / "home")}
    store = f"file://{tmp_path / 'store'}"
    farm = [sys.executable, "-m", "farm"]
    # one op: each hook is asked the same for every op
    run = subprocess.run(farm + ["run", "--source", "demo", "--ops", "vector_add_scale", "--target", "interp",
                                 "--store", store, "--max-tasks", "3", "--json"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    best = tmp_path / "store" / "kernels" / "interp" / "demo" / "vector_add_scale"
    assert (best / "best.py").exists()
    meta = json.loads((best / "best.json").read_text())
    assert meta["device_name"] == "Interp test chip (Triton interpreter on the host)"  # the target's device_name
    report = json.loads((tmp_path / "store" / "runs" / meta["run"] / "demo" / "vector_add_scale" / "report.json")
                        .read_text())
    assert all("frontend" in c["stage_s"] for c in report["candidates"])  # the target's frontend check ran
    fetched = subprocess.run(farm + ["fetch", "--target", "interp", "--store", store,
                                     "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["kernels"] and {k["target"] for k in index["kernels"]} == {"interp"}
    pkg = tmp_path / "pkg"
    exported = subprocess.run(farm + ["export", "--run", meta["run"], "--store", store, "--out", str(pkg),
                                      "--name", "interp_kernels", "--json"], env=env, capture_output=True, text=True,
                              timeout=600)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    ops = json.loads(exported.stdout)["ops"]
    assert {op["op"] for op in ops} == {"vector_add_scale"} and all(op["targets"] == ["interp"] for op in ops)
    doc = (pkg / "docs" / "demo" / "vector_add_scale.md").read_text()
    assert "The interp kernel ran in Triton's interpreter only" in doc
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pkg / "tests")],
                           env={**os.environ, "PYTHONPATH": str(pkg), "TRITON_INTERPRET": "1"}, cwd=pkg,
                           capture_output=True, text=True, timeout=600)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]


def test_a_device_named_under_the_users_mask_is_the_host_device_the_mask_shows(monkeypatch):
    """CUDA_VISIBLE_DEVICES=2,3 (a scheduler's share, or a user picking GPUs): cuda:0 and auto
    are the host's GPU 2 and cuda:1 its GPU 3, as in any CUDA program; the farm used to pin the
    host's GPU 0 and 1, outside the share, without a word."""
    from farm.targets import through_mask, usable_device

    cuda_type = type(resolve_device("cuda:0").target)
    monkeypatch.setattr(cuda_type, "unusable", lambda self: None)  # this host's torch has no CUDA
    monkeypatch.setattr("farm.targets.accelerator_present", lambda: "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert usable_device("cuda:0").label == "cuda:2" and usable_device("auto").label == "cuda:2"
    assert usable_device("cuda:1").child_env()["CUDA_VISIBLE_DEVICES"] == "3"
    with pytest.raises(FarmError, match=r"--device cuda:2: CUDA_VISIBLE_DEVICES=2,3 shows 2 device\(s\)"):
        usable_device("cuda:2")
    assert resolve_device("cuda:3").label == "cuda:3"  # a child's label is the host's: never re-mapped
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5a1b")
    with pytest.raises(FarmError, match="CUDA_VISIBLE_DEVICES=GPU-5a1b: .*indices"):
        through_mask(resolve_device("cuda:0"), "--devices")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert usable_device("cuda:1").label == "cuda:1"
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "6")
    assert through_mask(resolve_device("npu:0")).label == "ascend:6"
