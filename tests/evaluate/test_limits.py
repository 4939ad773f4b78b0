"""The physical limit (farm.evaluate.limits): one definition of bytes over the copy bandwidth,
FLOPs over the dtype's peak and the empty kernel, and the device figures cached on disk."""

from __future__ import annotations

import textwrap
import types

import pytest

from farm.evaluate import limits

FLOOR = {"copy_bw_bytes_s": 3e12, "empty_kernel_ms": {"graph": 0.002, "events": 0.006},
         "peak_flops": {"bfloat16": 7e14, "float32": 4e14}}


def test_the_limit_is_the_largest_of_traffic_compute_and_launch():
    # 3 MB at 3 TB/s = 1 us, under a 2 us empty kernel: launch-bound
    lim = limits.physical_limit(3_000_000, FLOOR, "graph", 0.004)
    assert lim["bound"] == "launch" and lim["limit_ms"] == pytest.approx(0.002) and lim["fraction"] == pytest.approx(0.5)
    # the same op in per-call timing has a per-call launch floor
    assert limits.physical_limit(3_000_000, FLOOR, "events")["limit_ms"] == pytest.approx(0.006)
    # a 4096^3 bf16 GEMM: 137 GFLOP at 700 TFLOP/s = 196 us, far above its 100 MB of traffic
    flops = 2 * 4096**3
    lim = limits.physical_limit(100_000_000, FLOOR, "graph", 0.25, flops=flops, dtype="bfloat16")
    assert lim["bound"] == "compute" and lim["limit_ms"] == pytest.approx(flops / 7e14 * 1e3)
    # no peak for the dtype: the compute term is left out, not guessed
    lim = limits.physical_limit(100_000_000, FLOOR, "graph", flops=flops, dtype="float16")
    assert lim["bound"] == "bandwidth" and lim["compute_ms"] is None
    assert limits.physical_limit(1, None, "graph") is None  # cpu: none
    assert limits.physical_limit(1, FLOOR, "unknown-mode") is None


def test_headroom_and_the_stop_within_1_1x():
    lim = limits.physical_limit(3_000_000, FLOOR, "graph")
    assert limits.headroom(0.004, lim) == pytest.approx(2.0)
    assert limits.at_limit(0.0022, lim) and not limits.at_limit(0.0023, lim)
    assert limits.headroom(None, lim) is None and not limits.at_limit(0.001, None)


def test_the_ops_flops_and_dtype_are_counted_on_the_meta_device(tmp_path):
    path = tmp_path / "gemm.py"
    path.write_text(textwrap.dedent('''
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, a, b):
                return a @ b

        def get_inputs():
            return [torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, 16, dtype=torch.bfloat16)]

        def get_init_inputs():
            return []
    '''))
    import importlib.util

    spec = importlib.util.spec_from_file_location("farm_test_gemm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    task = types.SimpleNamespace(module=module, truth_cls=module.Model)
    assert limits.op_work(task) == (2 * 64 * 32 * 16, "bfloat16")
    assert limits.op_work(types.SimpleNamespace()) == (0, None)  # nothing to count: no compute term


def test_the_device_floor_is_measured_once_per_device_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_CACHE_DIR", str(tmp_path))
    calls = []

    def measure():
        calls.append(1)
        return dict(FLOOR)

    assert limits.cached_floor("NVIDIA H100 80GB HBM3", measure) == FLOOR
    assert limits.cached_floor("NVIDIA H100 80GB HBM3", measure) == FLOOR
    assert limits.stored_floor("NVIDIA H100 80GB HBM3") == FLOOR and len(calls) == 1
    assert limits.cached_floor("NVIDIA H200", measure) == FLOOR and len(calls) == 2
    assert limits.cached_floor("", lambda: None) is None  # an unnamed device is not cached
    (tmp_path / "device-limits.json").write_text("{not json")
    assert limits.cached_floor("NVIDIA H100 80GB HBM3", measure) == FLOOR and len(calls) == 3
