"""Derived small shapes, config shapes, the meta-device memory guard and natural op order,
on KernelBench-style files written here (never copied)."""

from __future__ import annotations

import json
import textwrap

import pytest

from farm.config import Settings
from farm.corpus import shapes as shapes_mod
from farm.corpus import tasks as taskfiles
from farm.corpus.opcheck import draw_init_inputs, draw_inputs
from farm.errors import TaskError

# full size: 2 x 8192 x 8192 fp32 inputs (1 GiB), a 2-D conv with groups; no SMALL_SHAPES
LARGE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, groups=groups)

    def forward(self, x, y):
        return self.conv(x + y)


batch_size = 64
in_channels = 48
out_channels = 96
kernel_size = 3
groups = 3
height = 512
width = 512


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width), torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups]
'''

AXIS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.softmax(x, dim=self.dim)


batch_size = 4096
features = 4096
dim = 1


def get_inputs():
    return [torch.rand(batch_size, features)]


def get_init_inputs():
    return [dim]
'''


def _ref(tmp_path, body, name="big", source="kb", settings=None):
    folder = tmp_path / source
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return taskfiles.ref_from_file(path, source, settings=settings)


def test_derived_shapes_fit_the_budget_and_keep_divisibility(tmp_path):
    ref = _ref(tmp_path, LARGE)
    full = shapes_mod.measure(taskfiles.load_task(ref, "bench").module, taskfiles.load_task(ref, "bench").model_cls)
    assert full.total_bytes > 2**30  # the file's own shapes: over 1 GiB of inputs
    task = taskfiles.load_task(ref, "small")
    assert task.shape_origin == "derived"
    over = task.shape_overrides
    assert "kernel_size" not in over and "groups" not in over  # structural constants stay
    assert over["in_channels"] % 3 == 0 and over["out_channels"] % 3 == 0  # divisible by groups
    assert all(v >= 1 for v in over.values())
    small = shapes_mod.measure(task.module, task.model_cls)
    assert small.total_bytes <= ref.policy.small_budget_mb * 2**20
    x, y = draw_inputs(task, 0)
    assert list(x.shape) == [over.get("batch_size", 64), over["in_channels"], over["height"], over["width"]]
    out = task.model_cls(*draw_init_inputs(task, 0))(x, y)
    assert out.shape[1] == over["out_channels"]


def test_axis_constants_are_not_sizes(tmp_path):
    task = taskfiles.load_task(_ref(tmp_path, AXIS, "softmax"), "small")
    assert task.shape_origin == "derived" and "dim" not in task.shape_overrides
    assert task.module.dim == 1


def test_budget_setting_and_config_shapes(tmp_path):
    folder = tmp_path / "kb"
    _ref(tmp_path, LARGE)
    s = Settings()
    s.corpus.sources = {"kb": str(folder)}
    s.corpus.small_budget_mb = 64.0
    s.corpus.small_budget_mflop = 1000.0
    [ref] = taskfiles.find_tasks(s, ["kb"])
    roomy = taskfiles.load_task(ref, "small")
    default = taskfiles.load_task(_ref(tmp_path, LARGE), "small")
    assert roomy.shape_overrides["height"] > default.shape_overrides["height"]

    s.corpus.shapes = {"kb": {"batch_size": 2, "not_in_this_file": 3},  # source-wide: unknown names skipped
                       "kb/big": {"height": 10, "width": 12, "in_channels": 6, "out_channels": 6}}
    [ref] = taskfiles.find_tasks(s, ["kb"])
    task = taskfiles.load_task(ref, "small")
    assert task.shape_origin == "config"
    x, _ = draw_inputs(task, 0)
    assert list(x.shape) == [2, 6, 10, 12]

    s.corpus.shapes = {"kb/big": {"missing": 1}}
    [ref] = taskfiles.find_tasks(s, ["kb"])
    with pytest.raises(TaskError, match="'missing' .*corpus.shapes.kb/big"):
        taskfiles.load_task(ref, "small")


def test_small_never_means_full_size_over_budget(tmp_path):
    # nothing the derivation may scale: the task says so instead of running at full size
    body = LARGE.replace("batch_size = 64", "").replace("torch.rand(batch_size,", "torch.rand(64,")
    body = body.replace("height = 512\nwidth = 512\n", "").replace("height, width)", "512, 512)")
    body = body.replace("in_channels = 48\nout_channels = 96\n", "")
    body = body.replace("return [in_channels, out_channels, kernel_size, groups]", "return [48, 96, kernel_size, groups]")
    body = body.replace("torch.rand(64, in_channels,", "torch.rand(64, 48,")
    ref = _ref(tmp_path, body, "fixed")
    with pytest.raises(TaskError, match="has no small shapes.*no module-level size constant"):
        taskfiles.load_task(ref, "small")


def test_meta_guard_stops_before_allocating(tmp_path):
    s = Settings()
    s.corpus.memory_limit_mb = 256.0
    ref = _ref(tmp_path, LARGE, settings=s)
    task = taskfiles.load_task(ref, "bench")
    with pytest.raises(TaskError, match=r"needs .*GiB .* at bench shapes \(measured on the meta device\), over the "
                                        r"memory limit of 0\.25 GiB"):
        draw_init_inputs(task, 0)
    # the small shapes of the same file pass the same guard
    small = taskfiles.load_task(ref, "small")
    assert draw_inputs(small, 0)[0].numel() > 0


def test_ops_check_reports_the_guard_and_the_shape_origin(tmp_path, cli):
    folder = tmp_path / "kb"
    _ref(tmp_path, LARGE)
    _ref(tmp_path, AXIS, "softmax")
    config = tmp_path / "farm.yaml"
    config.write_text(f"corpus:\n  sources:\n    kb: {folder}\n  memory_limit_mb: 256\n")
    result = cli("--config", config, "ops", "check", "--source", "kb", "--device", "cpu", "--shapes", "bench", "--json")
    rows = {r["op"]: r for r in json.loads(result.stdout)["results"]}
    assert rows["big"]["status"] == "error" and "over the memory limit" in rows["big"]["error"]
    result = cli("--config", config, "ops", "check", "--source", "kb", "--device", "cpu", "--json")
    rows = {r["op"]: r for r in json.loads(result.stdout)["results"]}
    assert rows["big"]["status"] == "pass" and rows["big"]["shape_origin"] == "derived", rows["big"]
    assert rows["softmax"]["shape_origin"] == "derived"


def test_natural_order_of_op_names(tmp_path):
    folder = tmp_path / "kb"
    for name in ("100_HingeLoss", "10_mm", "1_square", "2_standard"):
        _ref(tmp_path, AXIS, name)
    (folder / "_private.py").write_text(AXIS)  # an op too: AKG names ops after private kernels (_compute_pid)
    s = Settings()
    s.corpus.sources = {"kb": str(folder)}
    assert [r.op for r in taskfiles.find_tasks(s, ["kb"])] == ["1_square", "2_standard", "10_mm", "100_HingeLoss",
                                                            "_private"]


def test_the_meta_forward_never_launches_a_triton_kernel(tmp_path):
    """A meta tensor's data_ptr() is 0: on a GPU the launch is an illegal memory access that
    breaks the process's CUDA context (every Triton op then failed reference generation on an
    H100). The guard's forward refuses the launch and records why; Triton works again after."""
    import torch
    import triton.runtime.interpreter as interpreter
    import triton.runtime.jit as jit

    from tests.conftest import GOOD_TASK

    before = (vars(jit.JITFunction)["run"], vars(interpreter.InterpretedFunction)["run"])
    task = taskfiles.load_task(_ref(tmp_path, GOOD_TASK, name="scale2", source="mini"), "bench")
    fp = shapes_mod.measure(task.module, task.model_cls)
    assert not fp.forward_ok and "not launched on the meta device" in fp.forward_error
    assert (vars(jit.JITFunction)["run"], vars(interpreter.InterpretedFunction)["run"]) == before
    x = torch.randn(100)
    assert torch.equal(task.model_cls()(x), x * 2.0)  # launches work again outside the guard
