"""Inductor seeds for what torch.compile compiles beyond nn layers (issue 34): tensors outside any
layer (plain tensor attributes), constant tables a helper computes (a cos/sin cache as a
non-persistent buffer), several outputs (a buffer or parameter returned as it is), and the
PyTorch truth of a Triton original.

Most tests are in-process and cheap (the copy of a constructor, the description of a capture);
one compiles a task holding all three kinds on the cpu target and runs its seed in the Triton
interpreter against the ground truth on fresh inputs."""

from __future__ import annotations

import textwrap
import types

import pytest
import torch
import torch.nn as nn

from farm.generators.base import Context
from farm.generators.inductor import capture
from farm.generators.inductor.constructor import copied_init
from farm.generators.inductor.generator import InductorGenerator
from farm.generators.inductor.layers import Unsupported, state_layers, tensor_state
from tests.generators.test_inductor import run_in_interpreter

# rotary embedding, gelu_and_mul_sparse and fused_add_rms_norm of vLLM's torch ops, in small
TASK = '''
    """A Model with a plain tensor attribute, a cos/sin table computed by helpers, several outputs."""
    import math
    import torch
    import torch.nn as nn

    BASE = 10000.0


    def inv_freq(dim, base=BASE):
        return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)


    class Model(nn.Module):
        def __init__(self, dim: int, positions: int, sparsity: float):
            super().__init__()
            self.dim = dim
            self.positions = positions
            self.cutoff = torch.distributions.normal.Normal(0, 1).icdf(torch.tensor(sparsity))
            self.register_buffer("cos_sin", self._table(), persistent=False)
            self.weight = torch.ones(dim)

        def _table(self) -> torch.Tensor:
            freqs = torch.einsum("i,j -> ij", torch.arange(self.positions, dtype=torch.float), inv_freq(self.dim))
            return torch.cat((freqs.cos(), freqs.sin()), dim=-1) * math.sqrt(1.0)

        def forward(self, pos, x):
            cos, sin = self.cos_sin.index_select(0, pos).chunk(2, dim=-1)
            x1, x2 = x.chunk(2, dim=-1)
            rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
            gated = torch.relu(rot - rot.mean(-1, keepdim=True) * self.cutoff) * self.weight
            return gated, self.cos_sin, (rot, x.shape[-1])


    def get_inputs():
        return [torch.randint(0, 16, (6,)), torch.randn(6, 8)]


    def get_init_inputs():
        return [8, 16, 0.5]
'''


def _module(tmp_path, text: str = TASK, name: str = "mixed") -> types.ModuleType:
    """The task file executed as a module (inspect.getsource needs the file)."""
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    spec = importlib.util.spec_from_file_location(f"farm_test_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _built(module, seed: int = 0):
    torch.manual_seed(seed)
    return module.Model(*module.get_init_inputs())


def test_every_tensor_a_module_holds_is_state(tmp_path):
    """Non-persistent buffers are in no state_dict and plain attributes in no named_buffers: a
    seed built from either would lack them (rotary's cos/sin cache, gelu_and_mul_sparse's cutoff)."""
    model = _built(_module(tmp_path))
    state = tensor_state(model)
    assert {k: kind for k, (kind, _) in state.items()} == {"cos_sin": "buffer", "cutoff": "attr", "weight": "attr"}
    with pytest.raises(Unsupported, match="plain tensor attributes"):
        state_layers(model, "Model", 0)


def test_the_copied_constructor_brings_its_helpers_and_rebuilds_every_tensor(tmp_path):
    module = _module(tmp_path)
    model = _built(module)
    copy = copied_init(module.Model, model, module.get_init_inputs(), 0)
    assert "cache = self._table()" not in copy["body"] and "self.register_buffer('cos_sin', self._table(), " \
        "persistent=False)" in copy["body"]
    assert [m.split("(")[0] for m in copy["methods"]] == ["def _table"]
    assert copy["module"] == ["BASE = 10000.0", "def inv_freq(dim, base=BASE):\n    return 1.0 / base ** "
                              "(torch.arange(0, dim, 2, dtype=torch.float) / dim)"]
    assert copy["imports"] == ["import math", "import torch"]
    assert copy["methods"][0].startswith("def _table(self):")  # annotations dropped: no typing in a candidate


@pytest.mark.parametrize("helper, why", [
    ("import numpy as np\n\ndef inv_freq(dim, base=BASE):\n    return torch.from_numpy(np.ones(dim // 2))",
     "uses np from its module"),
    ("STATE = [0]\n\ndef inv_freq(dim, base=BASE):\n    return torch.ones(dim // 2) * len(STATE)",
     "uses STATE from its module"),
])
def test_a_helper_that_cannot_be_copied_is_named(tmp_path, helper, why):
    text = TASK.replace(
        "    def inv_freq(dim, base=BASE):\n        return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)",
        textwrap.indent(helper, "    "))
    module = _module(tmp_path, text, "helper")
    with pytest.raises(Unsupported, match=why):
        copied_init(module.Model, _built(module), module.get_init_inputs(), 0)


def test_outputs_that_are_the_modules_own_tensors_are_described(tmp_path):
    """A forward that returns its table (or a parameter) as it is: the output is neither a graph
    output nor a forward input, but a tensor the candidate holds too."""
    module = _module(tmp_path)
    model = _built(module)
    pos, x = module.get_inputs()
    out = model(pos, x)
    gated, rot = out[0], out[2][0]
    call = {"args": [model.cos_sin, pos, x, model.cutoff, model.weight], "result": (gated, rot)}
    task = types.SimpleNamespace()
    desc = capture._describe(task, module.Model, module.get_init_inputs(), [pos, x], [pos, x], call, out, model)
    assert desc["graph_inputs"] == [{"buffer": "cos_sin"}, 0, 1, {"attr": "cutoff"}, {"attr": "weight"}]
    assert desc["outputs"]["sources"] == [{"ref": ["ret", 0]}, {"ref": ["buffer", "cos_sin"]}, {"ref": ["ret", 1]}]


def test_plain_values_that_depend_on_the_inputs_are_no_constants():
    class Mean(nn.Module):
        def forward(self, x):
            return x * 2, x.mean().item(), x.shape[0]

    model = Mean()
    with pytest.raises(Unsupported, match="depend on its inputs"):
        capture._same_constants((torch.ones(4), 0.25, 4), model, lambda: [torch.ones(4)])
    capture._same_constants((torch.ones(4), 1.0, 4), model, lambda: [torch.ones(4)])
    capture._same_constants((torch.ones(4), None), model, lambda: pytest.fail("no plain value: no second draw"))


def test_a_seed_for_all_three_passes_fresh_inputs_in_the_interpreter(tmp_path):
    """The whole path on the cpu target: capture, assembly (copied constructor, helpers at module
    level, the table method in ModelNew, outputs read from the module) and a run against the
    ground truth on fresh inputs."""
    path = tmp_path / "mixed.py"
    path.write_text(textwrap.dedent(TASK))
    gen = InductorGenerator(timeout_s=300)
    seeds = gen.initial_candidates(Context(task_code=path.read_text(), op="mixed", source="mini", target="cpu",
                              device={"shapes": "bench"}))
    assert len(seeds) == 1, gen.reasons
    source = seeds[0].source
    assert "def inv_freq(dim, base=BASE):" in source and "    def _table(self):" in source
    assert "self.cutoff" in source and "self.get_buffer('cos_sin')" in source
    run_in_interpreter(source, gen.captures[0], tmp_path, seeds=(1, 2), task=path)


def test_no_pytorch_truth_no_capture():
    """A Triton Model in reference-data mode: the generator says why without starting a child."""
    gen = InductorGenerator()
    ctx = Context(task_code="", op="x", source="sglang", target="cpu", device={"mode": "reference-data"})
    assert gen.initial_candidates(ctx) == [] and "no PyTorch truth" in gen.reasons[0]
