"""The physical limit of an op on a device: the one definition the evaluator's verdicts, the
search's budget, the report and the benchmarks use (docs/evaluator.md, "The physical limit").

    limit = max(bytes in + out / measured copy bandwidth,
                FLOPs / measured peak for the op's dtype,
                one empty kernel in the timing mode)

The device's figures (copy bandwidth, empty kernel per timing mode, matmul peak per dtype) are
measured by farm.evaluate.floor in a trusted runner, once per device: in the process, and on
disk under the device's name and the torch/triton versions (FARM_CACHE_DIR, else
~/.cache/farm), so a later process, the report and the benchmarks read the same figures. On an
interpreted target (cpu) nothing is timed for real: no limit, and every caller says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from farm import paths

STOP_WITHIN = 1.1  # a search stops once its best is within this factor of the limit
NOT_MEANINGFUL = "no physical limit on an interpreted target: its timings are the interpreter's"
CACHE_VERSION = 2  # bump when what floor measures changes


def physical_limit(bytes_moved: int, floor: dict | None, mode: str, time_ms: float | None = None,
                   flops: int = 0, dtype: str | None = None) -> dict | None:
    """The fastest the op could run on this device in timing mode `mode`, and `fraction` =
    limit / measured time (1.0 = at the limit). None where the floor is unknown."""
    if not floor or not floor.get("copy_bw_bytes_s"):
        return None
    empty_ms = (floor.get("empty_kernel_ms") or {}).get(mode)
    if empty_ms is None:
        return None
    bw = floor["copy_bw_bytes_s"]
    parts = {"bandwidth": bytes_moved / bw * 1e3, "launch": empty_ms}
    peak = (floor.get("peak_flops") or {}).get(dtype or "")
    if flops and peak:
        parts["compute"] = flops / peak * 1e3
    bound = max(parts, key=lambda k: parts[k])
    out = {"bytes": int(bytes_moved), "copy_bw_bytes_s": bw, "bandwidth_ms": parts["bandwidth"],
           "empty_kernel_ms": empty_ms, "flops": int(flops), "dtype": dtype, "peak_flops": peak,
           "compute_ms": parts.get("compute"), "limit_ms": parts[bound], "bound": bound, "mode": mode}
    if time_ms:
        out["fraction"] = parts[bound] / time_ms
    return out


def headroom(time_ms: float | None, limit: dict | None) -> float | None:
    """time / limit (1.0 = at the limit; 3.0 = three times slower than the device allows)."""
    if not time_ms or not limit or not limit.get("limit_ms"):
        return None
    return time_ms / limit["limit_ms"]


def at_limit(time_ms: float | None, limit: dict | None, within: float = STOP_WITHIN) -> bool:
    room = headroom(time_ms, limit)
    return room is not None and room <= within


def op_work(task) -> tuple[int, str | None]:
    """(FLOPs of one forward as torch's flop counter counts them (matmuls, convolutions,
    attention), the dtype of the op's largest floating-point input), on the meta device: 0 and
    None where the forward does not run there (a Triton Model, data-dependent shapes)."""
    import torch

    from farm.corpus.shapes import measure

    try:
        module = task.module
        flops = measure(module, task.truth_cls).flops
        with torch.device("meta"):
            inputs = list(module.get_inputs())
    except Exception:  # noqa: BLE001 - no count is a limit without the compute term
        return 0, None
    floats = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not floats:
        return flops, None
    return flops, str(max(floats, key=lambda t: t.numel()).dtype).removeprefix("torch.")


# ---------------------------------------------------------------- the device's figures, cached


def cache_path() -> Path:
    return paths.cache_file("device-limits.json")


def device_key(device_name: str) -> str:
    import torch
    import triton

    return f"v{CACHE_VERSION}|{device_name}|torch {torch.__version__}|triton {triton.__version__}"


def cached_floor(device_name: str, measure: Callable[[], dict | None]) -> dict | None:
    """The device's floor from the disk cache, else measured (and written, best effort)."""
    key = device_key(device_name) if device_name else ""
    if key:
        found = _read().get(key)
        if isinstance(found, dict) and found.get("copy_bw_bytes_s"):
            return found
    floor = measure()
    if floor and key:
        _write(key, floor)
    return floor


def stored_floor(device_name: str) -> dict | None:
    """What an earlier measurement on this device kind left on disk, without measuring."""
    return _read().get(device_key(device_name))


def _read() -> dict[str, Any]:
    return paths.read_cache(cache_path())


def _write(key: str, value: dict) -> None:
    paths.write_cache(cache_path(), key, value)
