"""Inductor seeds over an op's shape space: inductor compiles for one shape (dynamic=False), so
the generator compiles the ground truth at each recorded case of the space too, and the seed
dispatches on its inputs' shapes (farm.generators.inductor.dispatch). Without that, the seed
failed at the first case other than the benchmark one (issue 32)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
import torch

from farm.corpus import tasks as taskfiles
from farm.evaluate.evaluator import Evaluator
from farm.generators import load_generator
from farm.generators.base import Context
from farm.reference.generate import generate_reference_and_sets
from farm.targets import resolve_device

# a reduction over a fixed last dim, the row count varies; a weight the seed rebuilds
ROW_NORM = '''
    """Rows scaled by their root mean square, times a weight."""
    import torch
    import torch.nn as nn

    M = 6
    SHAPE_SPACE = {"M": (1, 40)}

    class Model(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(k))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    def get_inputs():
        return [torch.randn(M, 32)]

    def get_init_inputs():
        return [32]
'''

# a 3-D input whose leading dim varies, softmax over the middle one, and a second output
SOFTMAX_3D = '''
    """Softmax over the middle dim of a batch, and the batch's column sums."""
    import torch
    import torch.nn as nn

    BATCH = 4
    SHAPE_SPACE = {"BATCH": (1, 24)}

    class Model(nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=1), x.sum(0)

    def get_inputs():
        return [torch.randn(BATCH, 5, 8)]

    def get_init_inputs():
        return []
'''


def _seed_and_evaluation(tmp_path: Path, text: str, name: str):
    """The op's reference data with 2 cases of its space (1 and a prime), the inductor seed made
    with those cases (as the search passes them), and the evaluator's verdict on it."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    ref = taskfiles.TaskRef("mini", name, path)
    spec = resolve_device("cpu")
    data, _, case_doc = generate_reference_and_sets(taskfiles.load_task(ref, "bench"), spec, 0, cases=2)
    data["_case_sets"] = case_doc["cases"]
    points = [doc["case"] for doc in case_doc["cases"]]
    ctx = Context(task_code=path.read_text(), op=name, source="mini", target="cpu",
                  device={"shapes": "bench", "cases": points})
    gen = load_generator("inductor")
    seeds = gen.initial_candidates(ctx)
    assert len(seeds) == 1, gen.reasons
    assert "dynamic=False per case: 3 kernel sets" in seeds[0].note  # the benchmark case and the two
    with Evaluator(ref, data, spec) as ev:
        result = ev.evaluate(seeds[0].source, name=f"inductor_{name}.py")
    return seeds[0].source, points, result


@pytest.mark.parametrize(("text", "name", "dim", "other"), [
    (ROW_NORM, "row_norm", "M", (5, 32)),
    (SOFTMAX_3D, "softmax_3d", "BATCH", (2, 5, 8)),
])
def test_an_inductor_seed_is_right_at_every_case_of_the_space(tmp_path, text, name, dim, other):
    source, points, result = _seed_and_evaluation(tmp_path, text, name)
    sizes = sorted(p["values"][dim] for p in points)
    assert sizes[0] == 1 and sizes[1] > 1 and all(sizes[1] % d for d in range(2, sizes[1]))  # 1 and a prime
    assert result.verdict == "pass", (result.reason, result.log[-2000:])
    assert result.verified["cases"] == 2 and sorted(result.verified["case_labels"]) == ["low", "prime"]
    assert "_forward_1" in source and "_forward_2" in source and "c1_triton_" in source
    # a shape no case has: refused by the dispatch, before any kernel runs
    cand = tmp_path / f"cand_{name}.py"
    cand.write_text(source)
    spec = importlib.util.spec_from_file_location(f"farm_test_{name}", cand)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.ModelNew(*([32] if name == "row_norm" else []))
    with pytest.raises(AssertionError, match="compiled for the inputs of 3 recorded cases"):
        model(torch.randn(*other))
