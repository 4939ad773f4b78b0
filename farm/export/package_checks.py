"""Checking outputs in an exported package's tests (copied into it as `_checks.py`): a stored
seed set, and the farm's tolerance policy. Imports nothing of Kernel Farm."""

from __future__ import annotations

from pathlib import Path

import torch

from farm.export.package_runtime import _to


def load_case(path: str | Path, device: str = "cpu") -> dict:
    """A stored seed set (the farm's .pt): inputs on `device`, expected outputs on the CPU."""
    data = torch.load(path, weights_only=True)
    return {"inputs": _to(list(data["inputs"]), device), "outputs": list(data["outputs"]),
            "init_inputs": list(data.get("init_inputs", [])), "seed": data.get("seed")}


def as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_outputs(actual, expected, tolerance: dict) -> None:
    """Assert the farm's tolerance policy: same structure, dtype and shape; floats within
    atol + rtol*|expected| with equal NaN/Inf positions; integers and bools exact."""
    actual, expected = as_list(actual), as_list(expected)
    assert len(actual) == len(expected), f"{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        _check_one(str(i), a, e, tolerance)


def _check_one(where: str, a, e, tolerance: dict) -> None:
    if isinstance(e, (list, tuple)):
        assert isinstance(a, (list, tuple)) and len(a) == len(e), f"output {where}: expected {len(e)} items"
        for j, (x, y) in enumerate(zip(a, e)):
            _check_one(f"{where}.{j}", x, y, tolerance)
        return
    if not isinstance(e, torch.Tensor):
        if isinstance(e, float) and isinstance(a, (int, float)):
            assert abs(a - e) <= 1e-6 * max(abs(e), 1e-12) or a == e, f"output {where}: {a!r} != {e!r}"
        else:
            assert a == e, f"output {where}: {a!r} != {e!r}"
        return
    assert isinstance(a, torch.Tensor), f"output {where}: expected a tensor, got {type(a).__name__}"
    assert a.dtype == e.dtype, f"output {where}: dtype {a.dtype}, expected {e.dtype}"
    assert a.shape == e.shape, f"output {where}: shape {list(a.shape)}, expected {list(e.shape)}"
    a, e = a.detach().cpu(), e.detach().cpu()
    if not e.is_floating_point():
        bad = int((a != e).sum())
        assert bad == 0, f"output {where}: {bad} of {e.numel()} elements differ (exact dtype {e.dtype})"
        return
    atol, rtol = tolerance.get(str(e.dtype).removeprefix("torch."), tolerance.get("float32", (1e-5, 1e-4)))
    a64, e64 = a.double(), e.double()
    assert torch.equal(torch.isnan(a64), torch.isnan(e64)), f"output {where}: NaN positions differ"
    inf = torch.isinf(e64)
    assert torch.equal(torch.isinf(a64), inf) and torch.equal(a64[inf], e64[inf]), f"output {where}: Inf differs"
    finite = torch.isfinite(e64)
    err = (a64[finite] - e64[finite]).abs()
    bound = atol + rtol * e64[finite].abs()
    bad = int((err > bound).sum())
    worst = float(err.max()) if err.numel() else 0.0
    assert bad == 0, (f"output {where}: {bad} of {int(finite.sum())} elements outside atol={atol} rtol={rtol} "
                      f"(max abs error {worst:.3g})")
