"""The tolerance policy: is an output the expected one?

Written down once and used everywhere (ops check, reference consumers, the evaluator):

- Count, kind, shape and dtype of every output must match; a candidate's output is never cast
  to make it match.
- Floating point: every finite element satisfies |out - exp| <= atol + rtol * |exp|, with
  (atol, rtol) by dtype below (a task's TOLERANCE overrides them). The defaults admit about
  two units in the last place of the dtype at magnitude 1, the spread of a different but
  correct accumulation order, and nothing more.
- An output is held to no finer a tolerance than the least precise floating input it was
  computed from (`through_inputs`): an fp32 output of fp16 inputs passes through fp16
  arithmetic in the original too (vLLM's RMSNorm: `fp16(x * rsqrt(var)) * fp32 weight`), so
  one correct kernel rounding once differently is one fp16 unit off, not a wrong kernel. A
  task's own TOLERANCE for a dtype is kept as written.
- NaN positions must be equal, and +Inf/-Inf positions (with their signs) must be equal.
- Integer and bool tensors: exactly equal.
- Plain Python outputs: ints, bools, strings and None exactly equal; floats within 1e-6 relative.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch at call time: `farm --help` and the light commands import this module without it
    import torch

DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    # dtype: (atol, rtol)
    "float64": (1e-9, 1e-7),
    "float32": (1e-5, 1e-4),
    "float16": (1e-3, 2e-3),  # fp16 ulp at 1.0 is 9.8e-4
    "bfloat16": (1e-2, 1.6e-2),  # bf16 ulp at 1.0 is 7.8e-3
}
PY_FLOAT_RTOL = 1e-6


@dataclass
class OutputCheck:
    index: str
    ok: bool
    kind: str  # "tensor", "scalar", "none"
    shape: list[int] | None = None
    dtype: str | None = None
    max_abs: float = 0.0
    max_rel: float = 0.0
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tolerance_for(dtype: torch.dtype, overrides: dict[str, tuple[float, float]] | None = None) -> tuple[float, float]:
    name = dtype_name(dtype)
    if overrides and name in overrides:
        return overrides[name]
    return DEFAULT_TOLERANCE.get(name, DEFAULT_TOLERANCE["float32"])


_EPS_ORDER = ("float64", "float32", "float16", "bfloat16")  # finest first


def through_inputs(tolerance: dict[str, tuple[float, float]] | None, input_dtypes: Any,
                   task_overrides: dict[str, tuple[float, float]] | None = None) -> dict[str, tuple[float, float]]:
    """`tolerance` with each finer floating dtype held to the coarsest floating input's
    tolerance; dtypes named in `task_overrides` (a task's TOLERANCE) are left as they are.
    `input_dtypes`: torch dtypes or their names ('torch.float16', 'float16')."""
    names = {str(d).removeprefix("torch.") for d in input_dtypes or ()}
    floats = [n for n in _EPS_ORDER if n in names]
    widened = dict(tolerance or {})
    if not floats:
        return widened
    coarsest = floats[-1]
    coarse = widened.get(coarsest, DEFAULT_TOLERANCE[coarsest])
    for name in _EPS_ORDER[:_EPS_ORDER.index(coarsest)]:
        if name in (task_overrides or {}):
            continue
        own = widened.get(name, DEFAULT_TOLERANCE[name])
        widened[name] = (max(own[0], coarse[0]), max(own[1], coarse[1]))
    return widened


def as_output_list(value: Any) -> list:
    """A forward's result as the list the .pt stores: a single output becomes [output]."""
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def compare_outputs(actual: list, expected: list, tolerance: dict | None = None) -> list[OutputCheck]:
    if len(actual) != len(expected):
        return [OutputCheck("*", False, "count", reason=f"{len(actual)} outputs, expected {len(expected)}")]
    checks: list[OutputCheck] = []
    for i, (a, e) in enumerate(zip(actual, expected)):
        checks.extend(_compare_one(str(i), a, e, tolerance))
    return checks


def _compare_one(index: str, a: Any, e: Any, tolerance: dict | None) -> list[OutputCheck]:
    import torch

    if isinstance(e, (list, tuple)):
        if not isinstance(a, (list, tuple)) or len(a) != len(e):
            return [OutputCheck(index, False, "sequence", reason=f"expected a sequence of {len(e)}, got {_kind(a)}")]
        out: list[OutputCheck] = []
        for j, (x, y) in enumerate(zip(a, e)):
            out.extend(_compare_one(f"{index}.{j}", x, y, tolerance))
        return out
    if isinstance(e, torch.Tensor):
        return [compare_tensor(index, a, e, tolerance)]
    return [_compare_scalar(index, a, e)]


def _kind(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)} {dtype_name(value.dtype)}"
    return type(value).__name__


def _compare_scalar(index: str, a: Any, e: Any) -> OutputCheck:
    kind = "none" if e is None else "scalar"
    if isinstance(e, float) and isinstance(a, (int, float)) and not isinstance(a, bool):
        if math.isnan(e) and math.isnan(a):
            return OutputCheck(index, True, kind)
        diff = abs(a - e)
        ok = diff <= PY_FLOAT_RTOL * max(abs(e), 1e-12) or a == e
        return OutputCheck(index, ok, kind, max_abs=diff, reason="" if ok else f"{a!r} != {e!r}")
    ok = type(a) is type(e) and a == e
    return OutputCheck(index, ok, kind, reason="" if ok else f"got {a!r} ({_kind(a)}), expected {e!r}")


def compare_tensor(index: str, a: Any, e: torch.Tensor, tolerance: dict | None = None) -> OutputCheck:
    import torch

    shape, dtype = list(e.shape), dtype_name(e.dtype)
    fail = lambda why: OutputCheck(index, False, "tensor", shape, dtype, reason=why)  # noqa: E731
    if not isinstance(a, torch.Tensor):
        return fail(f"expected a tensor, got {_kind(a)}")
    if a.dtype != e.dtype:
        return fail(f"dtype {dtype_name(a.dtype)}, expected {dtype}")
    if a.shape != e.shape:
        return fail(f"shape {list(a.shape)}, expected {shape}")
    # both on one device (a GPU bench, a runner): compared there, else both on the host
    a, e = a.detach(), e.detach()
    if a.device != e.device:
        a, e = a.cpu(), e.cpu()
    if not (e.is_floating_point() or e.is_complex()):
        mismatched = int((a != e).sum())
        ok = mismatched == 0
        diff = (a.long() - e.long()).abs().max().item() if (a.numel() and e.dtype != torch.bool) else float(mismatched)
        return OutputCheck(index, ok, "tensor", shape, dtype, max_abs=float(diff),
                           reason="" if ok else f"{mismatched} of {e.numel()} elements differ (exact dtype)")
    return _compare_float(index, a, e, tolerance)


# elements compared at once: float64 copies of a chunk, not of a multi-GiB output (KernelBench's
# shapes reach 1.6 G elements per output)
CHUNK_ELEMENTS = 1 << 24


def _compare_float(index: str, a: torch.Tensor, e: torch.Tensor, tolerance: dict | None) -> OutputCheck:
    import torch

    shape, dtype = list(e.shape), dtype_name(e.dtype)
    atol, rtol = tolerance_for(e.dtype, tolerance)
    a, e = a.reshape(-1), e.reshape(-1)
    # float32 is exact for the inputs of every narrower dtype, and its rounding of a difference
    # (2**-24 relative) is far below any tolerance: half the memory traffic of float64, which
    # made a comparison cost seconds per output of the training ops' shapes
    work = torch.float64 if e.dtype == torch.float64 else torch.float32
    n_bad = 0
    max_abs = max_rel = 0.0
    for start in range(0, e.numel(), CHUNK_ELEMENTS):
        ac, ec = a[start:start + CHUNK_ELEMENTS].to(work), e[start:start + CHUNK_ELEMENTS].to(work)
        ref = ec.abs()
        diff = (ac - ec).abs_()
        # equal values pass (Inf equal to Inf of the same sign), NaN where both are NaN passes;
        # a NaN anywhere else fails every comparison, and an expected Inf admits only itself
        good = ((diff <= ref.mul(rtol).add_(atol)) & ref.isfinite()) | (ac == ec)
        if ec.isnan().any() or ac.isnan().any():
            good |= ac.isnan() & ec.isnan()
        n_bad += int(good.numel() - good.sum())
        if n_bad:
            return _describe_failure(index, a, e, atol, rtol)
        diff.nan_to_num_(nan=0.0, posinf=0.0)  # an equal Inf pair gives NaN: no error
        max_abs = max(max_abs, float(diff.max()))
        # relative error is meaningful only where |exp| is above atol, the absolute term
        rel = torch.where(ref > atol, diff / ref, 0.0)
        max_rel = max(max_rel, float(rel.max()))
    return OutputCheck(index, True, "tensor", shape, dtype, max_abs=max_abs, max_rel=max_rel)


def _describe_failure(index: str, a: torch.Tensor, e: torch.Tensor, atol: float, rtol: float) -> OutputCheck:
    """The failing comparison again, element kinds apart, in float64: slow, and run only for a
    verdict that needs its reason."""
    import torch

    shape, dtype = list(e.shape), dtype_name(e.dtype)
    nan_differ = finite_n = n_bad = 0
    inf_differ = False
    max_abs = max_rel = 0.0
    for start in range(0, e.numel(), CHUNK_ELEMENTS):
        a64, e64 = a[start:start + CHUNK_ELEMENTS].double(), e[start:start + CHUNK_ELEMENTS].double()
        nan_differ += int((torch.isnan(a64) != torch.isnan(e64)).sum())
        inf_a, inf_e = torch.isinf(a64), torch.isinf(e64)
        inf_differ = inf_differ or not torch.equal(inf_a, inf_e) or not torch.equal(a64[inf_e], e64[inf_e])
        finite = torch.isfinite(e64)
        if nan_differ or inf_differ or not bool(finite.any()):
            continue
        diff = (a64 - e64).abs()[finite]
        ref = e64.abs()[finite]
        finite_n += diff.numel()
        max_abs = max(max_abs, float(diff.max()))
        big = ref > atol
        if bool(big.any()):
            max_rel = max(max_rel, float((diff[big] / ref[big]).max()))
        n_bad += int((diff > atol + rtol * ref).sum())
    if nan_differ:
        return OutputCheck(index, False, "tensor", shape, dtype, reason=f"NaN positions differ at {nan_differ} elements")
    if inf_differ:
        return OutputCheck(index, False, "tensor", shape, dtype, reason="Inf positions or signs differ")
    reason = f"{n_bad} of {finite_n} elements outside atol={atol:g} rtol={rtol:g}"
    return OutputCheck(index, False, "tensor", shape, dtype, max_abs=max_abs, max_rel=max_rel, reason=reason)


def all_ok(checks: list[OutputCheck]) -> bool:
    return bool(checks) and all(c.ok for c in checks)


def summarize(checks: list[OutputCheck]) -> dict[str, Any]:
    tensors = [c for c in checks if c.kind == "tensor"]
    return {
        "ok": all_ok(checks),
        "max_abs": max((c.max_abs for c in tensors), default=0.0),
        "max_rel": max((c.max_rel for c in tensors), default=0.0),
        "failures": [f"output {c.index}: {c.reason}" for c in checks if not c.ok],
    }
