"""The inductor generator: Triton from torch.compile of Reference, made into ModelNew candidates.

CPU only. The assembly is checked on captures committed under tests/data/inductor/ (two taken
on an H100 with torch 2.11 / triton 3.6, two on the CPU with cpu_backend="triton"); the real
path (child compile + capture + assembly + evaluator) runs on the cpu target, where inductor
emits Triton for the interpreter.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from farm.corpus import tasks as taskfiles
from farm.evaluate import static_checks
from farm.evaluate.evaluator import Evaluator
from farm.generators import load_generator
from farm.generators.base import Context
from farm.generators.inductor.assemble import assemble
from farm.generators.inductor.kernels import kernel_sources
from farm.generators.inductor.layers import Unsupported
from farm.reference.generate import generate_reference
from farm.targets import resolve_device

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "inductor"
SAMPLES = ["rms_norm_cuda_bench", "rotary_embedding_cuda_bench", "rms_norm_cpu_small", "reductions_cpu_small"]


def sample(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def task_path(cap: dict) -> Path:
    if cap["source"] == "mini":
        return DATA / f"{cap['op']}.py"
    return REPO / "tasks" / cap["source"] / f"{cap['op']}.py"


_CHECK = """
import importlib.util, json, sys
import torch
from farm.runtime import tolerance
from farm.corpus import tasks as taskfiles
from farm.corpus.inputs import draw_init_inputs, draw_inputs

cand, task_file, source, op, shapes, seeds = sys.argv[1:7]
spec = importlib.util.spec_from_file_location("farm_test_candidate", cand)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
task = taskfiles.load_task(taskfiles.TaskRef(source, op, taskfiles.Path(task_file)), shapes)
init = draw_init_inputs(task, 0)
truth, new = task.truth_cls(*init), module.ModelNew(*init)
for seed in json.loads(seeds):
    inputs = draw_inputs(task, seed)
    with torch.no_grad():
        expected = tolerance.as_output_list(truth(*[x.clone() for x in inputs]))
        got = tolerance.as_output_list(new(*[x.clone() for x in inputs]))
    checks = tolerance.compare_outputs(got, expected, task.tolerance)
    assert tolerance.all_ok(checks), [c.reason for c in checks if not c.ok]
print("ok")
"""


def run_in_interpreter(source: str, cap: dict, tmp_path: Path, seeds=(1, 2), expect: str = "ok",
                       task: Path | None = None) -> str:
    """ModelNew against the task's ground truth on fresh inputs, with the farm's tolerances, in a
    fresh interpreter (TRITON_INTERPRET must be set before triton is first imported)."""
    cand = tmp_path / f"cand_{cap['op']}.py"  # Triton reads kernel source from the file
    cand.write_text(source)
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", _CHECK, str(cand), str(task or task_path(cap)), cap["source"], cap["op"],
                           cap["shapes"], json.dumps(list(seeds))], check=False, env=env, capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and proc.stdout.strip().endswith(expect), out[-3000:]
    return out


# ------------------------------------------------------------------ assembly from captured samples


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_assembles_into_a_valid_candidate(name):
    cap = sample(name)
    source = assemble(cap)
    tree = ast.parse(source)
    assert static_checks.static_verdict(source) == ("", "")
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew")
    forward = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    assert [a.arg for a in forward.args.args[1:]] == cap["forward_names"]
    # plain @triton.jit kernels, none of inductor's runtime
    assert "triton_heuristics" not in source and "async_compile" not in source
    for name_ in kernel_sources(cap["wrapper"]):
        assert f"def {name_}(" in source and f"{name_}[" in source
    # shape-specialized, and says so
    first = cap["inputs"][0]
    assert f"_check({cap['forward_names'][0]}, {tuple(first['shape'])}, {tuple(first['stride'])}" in source
    assert "Shape-specialized" in source


def test_cuda_sample_keeps_libdevice_and_autotuned_config():
    cap = sample("rms_norm_cuda_bench")
    source = assemble(cap, "cuda")
    assert "from triton.language.extra import libdevice" in source and "libdevice.rsqrt(" in source
    launch = cap["launches"][0]
    # the block sizes inductor settled on are bound once, and the grid follows them
    assert f"XBLOCK_0 = {launch['config']['XBLOCK']}" in source
    assert "triton.cdiv(83, XBLOCK_0)" in source
    assert f"num_warps={launch['num_warps']}" in source


def test_cuda_sample_runs_in_the_interpreter_when_assembled_for_cpu(tmp_path):
    """The same H100 capture, assembled for the cpu target (libdevice -> tl.math), computes
    the right values: the assembly (grids, launches, views of outputs) is what runs on the GPU."""
    for name in ("rms_norm_cuda_bench", "rotary_embedding_cuda_bench"):
        cap = sample(name)
        source = assemble(cap, "cpu")
        assert "libdevice" not in source
        if name.startswith("rotary"):
            # 1024 programs are slow in the interpreter; the grid follows the block local, so a
            # larger block (as the tune generator would set it) still covers the tensor
            assert "XBLOCK_0 = 2048\n" in source and "2097152 % XBLOCK_0 == 0" in source
            source = source.replace("XBLOCK_0 = 2048\n", "XBLOCK_0 = 131072\n")
        run_in_interpreter(source, cap, tmp_path, seeds=(3,))


def test_helpers_are_copied_and_shimmed(tmp_path):
    cap = sample("reductions_cpu_small")
    source = assemble(cap, "cpu")
    assert "triton_helpers." not in source and "torch._inductor" not in source
    assert "def triton_helpers_max2(" in source and "def triton_helpers_maximum(" in source
    assert "def libdevice_tanh(" in source  # no tl.math.tanh: a shim the interpreter runs
    run_in_interpreter(source, cap, tmp_path)
    cuda = assemble(cap, "cuda")
    assert "libdevice.tanh(" in cuda and "def libdevice_tanh(" not in cuda


def test_shape_and_constructor_guards(tmp_path):
    cap = sample("rms_norm_cpu_small")
    source = assemble(cap) + textwrap.dedent('''
        import pytest as _pytest
        with _pytest.raises(AssertionError, match="compiled for eps"):
            ModelNew(1e-5)
        _model = ModelNew(1e-6)
        with _pytest.raises(AssertionError, match="compiled for shape"):
            _model(torch.randn(6, 131).half(), torch.randn(131).half())
        with _pytest.raises(AssertionError, match="compiled for torch.float16"):
            _model(torch.randn(5, 131), torch.randn(131).half())
        print("guards ok")
        raise SystemExit(0)
    ''')
    run_in_interpreter(source, cap, tmp_path, seeds=(1,), expect="guards ok")


def test_unexpected_wrapper_is_refused():
    cap = sample("rms_norm_cpu_small")
    broken = dict(cap, launches=cap["launches"] + cap["launches"])
    with pytest.raises(Unsupported, match="launches"):
        assemble(broken)
    cpp = dict(cap, wrapper=cap["wrapper"].replace("async_compile.triton(", "async_compile.cpp_pybinding("))
    with pytest.raises(Unsupported, match="not Triton"):
        assemble(cpp)


# ------------------------------------------------------------------ the real path on the cpu target


def _ctx(path: Path, source: str, target: str, shapes: str = "small") -> Context:
    return Context(task_code=path.read_text(), op=path.stem, source=source, target=target,
                   device={"shapes": shapes})


def test_generator_seeds_pass_the_evaluator_on_cpu():
    """cpu_backend="triton": inductor writes Triton that the interpreter runs; the seed passes."""
    path = REPO / "tasks" / "vllm_torch" / "rms_norm.py"
    gen = load_generator("inductor")
    seeds = gen.initial_candidates(_ctx(path, "vllm_torch", "cpu"))
    if not seeds and any("torch.compile failed" in r for r in gen.reasons):
        pytest.skip(f"this torch's inductor makes no Triton for the interpreter: {gen.reasons}")
    assert len(seeds) == 1, gen.reasons
    assert seeds[0].generator == "inductor" and "mode=default" in seeds[0].note
    assert gen.captures[0]["ok"] and gen.captures[0]["shapes"] == "small"
    assert gen.propose(None, [], _ctx(path, "vllm_torch", "cpu")) == []

    ref = taskfiles.TaskRef("vllm_torch", "rms_norm", path)
    spec = resolve_device("cpu")
    data = generate_reference(taskfiles.load_task(ref, "small"), spec, seed=0)
    with Evaluator(ref, data, spec) as ev:
        result = ev.evaluate(seeds[0].source, name="inductor_rms_norm.py")
    assert result.verdict == "pass", (result.reason, result.log[-2000:])
    assert result.launches == 1 and result.kernels[0].startswith("triton_")


def test_no_seeds_where_the_compiler_makes_no_triton(caplog):
    gen = load_generator("inductor")
    path = REPO / "tasks" / "vllm_torch" / "rms_norm.py"
    with caplog.at_level("INFO"):
        assert gen.initial_candidates(_ctx(path, "vllm_torch", "ascend")) == []
    assert "target ascend: no seeds" in gen.reasons[0]
    assert "target ascend: no seeds" in caplog.text


CONV_NORM_TASK = '''
    """A KernelBench-style layer with parameters and buffers: conv, batch norm, linear."""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, channels, out_channels, kernel_size):
            super().__init__()
            self.conv = nn.Conv2d(channels, out_channels, kernel_size, padding=1, bias=True)
            self.norm = nn.BatchNorm2d(out_channels)
            self.head = nn.Linear(width, 3)

        def forward(self, x):
            return self.head(torch.relu(self.norm(self.conv(x))))

    batch_size = 2
    channels = 3
    out_channels = 4
    kernel_size = 3
    width = 6

    def get_inputs():
        return [torch.randn(batch_size, channels, width, width)]

    def get_init_inputs():
        return [channels, out_channels, kernel_size]
'''


def test_model_with_parameters_gets_a_triton_seed_that_passes_on_cpu(tmp_path):
    """Conv, BatchNorm (with running buffers) and Linear: the seed rebuilds the layers in the
    ground truth's order (same values under the evaluator's seed), reads them with
    get_parameter/get_buffer, and computes conv and matmul in Triton (no extern call)."""
    path = tmp_path / "conv_bn_linear.py"
    path.write_text(textwrap.dedent(CONV_NORM_TASK))
    source, result = _seed_and_its_evaluation(path)
    assert "add_module('conv', nn.Conv2d(3, 4, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1)))" in source
    assert "self.get_buffer('norm.running_var')" in source and "self.get_parameter('head.weight')" in source
    assert "extern_kernels" not in source and "aten." not in source
    assert result.verdict == "pass", (result.reason, result.log[-2000:])
    assert result.launches >= 1


def _seed_and_its_evaluation(path: Path):
    """The inductor seed of a task at bench shapes on the cpu, and its verdict."""
    gen = load_generator("inductor")
    seeds = gen.initial_candidates(_ctx(path, "mini", "cpu", shapes="bench"))
    assert len(seeds) == 1, gen.reasons
    ref = taskfiles.TaskRef("mini", path.stem, path)
    spec = resolve_device("cpu")
    data = generate_reference(taskfiles.load_task(ref, "bench"), spec, seed=0)
    with Evaluator(ref, data, spec) as ev:
        return seeds[0].source, ev.evaluate(seeds[0].source, name=f"inductor_{path.stem}.py")


BIAS_TASK = '''
    """KernelBench level 2's habit: a torch.nn layer and a bare parameter drawn beside it."""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, channels, out_channels, bias_shape):
            super(Model, self).__init__()
            """not the docstring: a string statement in the body"""
            self.conv = nn.Conv2d(channels, out_channels, 3)
            self.bias = nn.Parameter(torch.randn(bias_shape) * 0.02)
            SETUP

        def forward(self, x):
            return torch.relu(self.conv(x)) + self.bias

    HELPER

    def get_inputs():
        return [torch.randn(2, 3, 6, 6)]

    def get_init_inputs():
        return [3, 4, (4, 1, 1)]
'''


def _bias_task(tmp_path: Path, setup: str = "pass", helper: str = "") -> Path:
    path = tmp_path / "conv_bias.py"
    path.write_text(textwrap.dedent(BIAS_TASK).replace("SETUP", setup).replace("HELPER", helper))
    return path


def test_bare_parameters_are_rebuilt_by_a_copy_of_the_ground_truths_init(tmp_path):
    """No torch.nn constructor call rebuilds `nn.Parameter(torch.randn(...))`; the ground truth's
    own __init__ body, copied, draws the same numbers under the evaluator's seed."""
    source, result = _seed_and_its_evaluation(_bias_task(tmp_path))
    assert "self.bias = nn.Parameter(torch.randn(bias_shape) * 0.02)" in source
    assert "super(Model" not in source and "self.get_parameter('bias')" in source
    assert result.verdict == "pass", (result.reason, result.log[-2000:])


@pytest.mark.parametrize("setup, helper, why", [
    ("self.scale = nn.Parameter(_scales())", "import numpy as np\n\ndef _scales():\n    return torch.from_numpy(np.ones(4))",
     "uses np from its module"),
    ("torch.seed()\n        self.noise = nn.Parameter(torch.randn(4))", "",
     "does not hold the ground truth's values"),
])
def test_bare_parameters_no_copy_can_rebuild_give_a_reason(tmp_path, setup, helper, why):
    path = _bias_task(tmp_path, setup, helper)
    gen = load_generator("inductor")
    assert gen.initial_candidates(_ctx(path, "mini", "cpu", shapes="bench")) == []
    assert "outside a torch.nn layer" in gen.reasons[0] and why in gen.reasons[0], gen.reasons


@pytest.mark.parametrize("name, reference, low, high", [
    ("tanh", "tanh", -20.0, 20.0), ("log1p", "log1p", -0.9, 50.0), ("expm1", "expm1", -30.0, 20.0)])
def test_interpreter_shims_compute_what_libdevice_does(tmp_path, name, reference, low, high):
    """Each shim that stands in for a libdevice function on the cpu target, run by the Triton
    interpreter, against torch's own function, over a range that crosses each shim's switch
    between series and closed form (fp32, the farm's fp32 tolerance)."""
    from farm.generators.inductor.kernels import INTERPRETER_SHIMS

    module = tmp_path / f"shim_{name}.py"
    module.write_text("import triton\nimport triton.language as tl\n\n" + INTERPRETER_SHIMS[name] + textwrap.dedent(f'''


        @triton.jit
        def apply(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(y_ptr + offs, libdevice_{name}(tl.load(x_ptr + offs, mask=mask)), mask=mask)
    '''))
    code = textwrap.dedent(f"""
        import importlib.util, sys, torch
        spec = importlib.util.spec_from_file_location("shim", {str(module)!r})
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        x = torch.cat([torch.linspace({low}, {high}, 900), torch.linspace(-0.02, 0.02, 124)])
        y = torch.empty_like(x)
        mod.apply[(1,)](x, y, x.numel(), BLOCK=1024)
        want = torch.{reference}(x.double()).float()
        assert torch.allclose(y, want, atol=1e-5, rtol=1e-4), (y - want).abs().max()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
