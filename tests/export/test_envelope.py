"""The verified envelope (built from checked cases, matched on every call), layer recognition by
behaviour, and the package name rules: in-process, no run, no virtualenv."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from farm.errors import FarmError
from farm.export import naming
from farm.export.package_envelope import describe, infer, outside, slower
from farm.export.package_layers import recognise

SPACE = {"dims": [{"name": "B", "low": 1, "high": 64}, {"name": "T", "low": 1, "high": 4096}]}


def _checked(batch: int, tokens: int, dtype=torch.float16):
    """A paged-attention-like call: an indptr of B + 1, a query of T tokens, a fixed table, a count."""
    inputs = [torch.zeros(batch + 1, dtype=torch.int32), torch.zeros(tokens, 8, dtype=dtype),
              torch.zeros(100, 4), tokens * 3, 1e-6]
    case = {"values": {"B": batch, "T": tokens}, "dtype": str(dtype).removeprefix("torch.")}
    return case, [describe(v) for v in inputs]


def test_infer_finds_affine_sizes_and_free_scalars():
    [sig] = infer(SPACE, [_checked(1, 1), _checked(7, 300), _checked(33, 4096)])
    indptr, query, table, count, eps = sig["inputs"]
    assert indptr["shape"] == [{"dim": "B", "a": 1, "b": 1}]
    assert query["shape"] == [{"dim": "T", "a": 1, "b": 0}, 8] and table["shape"] == [100, 4]
    assert count == {"kind": "scalar", "type": "int", "any": True} and eps["value"] == 1e-6


def test_outside_checks_ranges_relations_dtypes_and_fixed_sizes():
    envelope = {"space": SPACE, "signatures": infer(SPACE, [_checked(1, 1), _checked(7, 300), _checked(33, 4096),
                                                            _checked(2, 5, torch.bfloat16),
                                                            _checked(9, 17, torch.bfloat16)])}

    def call(batch, tokens, dtype=torch.float16, table=(100, 4), eps=1e-6, second=None):
        q = torch.zeros(tokens, 8, dtype=dtype)
        args = [torch.zeros(batch + 1, dtype=torch.int32), q, torch.zeros(*table), 5, eps]
        if second is not None:
            args.append(second)
        return outside(envelope, tuple(args))

    assert call(64, 1) == call(5, 4096) == call(3, 77, torch.bfloat16) == ""
    assert "B = 65, outside the verified 1..64" in call(65, 10)
    assert "T = 4097, outside the verified 1..4096" in call(1, 4097)
    assert "dtype float32, verified" in call(1, 10, torch.float32) and "verified dtypes: bfloat16, float16" in \
        call(1, 10, torch.float32)
    assert "input 2 dimension 0 is 101, verified 100" in call(1, 10, table=(101, 4))
    assert "input 4: 1e-05, verified 1e-06" in call(1, 10, eps=1e-5)
    assert "6 arguments, verified 5" in call(1, 10, second=1)
    assert outside(envelope, (torch.zeros(0, dtype=torch.int32),)) != ""
    loose = outside(envelope, (torch.zeros(500, dtype=torch.int32), torch.zeros(9999, 8, dtype=torch.float16),
                               torch.zeros(1, 1), 5, 0.1), loose=True)
    assert loose == ""  # KFARM_SHAPES=rank: ranks, types and dtypes only


def test_two_inputs_that_follow_one_dimension_must_agree():
    space = {"dims": [{"name": "T", "low": 1, "high": 100}]}
    checked = [({"values": {"T": t}, "dtype": None}, [describe(torch.zeros(t, 4)), describe(torch.zeros(t, 4))])
               for t in (1, 9, 100)]
    envelope = {"space": space, "signatures": infer(space, checked)}
    assert outside(envelope, (torch.zeros(5, 4), torch.zeros(5, 4))) == ""
    assert "gives T = 6, input 0 dimension 0 gave 5" in outside(envelope, (torch.zeros(5, 4), torch.zeros(6, 4)))


def test_a_size_no_dimension_explains_keeps_the_values_seen():
    space = {"dims": [{"name": "T", "low": 1, "high": 100}]}
    checked = [({"values": {"T": t}, "dtype": None}, [describe(torch.zeros(t * t))]) for t in (1, 3, 10)]
    [sig] = infer(space, checked)
    assert sig["inputs"][0]["shape"] == [{"one_of": [1, 9, 100]}]


def test_layers_are_recognised_by_behaviour_not_by_name():
    torch.manual_seed(0)
    x, w, b = torch.randn(5, 16), 1 + 0.1 * torch.randn(16), torch.randn(16)
    tol = {"float32": (1e-5, 1e-4)}
    rms = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) * w
    [found] = recognise([w, x], [1e-6], [rms], tol)  # the task takes (weight, x): the roles follow
    assert found["kind"] == "rms_norm" and found["forward"] == ["weight", "x"] and found["ranks"]["x"] == 2
    gemma = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) * (1 + w)
    assert recognise([x, w], [1e-6], [gemma], tol) == []  # (1 + weight) is another layer
    assert recognise([x, w, b], [1e-5], [F.layer_norm(x, (16,), w, b, 1e-5)], tol)[0]["kind"] == "layer_norm"
    g, u = torch.randn(5, 16), torch.randn(5, 16)
    assert recognise([g, u], [], [F.silu(g) * u], tol)[0]["forward"] == ["gate", "up"]
    assert recognise([u, g], [], [F.silu(g) * u], tol)[0]["forward"] == ["up", "gate"]
    assert recognise([x], [], [F.gelu(x, approximate="tanh")], tol)[0]["kind"] == "gelu_tanh"
    assert recognise([x], [], [torch.tanh(x)], tol) == []


@pytest.mark.parametrize("name, message", [
    ("json", "standard library"), ("os", "standard library"), ("torch", "an installed module has that name"),
    ("farm", "an installed module has that name"), ("Bad", "lower-case letters"),
])
def test_names_that_would_shadow_a_module_are_refused(name, message):
    with pytest.raises(FarmError, match=message):
        naming.package_name(name)


def test_the_default_name_is_stable_and_an_earlier_export_may_be_replaced(tmp_path, monkeypatch):
    assert naming.package_name(None) == naming.DEFAULT_NAME == "kfarm_kernels"
    earlier = tmp_path / "kf_old"
    earlier.mkdir()
    (earlier / "__init__.py").write_text(f'"""{naming.EXPORT_MARKER} (`farm export`)."""\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert naming.package_name("kf_old") == "kf_old"
    (earlier / "__init__.py").write_text('"""someone else\'s package"""\n')
    import importlib

    importlib.invalidate_caches()
    with pytest.raises(FarmError, match="an installed module has that name"):
        naming.package_name("kf_old")


def test_the_shapes_of_a_slower_case_go_to_the_original():
    # best.json's slower_cases, as farm export copies them into the envelope (issue 32)
    env = {"signatures": [], "slower": [{"label": "low", "shape": [[1, 300]], "speedup": 0.8}]}
    assert slower(env, (torch.zeros(1, 300),)) == "the low case [[1, 300]]: timed 0.80x the original"
    assert slower(env, (torch.zeros(2, 300),)) == "" and slower({"signatures": []}, (torch.zeros(1, 300),)) == ""


def test_interpreter_timings_route_no_size_to_the_original():
    """A slower case measured by the interpreter's host clock is no speed figure: only a compiled
    target's slower cases become the export's "slower" rule."""
    from farm.export.package import slower_rule

    meta = {"slower_cases": [{"label": "bench", "shape": [[300]], "speedup": 0.92, "time_ms": 1.0}]}
    assert slower_rule(meta, {"device_type": "cpu", "interpret": True}) == []
    assert slower_rule(meta, {"device_type": "cuda", "interpret": False}) == [
        {"label": "bench", "shape": [[300]], "speedup": 0.92}]
