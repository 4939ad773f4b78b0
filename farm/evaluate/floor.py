"""What the device itself costs: an empty Triton kernel (the launch floor) and a large
device-to-device copy (the bandwidth), measured in the trusted runner in each timing mode.
farm.evaluate.speedup.physical_limit turns them into the limit beside every speedup."""

from __future__ import annotations

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


def device_floor(timer: timing.DeviceTimer, modes: tuple[str, ...] = ("events", "graph")) -> dict:
    """{"copy_bw_bytes_s": ..., "empty_kernel_ms": {mode: ms}} for this runner's device."""
    out = {"copy_bw_bytes_s": copy_bandwidth(timer), "empty_kernel_ms": {}}
    buf = timer._torch.empty(1, device=timer.spec.torch_device)

    def launch():
        _empty_kernel[(1,)](buf)

    if "events" in modes:
        out["empty_kernel_ms"]["events"] = timing.measure(launch, timer, min_reps=20, budget_ms=100).median_ms
    if "graph" in modes and timer.kind == "cuda":
        calls = 100
        graph = timing.capture_graph([launch] * calls, timer)
        out["empty_kernel_ms"]["graph"] = sorted(timing.graph_samples(graph, calls, 20, timer))[10]
    return out
