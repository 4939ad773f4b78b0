"""farm export: from a `farm run` on the CPU to a package installed in a fresh virtualenv whose
generated tests pass; the fallback rule (broken kernel, forced fallback, no fallback); the AOT
plan (signature extraction) and Triton-generated C for sm_90 made without a GPU."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import GOOD_TASK, REPO, write_task
from tests.export.swiglu_task import SWIGLU_TASK

PKG = "kf_test"
FAST_TASK = GOOD_TASK.replace('N = 1000\nSMALL_SHAPES = {"N": 37}', 'N = 1000\nSMALL_SHAPES = {"N": 300}')


def _env(extra: dict | None = None, interpret: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_", "KFARM_", f"{PKG.upper()}_"))}
    env["PYTHONPATH"] = str(REPO)
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env.update(extra or {})
    return env


@pytest.fixture(scope="module")
def farm_run(tmp_path_factory):
    """A real `farm run` on the CPU over two small Triton tasks (scale2: forward only, a derived
    shape space; swiglu: a training op with a declared space over tokens and two dtypes)."""
    root = tmp_path_factory.mktemp("export")
    write_task(root / "tasks" / "mini", "scale2", FAST_TASK)
    write_task(root / "tasks" / "mini", "swiglu", SWIGLU_TASK)
    (root / "farm.yaml").write_text(f"corpus:\n  tasks_dir: {root / 'tasks'}\n")
    env = _env({"FARM_CONFIG": str(root / "farm.yaml"), "FARM_STORE": f"file://{root / 'store'}",
                "HOME": str(root / "home")})
    run = subprocess.run([sys.executable, "-m", "farm", "run", "--source", "mini", "--target", "cpu", "--max-tasks", "1",
                          "--generators", "tune", "--run", "r1"], env=env, cwd=root, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    for op in ("scale2", "swiglu"):
        assert (root / "store" / "kernels" / "cpu" / "mini" / op / "best.py").exists(), op
    return root, env


@pytest.fixture(scope="module")
def installed(farm_run):
    """farm export, then pip install into a fresh virtualenv (system site packages: torch, triton)."""
    root, env = farm_run
    out = root / "pkg"
    exp = subprocess.run([sys.executable, "-m", "farm", "export", "--run", "r1", "--out", str(out), "--name", PKG,
                          "--json"], env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert exp.returncode == 0, exp.stdout + exp.stderr
    venv = root / "venv"
    # --without-pip: the venv's own old setuptools would shadow the system one (no bdist_wheel there)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation",
                          str(out)],
                         cwd=root, capture_output=True, text=True, timeout=600, env=_env())
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return root, out, py, json.loads(exp.stdout)


def _python(py: Path, code: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(py), "-W", "always", "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**_env(interpret=env.pop("interpret", True)), **env})


def test_export_writes_the_package(installed):
    root, out, py, index = installed
    assert index["package"] == PKG and [e["op"] for e in index["ops"]] == ["scale2", "swiglu"]
    assert index["version"] == "0.1.1"
    op_dir = out / PKG / "mini" / "scale2"
    for name in ("__init__.py", "task.py", "kernel_cpu.py", "op.json", "init.pt"):
        assert (op_dir / name).exists(), name
    for name in ("_runtime", "_envelope", "_library", "_layers", "_checks", "_aot", "_locals"):
        assert "from farm" not in (out / PKG / f"{name}.py").read_text(), name  # the package needs no farm
    pyproject = (out / "pyproject.toml").read_text()
    assert 'version = "0.1.1"' in pyproject and '"numpy"' in pyproject
    assert "'triton; sys_platform == \"linux\" and (platform_machine" in pyproject
    assert (op_dir / "task.py").read_text() == (root / "tasks" / "mini" / "scale2.py").read_text()
    meta = json.loads((op_dir / "op.json").read_text())
    assert meta["truth"] == "Reference" and meta["kernels"]["cpu"]["interpret"] is True
    assert meta["kernels"]["cpu"]["verified_inputs"] == [{"kind": "tensor", "dtype": "float32", "shape": [300]}]
    env = meta["kernels"]["cpu"]["envelope"]
    assert env["status"] == "checked" and env["space"]["dims"][0]["name"] == "N", env["reason"]
    assert env["signatures"] == [{"dtype": None, "inputs": [
        {"kind": "tensor", "dtype": "float32", "shape": [{"dim": "N", "a": 1, "b": 0}]}]}]
    assert {c["label"] for c in env["cases"]} >= {"bench", "low", "prime", "pow2+1"}  # high is the bench N
    swiglu = json.loads((out / PKG / "mini" / "swiglu" / "op.json").read_text())
    assert swiglu["backward"] and swiglu["layers"][0]["kind"] == "swiglu"
    sw_env = swiglu["kernels"]["cpu"]["envelope"]
    assert sw_env["status"] == "checked" and {s["dtype"] for s in sw_env["signatures"]} == {"float32", "float16"}
    doc = (out / "docs" / "mini" / "scale2.md").read_text()
    for needle in ("## Verification", "## Timing", "## Reproduce", "## Not run on hardware", "## Verified envelope",
                   "| cpu | low | N=1 | - |",
                   "farm search --source mini --op scale2 --target cpu --run r1 --max-tasks 1 --generators tune",
                   "no kernel: never run on this device", "float32 | 1e-05 | 0.0001"):
        assert needle in doc, needle
    import_path = subprocess.run([str(py), "-c", f"import {PKG}; print({PKG}.__file__)"], cwd=root,
                                 capture_output=True, text=True, env=_env())
    assert "site-packages" in import_path.stdout, import_path.stdout + import_path.stderr


@pytest.mark.parametrize("interpret", [True, False])
def test_generated_tests_pass_in_the_venv(installed, interpret):
    """With TRITON_INTERPRET=1 the cpu kernel's tests run; without it only the fallback's do."""
    root, out, py, _ = installed
    run = subprocess.run([str(py), "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rs", str(out / "tests")],
                         cwd=root, capture_output=True, text=True, timeout=600, env=_env(interpret=interpret))
    assert run.returncode == 0, run.stdout + run.stderr
    summary = run.stdout.strip().splitlines()[-1]
    assert "failed" not in summary and "passed" in summary
    skipped_kernel_tests = "set TRITON_INTERPRET=1" in run.stdout
    assert skipped_kernel_tests != interpret, run.stdout
    if interpret:  # 20 shapes of the space per op, each dtype, no fallback; swiglu's gradients; torch.compile
        for op in ("scale2", "swiglu"):
            assert f"test_mini__{op}.py::test_kernel_over_the_space[cpu] PASSED" in run.stdout, run.stdout
            assert f"test_mini__{op}.py::test_outside_the_envelope_falls_back_and_is_counted[cpu] PASSED" in run.stdout
            assert f"test_mini__{op}.py::test_torch_compile_traces_the_op PASSED" in run.stdout


def test_a_broken_kernel_file_falls_back_with_a_warning(installed, tmp_path):
    root, out, py, _ = installed
    site = Path(subprocess.run([str(py), "-c", f"import {PKG}, os; print(os.path.dirname({PKG}.__file__))"],
                               capture_output=True, text=True, cwd=root, env=_env()).stdout.strip())
    kernel = site / "mini" / "scale2" / "kernel_cpu.py"
    saved = tmp_path / "kernel_cpu.py"
    shutil.copyfile(kernel, saved)
    code = (f"import torch\nfrom {PKG}.mini.scale2 import scale2, op\nx = torch.randn(300)\n"
            "print(op.explain(x)['backend'])\nassert torch.equal(scale2(x), x * 2.0)\nprint('ok')\n")
    try:
        kernel.write_text(kernel.read_text() + "\nthis is not python (\n")
        broken = _python(py, code, root)
    finally:
        shutil.copyfile(saved, kernel)
    assert broken.returncode == 0, broken.stdout + broken.stderr
    assert broken.stdout.split() == ["fallback", "ok"]
    assert "FallbackWarning" in broken.stderr and "the cpu kernel failed to import (SyntaxError" in broken.stderr


def test_forced_fallback_switches(installed):
    """The two environment variables and force_fallback(); force_fallback(False) overrides the environment."""
    root, _, py, _ = installed
    code = f"""import os, torch, {PKG}
from {PKG}.mini.scale2 import op, scale2
x = torch.randn(300)
seen = [op.explain(x)["backend"]]
for var in ("KFARM_FORCE_FALLBACK", "{PKG.upper()}_FORCE_FALLBACK"):
    os.environ[var] = "1"
    seen.append(op.explain(x)["backend"])
    assert torch.equal(scale2(x), x * 2.0)
    {PKG}.force_fallback(False)
    seen.append(op.explain(x)["backend"])
    {PKG}.force_fallback(None)
    del os.environ[var]
{PKG}.force_fallback(True)
seen.append(op.explain(x)["reason"])
print(seen)
"""
    res = _python(py, code, root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == str(["kernel", "fallback", "kernel", "fallback", "kernel",
                                      "fallback forced (force_fallback(True))"]), res.stdout


def test_rule_outside_verified_inputs_and_no_fallback(installed, monkeypatch):
    """In-process, on a copy of the package: other shapes/dtypes fall back; KFARM_SHAPES=rank widens
    shapes; an op without a fallback raises NoFallbackError naming why the kernel could not run."""
    import torch

    root, out, _, _ = installed
    copy = root / "copy"
    if not copy.exists():
        shutil.copytree(out, copy)
    monkeypatch.syspath_prepend(str(copy))
    from kf_test._runtime import NoFallbackError, Op, OpModule

    folder = copy / PKG / "mini" / "scale2"
    op = Op(folder, f"{PKG}.mini.scale2")
    assert op.explain(torch.randn(300))["backend"] == "kernel"
    assert op.explain(torch.randn(1))["backend"] == op.explain(torch.randn(173))["backend"] == "kernel"  # the space
    other = op.explain(torch.randn(301))
    assert other["backend"] == "fallback" and "N = 301, outside the verified 1..300" in other["reason"]
    assert "dtype float64, verified float32" in op.explain(torch.randn(300, dtype=torch.float64))["reason"]
    assert "2 dimensions" in op.explain(torch.randn(3, 100))["reason"]
    monkeypatch.setenv("KFARM_SHAPES", "rank")
    assert op.explain(torch.randn(301))["backend"] == "kernel"
    monkeypatch.delenv("KFARM_SHAPES")
    meta = json.loads((folder / "op.json").read_text())
    (folder / "op.json").write_text(json.dumps({**meta, "truth": None}))
    try:
        bare = Op(folder, f"{PKG}.mini.scale2")
        with pytest.raises(NoFallbackError, match="cannot run here .*N = 301.*no PyTorch fallback"):
            OpModule(bare, [])(torch.randn(301))
        assert torch.equal(OpModule(bare, [])(torch.ones(300)), torch.full((300,), 2.0))
    finally:
        (folder / "op.json").write_text(json.dumps(meta))


LLAMA = f"""import warnings, torch, torch.nn as nn
import {PKG}

class LlamaMLP(nn.Module):
    def __init__(self, hidden=16, inter=40):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.mlp = LlamaMLP()

    def forward(self, x):
        return x + self.mlp(self.norm(x))

torch.manual_seed(0)
model, ref = Block(), Block()
ref.load_state_dict(model.state_dict())
report = {PKG}.patch(model)                           # the two lines a team writes
print(report)
seen = {{}}
for tokens in (1, 7, 13):                             # [2, tokens, 16]: 2..26 rows, inside 1..48
    x = torch.randn(2, tokens, 16)
    y, y0 = model(x), ref(x)
    (y * y).sum().backward(); (y0 * y0).sum().backward()
    seen[tokens] = [float((y - y0).abs().max()),
                    float((model.mlp.gate_proj.weight.grad - ref.mlp.gate_proj.weight.grad).abs().max())]
    model.zero_grad(); ref.zero_grad()
print("kernel", {PKG}.stats()["mini/swiglu"])
{PKG}.reset_stats()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        model(torch.randn(5, 11, 16))                 # 55 rows: past the space
print("outside", {PKG}.stats()["mini/swiglu"]["by_rule"], len([w for w in caught if "envelope" in str(w.message)]))
{PKG}.reset_stats()
compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
x = torch.randn(2, 3, 16, requires_grad=True)
out = compiled(x)
out.sum().backward()
print("compiled", float((out - ref(x)).abs().max()), x.grad is not None, {PKG}.stats()["mini/swiglu"]["kernel"])
print("errors", seen)
"""


def test_patch_a_llama_mlp_in_the_venv(installed):
    """Two lines swap the MLP for the SwiGLU kernel; the kernel runs at 3-D shapes inside the space, forward
    and backward equal to the unpatched model; outside the space it falls back, counted, warned once; a
    torch.compile(fullgraph=True) of the patched model runs (aot_eager: traced through the custom op)."""
    root, _, py, _ = installed
    res = _python(py, LLAMA, root)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = {line.split(" ", 1)[0]: line for line in res.stdout.splitlines()}
    assert "mlp: LlamaMLP -> SwiGLUMLP (mini/swiglu)" in res.stdout and "swapped 1 module" in res.stdout
    assert "'kernel': 3, 'fallback': 0" in lines["kernel"]
    assert lines["outside"] == "outside {'envelope': 2} 1"
    compiled = lines["compiled"].split()
    assert float(compiled[1]) < 1e-5 and compiled[2:] == ["True", "1"]
    errors = eval(lines["errors"].split(" ", 1)[1])  # noqa: S307 - our own script's output
    assert all(fwd < 1e-5 and grad < 1e-4 for fwd, grad in errors.values()), errors


def test_a_forward_only_op_under_autograd_falls_back_or_raises(installed):
    """scale2 has no backward kernel: asked for gradients it falls back (the result stays in the graph),
    or raises with KFARM_GRAD=raise; under no_grad the kernel runs."""
    root, _, py, _ = installed
    code = f"""import torch, {PKG}
from {PKG}.mini.scale2 import scale2, op
x = torch.randn(300, requires_grad=True)
print(op.explain(x)["rule"])
y = scale2(x)
y.sum().backward()
print(y.grad_fn is not None, float(x.grad.sum()), {PKG}.stats()["mini/scale2"]["by_rule"])
with torch.no_grad():
    print(op.explain(x)["backend"], scale2(x).grad_fn)
{PKG}.on_grad("raise")
try:
    scale2(x)
except {PKG}.KernelGradError as exc:
    print("raised", "KFARM_GRAD=raise" in str(exc))
"""
    res = _python(py, code, root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.split("\n")[:4] == ["grad", "True 600.0 {'grad': 1}", "kernel None", "raised True"]


def test_every_export_of_a_name_has_a_higher_version(farm_run, tmp_path, cli, monkeypatch):
    root, env = farm_run
    monkeypatch.setenv("FARM_CONFIG", env["FARM_CONFIG"])  # in this process: three interpreters less to start
    versions = []
    for i, out in enumerate((tmp_path / "a", tmp_path / "b", tmp_path / "a")):
        if i == 1:  # what the user adds to an export is theirs: re-exporting keeps it
            (tmp_path / "a" / "NOTES.md").write_text("mine")
            (tmp_path / "a" / "kfarm_kernels" / "extra.py").write_text("mine")
        res = cli("export", "--run", "r1", "--op", "scale2", "--out", out, "--cases", "0", "--aot", "off", "--json",
                  "--store", env["FARM_STORE"])
        assert res.exit_code == 0, res.output
        index = json.loads(res.stdout)
        versions.append((index["package"], index["version"]))
        assert f'version = "{index["version"]}"' in (out / "pyproject.toml").read_text()
    # the default import name is stable (not the run's); PKG's own exports are counted apart
    assert versions == [("kfarm_kernels", "0.1.1"), ("kfarm_kernels", "0.1.2"), ("kfarm_kernels", "0.1.3")]
    for mine in (tmp_path / "a" / "NOTES.md", tmp_path / "a" / "kfarm_kernels" / "extra.py"):
        assert mine.read_text() == "mine"
    meta = json.loads((tmp_path / "a" / "kfarm_kernels" / "mini" / "scale2" / "op.json").read_text())
    assert meta["kernels"]["cpu"]["envelope"]["status"] == "exact"  # --cases 0: the stored seed set only


def test_export_errors_are_one_line(farm_run, cli, monkeypatch):
    root, env = farm_run
    monkeypatch.setenv("FARM_CONFIG", env["FARM_CONFIG"])
    store = env["FARM_STORE"]
    cases = [(["--run", "r1", "--name", "Bad-Name"], "--name 'Bad-Name'"),
             (["--run", "r1", "--name", "json"], "--name 'json': that is a module of Python's standard library"),
             (["--run", "r1", "--name", "torch"], "--name 'torch': an installed module has that name"),
             (["--run", "r1", "--name", "pytest"], "--name 'pytest': an installed module has that name"),
             (["--run", "r1", "--name", "class"], "--name 'class': a Python keyword"),
             (["--run", "r1", "--cases", "-1"], "--cases"),
             (["--run", "nope"], "no run 'nope'"),
             (["--run", "r1", "--latest"], "not both"),
             (["--run", "r1", "--target", "cuda"], "no promoted kernels")]
    for args, message in cases:
        res = cli("export", *args, "--store", store, "--out", root / "bad")
        assert res.exit_code != 0 and message in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
    # --latest takes local runs too (r1 above); a store with no run at all says so
    res = cli("export", "--latest", "--store", f"file://{root / 'empty'}", "--out", root / "bad")
    assert res.exit_code != 0 and "no runs in" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (root / "bad").exists()
    # a folder of someone else's is refused before any work, naming it and the way to write anyway
    (root / "theirs").mkdir()
    (root / "theirs" / "pyproject.toml").write_text("mine")
    res = cli("export", "--run", "r1", "--store", store, "--out", root / "theirs")
    assert res.exit_code == 2 and "theirs (--out) is not empty" in res.stderr and "--force" in res.stderr, res.stderr
    assert (root / "theirs" / "pyproject.toml").read_text() == "mine"


# ---------------------------------------------------------------- AOT


def _launch(args, grid=(8, 1, 1)):
    return {"kernel": "k", "file": "kernel.py", "args": args, "grid": list(grid), "num_warps": 4, "num_stages": 3}


def _ptr(name, aligned=True, dtype="float16"):
    from farm.export.launches import TRITON_DTYPE

    return {"name": name, "kind": "tensor", "dtype": dtype, "type": "*" + TRITON_DTYPE[dtype], "aligned16": aligned,
            "ptr": 4096 if aligned else 4098, "shape": [8], "stride": [1]}


def test_signature_extraction_follows_triton_specialisation():
    from farm.export import aot
    from farm.export.launches import describe_arg, int_type

    launch = _launch([_ptr("x"), _ptr("y", aligned=False, dtype="bfloat16"),
                      {"name": "n", "kind": "scalar", "type": "i32", "value": 1000},
                      {"name": "one", "kind": "scalar", "type": "i32", "value": 1},
                      {"name": "ld", "kind": "scalar", "type": "i64", "value": 2**33},
                      {"name": "eps", "kind": "scalar", "type": "fp32", "value": 1e-6, "no_specialize": True},
                      {"name": "BLOCK", "kind": "constexpr", "value": 128},
                      {"name": "FLAG", "kind": "constexpr", "value": True}], grid=(8, 4, 1))
    assert aot.signature(launch) == ["*fp16:16", "*bf16", "i32", "i32:1", "i64:16", "fp32", "128", "1"]
    assert aot.signature(launch, hints=False) == ["*fp16", "*bf16", "i32", "i32", "i64", "fp32", "128", "1"]
    # 8 = cdiv(1000, 128): a C expression of n; 4 matches nothing: the number
    assert aot.grid_expr(launch, aot.signature(launch)) == ["(n + 128 - 1) / 128", "4", "1"]
    assert [v["signature"] for v in aot.variants([launch])["k"]] == [
        "*fp16:16, *bf16, i32, i32:1, i64:16, fp32, 128, 1", "*fp16, *bf16, i32, i32, i64, fp32, 128, 1"]
    assert int_type(2**31 - 1) == "i32" and int_type(2**31) == "i64" and int_type(2**63) == "u64"
    assert describe_arg("s", 3.0, False)["type"] == "fp32" and describe_arg("b", True, False)["type"] == "i1"
    with pytest.raises(aot.AotUnsupported, match="constexpr ACT='silu'"):
        aot.signature(_launch([{"name": "ACT", "kind": "constexpr", "value": "silu"}]))
    temp = aot.plan("op", {"kernel_file": "kernel.py", "outputs": [], "launches": [_launch([{**_ptr("tmp"), "at": None}])]})
    assert not temp["testable"] and "neither an input nor an output" in temp["not_testable"]


def test_aot_cross_generation_for_sm90_without_a_gpu(installed, tmp_path):
    """Launches recorded in the interpreter on the stored seed set, then Triton's own compile and
    link for cuda:90 (farm.export.aot_cross): the C compiles against cuda.h."""
    from farm.export import aot
    from farm.export.package import record_launches

    root, out, _, _ = installed
    kernel = tmp_path / "kernel.py"
    shutil.copyfile(out / PKG / "mini" / "scale2" / "kernel_cpu.py", kernel)
    pt = (out / "tests" / "data" / "mini__scale2.pt").read_bytes()
    recorded = record_launches(kernel, pt, "cpu")
    [launch] = recorded["launches"]
    assert launch["kernel"] == "_scale" and launch["grid"] == [5, 1, 1] and launch["num_warps"] == 4
    x, y, n, block = launch["args"]
    assert (x["at"], y["at"]) == ({"of": "input:0", "offset": 0}, {"of": "output:0", "offset": 0})
    assert (n["type"], n["value"], block["value"]) == ("i32", 300, 64)
    doc = aot.plan("scale2", recorded)
    assert doc["testable"] and [v["signature"] for v in doc["kernels"][0]["variants"]] == [
        "*fp32:16, *fp32:16, i32, 64", "*fp32, *fp32, i32, 64"]
    assert doc["kernels"][0]["variants"][0]["grid"] == "(n + 64 - 1) / 64,1,1"
    folder = tmp_path / "aot"
    folder.mkdir()
    aot.write(folder, kernel.read_bytes(), doc, "scale2")
    try:
        aot.generate(folder, doc, arch=90)
    except Exception as exc:  # noqa: BLE001 - a triton without the NVIDIA backend or ptxas cannot cross-compile
        if "ptxas" in str(exc) or "nvidia" in str(exc).lower():
            pytest.skip(f"this triton cannot compile for sm_90 here: {exc}")
        raise
    name = doc["kernels"][0]["out_name"]
    assert name == "scale2_scale"
    linked = (folder / "src" / f"{name}.h").read_text()
    entry = doc["kernels"][0]["variants"][0]["entry"]
    assert entry == f"{name}_64_warps4xstages3" and f"CUresult {entry}(" in linked.replace("TT_ResultTy", "CUresult")
    assert f"{name}_default(" in linked and "int algo_id" in linked
    c_files = sorted(p.name for p in (folder / "src").glob("*.c"))
    assert len(c_files) == 3  # two specialisations and the linked dispatcher
    cubin = (folder / "src" / doc["kernels"][0]["variants"][0]["header"]).with_suffix(".c").read_text()
    assert "cuModuleLoadData" in cubin and "(n + 64 - 1) / 64" in cubin
    header = (folder / "scale2.h").read_text()
    assert f'#include "src/{name}.h"' in header and "kfarm_f32_arg" in header
    assert "triton.tools.compile kernel.py -n _scale" in (folder / "generate.sh").read_text()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here")
    import triton

    include = Path(triton.__file__).parent / "backends" / "nvidia" / "include"
    for c in (folder / "src").glob("*.c"):
        res = subprocess.run([cc, "-fsyntax-only", f"-I{include}", f"-I{folder}", str(c)], capture_output=True,
                             text=True)
        assert res.returncode == 0, res.stderr
    res = subprocess.run([cc, "-fsyntax-only", f"-I{include}", f"-I{folder}", "-x", "c", "-"], input='#include "scale2.h"\n',
                         cwd=folder, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
