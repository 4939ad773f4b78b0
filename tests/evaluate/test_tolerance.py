"""Output comparison in chunks (farm.runtime.tolerance): the verdict and figures of a whole-tensor
float64 comparison, without a float64 copy of a multi-GiB output."""

import pytest
import torch

from farm.runtime import tolerance


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(tolerance, "CHUNK_ELEMENTS", 7)


def _check(a, e, tol=None):
    [check] = tolerance.compare_outputs([a], [e], tol)
    return check


def test_a_bad_element_in_a_later_chunk_is_found_and_counted(small_chunks):
    e = torch.linspace(-3, 3, 50)
    a = e.clone()
    a[33] += 1.0
    a[48] -= 0.5
    check = _check(a, e)
    assert not check.ok
    assert check.reason.startswith("2 of 50 elements outside")
    assert check.max_abs == pytest.approx(1.0)


def test_figures_over_chunks_equal_the_whole_tensor_figures(small_chunks, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    e = torch.randn(5, 13, generator=gen)
    a = e + 1e-3 * torch.randn(5, 13, generator=gen)
    chunked = _check(a, e, {"float32": (1e-3, 1e-3)})
    monkeypatch.setattr(tolerance, "CHUNK_ELEMENTS", 1 << 24)
    whole = _check(a, e, {"float32": (1e-3, 1e-3)})
    assert (chunked.ok, chunked.reason) == (whole.ok, whole.reason)
    assert chunked.max_abs == whole.max_abs and chunked.max_rel == whole.max_rel


def test_nan_and_inf_positions_are_checked_in_every_chunk(small_chunks):
    e = torch.zeros(30)
    a = e.clone()
    a[20] = float("nan")
    a[25] = float("nan")
    assert _check(a, e).reason == "NaN positions differ at 2 elements"
    a = e.clone()
    e2 = e.clone()
    e2[29] = float("inf")
    a[29] = float("-inf")
    assert _check(a, e2).reason == "Inf positions or signs differ"
    a[29] = float("inf")
    assert _check(a, e2).ok


def test_an_output_with_no_finite_value_matches_where_its_nans_match(small_chunks):
    e = torch.full((20,), float("nan"))
    assert _check(e.clone(), e).ok


def test_tensors_on_one_device_stay_there(monkeypatch):
    """Both on the same device: no copy to the host (a GPU bench compares there)."""
    moved = []
    real_cpu = torch.Tensor.cpu

    def spy(self, *args, **kwargs):
        moved.append(self.shape)
        return real_cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", spy)
    e = torch.ones(4)
    assert _check(e.clone(), e).ok
    assert moved == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_fast_verdict_is_the_float64_rule_element_by_element(dtype):
    """The comparison works in float32 for speed; each element's verdict is still the policy's
    |out - exp| <= atol + rtol * |exp| evaluated in float64, including at the boundary."""
    gen = torch.Generator().manual_seed(1)
    atol, rtol = tolerance.tolerance_for(dtype)
    e = (torch.randn(4000, generator=gen) * 3).to(dtype)
    bound = (atol + rtol * e.double().abs())
    scale = torch.tensor([0.5, 0.99, 1.0, 1.01, 2.0]).repeat(800).double()
    a = (e.double() + bound * scale * torch.sign(torch.randn(4000, generator=gen))).to(dtype)
    expected_bad = int(((a.double() - e.double()).abs() > atol + rtol * e.double().abs()).sum())
    for i in range(500):
        one = _check(a[i:i + 1], e[i:i + 1])
        want = bool((a[i].double() - e[i].double()).abs() <= atol + rtol * e[i].double().abs())
        assert one.ok == want, (i, float(a[i]), float(e[i]), one.reason)
    whole = _check(a, e)
    assert not whole.ok and whole.reason.startswith(f"{expected_bad} of 4000 elements outside")


def _rms_norm_through_fp16(x: torch.Tensor, weight: torch.Tensor, round_half: bool) -> torch.Tensor:
    """vLLM's RMSNorm.forward_native: fp16 input, fp32 weight and output, one fp16 rounding."""
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    if round_half:
        y = y.half()
    return y * weight


def test_an_fp32_output_of_fp16_inputs_is_held_to_the_fp16_tolerance():
    torch.manual_seed(0)
    x, weight = torch.randn(83, 2048, dtype=torch.float16), torch.ones(2048)
    eager = _rms_norm_through_fp16(x, weight, round_half=True)
    fused = _rms_norm_through_fp16(x, weight, round_half=False)  # a kernel that skips the rounding
    assert not _check(fused, eager).ok  # fp32's own tolerance calls it wrong
    widened = tolerance.through_inputs({}, [x.dtype, weight.dtype])
    [check] = tolerance.compare_outputs([fused], [eager], widened)
    assert check.ok, check.reason
    wrong = fused.clone()
    wrong[5, 7] += 0.05  # a real error is still one
    [check] = tolerance.compare_outputs([wrong], [eager], widened)
    assert not check.ok


def test_the_input_rule_keeps_a_tasks_own_tolerance_and_ignores_non_float_inputs():
    own = {"float32": (1e-6, 1e-6)}
    assert tolerance.through_inputs(own, ["torch.float16"], own)["float32"] == (1e-6, 1e-6)
    assert tolerance.through_inputs({}, ["torch.int64", None, "torch.bool"]) == {}
    assert tolerance.through_inputs({}, ["torch.float32"]) == {"float64": tolerance.DEFAULT_TOLERANCE["float32"]}
    # a profile's looser figure for the finer dtype stays where it is looser
    kb = {"float32": (1e-4, 1e-4)}
    assert tolerance.through_inputs(kb, ["torch.bfloat16"])["float32"] == tolerance.DEFAULT_TOLERANCE["bfloat16"]
