"""The kernelbench evaluation profile beside the farm's default, on a KernelBench-style
PyTorch-only task written here; and the verdict of candidates that are not Triton kernels."""

from __future__ import annotations

import textwrap

import pytest

from farm.corpus import tasks as taskfiles
from farm.evaluate import profiles, static_checks
from farm.evaluate.evaluator import EvalSettings, Evaluator
from farm.reference.generate import generate_reference
from farm.search.batch import summarize
from farm.targets import resolve_device

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 0.01


n = 64


def get_inputs():
    return [torch.randn(n)]


def get_init_inputs():
    return []
'''

# off by 5e-5 on outputs of about 0.01: inside KernelBench's fp32 1e-4, outside the farm's 1e-5
OFF_BY_5E5 = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 0.01 + 5e-5, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _k[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
        return y
'''

LOAD_INLINE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

scale = load_inline(name="scale", cpp_sources="torch::Tensor scale(torch::Tensor x);",
                    cuda_sources="...", functions=["scale"])


class ModelNew(nn.Module):
    def forward(self, x):
        return scale.scale(x)
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kb")
    path = folder / "scale.py"
    path.write_text(textwrap.dedent(TASK))
    ref = taskfiles.ref_from_file(path, "kb")
    spec = resolve_device("cpu")
    return ref, generate_reference(taskfiles.load_task(ref, "bench"), spec, seed=0), spec


def test_profiles_side_by_side():
    farm, kb = profiles.get("farm"), profiles.get("kernelbench")
    assert kb.tolerance == {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (1e-2, 1e-2)}
    assert farm.tolerance == {} and farm.fresh_inputs == 2 and not farm.derived_seeds
    assert kb.fresh_inputs == 5 and kb.derived_seeds and kb.statistic == "mean_ms"
    assert kb.timing["min_reps"] == kb.timing["max_reps"] == 100
    seeds = [profiles.trial_seed(0, i) for i in range(5)]
    assert len(set(seeds)) == 5 and seeds == [profiles.trial_seed(0, i) for i in range(5)]
    assert seeds != [profiles.trial_seed(1, i) for i in range(5)]
    with pytest.raises(Exception, match="unknown evaluation profile 'kb'"):
        profiles.get("kb")


def test_kernelbench_tolerance_and_five_trials(setup):
    ref, data, spec = setup
    with Evaluator(ref, data, spec, EvalSettings.for_device(spec, "kernelbench")) as ev:
        result = ev.evaluate(OFF_BY_5E5)
        assert result.verdict == "pass", (result.reason, result.log[-1500:])
        assert result.seeds_checked == 5
    with Evaluator(ref, data, spec, EvalSettings.for_device(spec)) as ev:
        result = ev.evaluate(OFF_BY_5E5)
    assert result.verdict == "mismatch" and "against the reference data" in result.reason


def test_fast_p_in_the_summary():
    rows = [{"status": "succeeded", "speedup_vs_model": 2.5}, {"status": "succeeded", "speedup_vs_model": 0.8},
            {"status": "zero_pass"}, {"status": "failed"}]
    kb = summarize(rows, "kernelbench")
    assert (kb["fast_0"], kb["fast_1"], kb["fast_2"]) == (0.5, 0.25, 0.25)
    assert "fast_0" not in summarize(rows)


def test_non_triton_candidates_are_told_so(setup):
    verdict, reason = static_checks.static_verdict(textwrap.dedent(LOAD_INLINE))
    assert verdict == "cheat" and reason.startswith("not a Triton kernel")
    assert "load_inline" in reason and "PyTorch-only" not in reason
    plain = "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x * 0.01\n"
    assert static_checks.static_verdict(plain)[1].startswith("not a Triton kernel")
    ref, data, spec = setup
    unused = OFF_BY_5E5.replace("_k[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)\n        return y",
                                "return x * 0.01")
    with Evaluator(ref, data, spec) as ev:
        result = ev.evaluate(unused)
    assert result.verdict == "cheat" and result.reason.startswith("not a Triton kernel: no Triton kernel was launched")
