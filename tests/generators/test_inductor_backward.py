"""inductor seeds for training ops: forward and backward kernels in one differentiable candidate,
or no seed with the reason; never a forward-only seed for a BACKWARD task."""

from pathlib import Path

from farm.corpus import tasks as taskfiles
from farm.evaluate.evaluator import EvalSettings, Evaluator
from farm.generators.base import Context
from farm.generators.inductor import backward as bwd
from farm.generators.inductor.generator import InductorGenerator
from farm.reference.generate import generate_reference
from farm.targets import resolve_device

REPO = Path(__file__).resolve().parents[2]


def _seeds(op_path: Path, op: str):
    gen = InductorGenerator()
    ctx = Context(task_code=op_path.read_text(), op=op, source="training", target="cpu",
                  device={"shapes": "small"})
    return gen, gen.initial_candidates(ctx)


def test_declarations_are_read_without_running_the_file():
    assert bwd.declared_backward("BACKWARD = True\nGRAD_INPUTS = (0, 2)\n") == (True, (0, 2))
    assert bwd.declared_backward("import os\nBACKWARD = os.environ\n") == (False, None)


def test_a_training_op_gets_a_differentiable_seed_that_passes_forward_and_backward():
    path = REPO / "tasks" / "training" / "swiglu.py"
    gen, seeds = _seeds(path, "swiglu")
    assert len(seeds) == 1, gen.reasons
    assert "torch.autograd.Function" in seeds[0].source and "bwd_triton_" in seeds[0].source
    ref = taskfiles.TaskRef("training", "swiglu", path)
    spec = resolve_device("cpu")
    data = generate_reference(taskfiles.load_task(ref, "small"), spec, seed=0)
    settings = EvalSettings.for_device(spec)
    settings.timing.update(budget_ms=50.0, min_reps=2, max_reps=3)
    with Evaluator(ref, data, spec, settings) as ev:
        result = ev.evaluate(seeds[0].source)
    assert result.verdict == "pass", result.reason
    assert result.backward["verified"] and result.backward["kernels"][0].startswith("bwd_triton_")


def test_a_training_op_whose_backward_cannot_be_captured_gets_no_seed_at_all(tmp_path):
    path = tmp_path / "argmax_op.py"
    path.write_text('''
import torch, torch.nn as nn
BACKWARD = True
SMALL_SHAPES = {}
class Model(nn.Module):
    def forward(self, x):
        return x * 2.0, x.argmax(dim=-1)
def get_inputs():
    return [torch.randn(4, 16)]
def get_init_inputs():
    return []
''')
    gen, seeds = _seeds(path, "argmax_op")
    assert seeds == []
    assert any("BACKWARD" in r and "backward could not be captured" in r for r in gen.reasons), gen.reasons
