"""What the device itself costs: an empty Triton kernel (the launch floor), a large
device-to-device copy (the bandwidth) and a large matmul per dtype (the compute peak),
measured in the trusted runner. farm.evaluate.limits turns them into the limit beside every
figure."""

from __future__ import annotations

from typing import Any

import triton

from farm.evaluate import timing

COPY_BYTES = 1 << 30  # 1 GiB read + 1 GiB written: far above any cache


@triton.jit
def _empty_kernel(x_ptr):
    pass


def copy_bandwidth(timer: timing.DeviceTimer) -> float:
    """Bytes read + written per second by a flushed 1 GiB device-to-device copy."""
    torch = timer._torch
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=timer.spec.torch_device)
    dst = torch.empty_like(src)
    copy = timing.measure(lambda: dst.copy_(src), timer, min_reps=10, budget_ms=200)
    return 2 * COPY_BYTES / (copy.median_ms / 1e3)


PEAK_DTYPES = ("float16", "bfloat16", "float32")
PEAK_N = 8192  # 8192^3 matmul: 1.1 TFLOP, long enough to reach the peak on any current GPU


def peak_flops(timer: timing.DeviceTimer, dtype: str) -> float:
    """FLOP/s of a square matmul in `dtype` through the vendor library (float32 with TF32 on, as
    Triton's tl.dot computes float32 by default): what a perfect compute-bound kernel reaches."""
    torch = timer._torch
    dt = getattr(torch, dtype)
    gen = torch.Generator(device=timer.spec.torch_device)  # the runner's own random state stays untouched
    gen.manual_seed(0)
    a, b = (torch.randn(PEAK_N, PEAK_N, device=timer.spec.torch_device, generator=gen).to(dt) for _ in range(2))
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        run = timing.measure(lambda: torch.mm(a, b), timer, min_reps=5, budget_ms=200)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return 2 * PEAK_N**3 / (run.median_ms / 1e3)


def device_floor(timer: timing.DeviceTimer, modes: tuple[str, ...] = ("events", "graph")) -> dict:
    """{"copy_bw_bytes_s": ..., "empty_kernel_ms": {mode: ms}, "peak_flops": {dtype: FLOP/s}}
    for this runner's device (no peak where the target has no matmul worth the name: cpu)."""
    target = timer.spec.target
    out: dict[str, Any] = {"copy_bw_bytes_s": copy_bandwidth(timer), "empty_kernel_ms": {}, "peak_flops": {}}
    if target.compute_peaks:
        out["peak_flops"] = {dtype: peak_flops(timer, dtype) for dtype in PEAK_DTYPES}
    buf = timer._torch.empty(1, device=timer.spec.torch_device)

    def launch():
        _empty_kernel[(1,)](buf)

    if "events" in modes:
        out["empty_kernel_ms"]["events"] = timing.measure(launch, timer, min_reps=20, budget_ms=100).median_ms
    if "graph" in modes and target.graphs:
        calls = 100
        graph = timing.capture_graph([launch] * calls, timer)
        out["empty_kernel_ms"]["graph"] = sorted(timing.graph_samples(graph, calls, 20, timer))[10]
    return out
