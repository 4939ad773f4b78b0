"""Output comparison in chunks (farm.runtime.compare): the verdict and figures of a whole-tensor
float64 comparison, without a float64 copy of a multi-GiB output."""

import pytest
import torch

from farm.runtime import compare


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 7)


def _check(a, e, tolerance=None):
    [check] = compare.compare_outputs([a], [e], tolerance)
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
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 1 << 24)
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
    atol, rtol = compare.tolerance_for(dtype)
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
