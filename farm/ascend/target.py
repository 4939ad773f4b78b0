"""The ascend target: Huawei Ascend NPUs through torch_npu and triton-ascend, and its stand-in
on hosts without one. Everything the farm does differently for Ascend as a device is here,
asked through the Target interface (farm.targets.base): pinning, the driver, sandbox nodes,
core counts, the profiler's device time, npu-smi gauges, the frontend check, the LLM prompt.

Written from the torch_npu / triton-ascend documentation. Nothing here has run on an Ascend NPU;
tests cover what can be checked without one (names, environment, resolution, parsing).
Registered by farm.targets.builtin (LAZY), imported on first use.

May import: farm.targets.base, farm.errors; farm.ascend.frontend where the check is asked for.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from farm.targets.base import StandInTarget, Target

log = logging.getLogger(__name__)

SMI_TIMEOUT_S = 5.0
MIB = 1024 * 1024


class _Ascend:
    """What the NPU target and its stand-in share: the frontend check and the prompt."""

    def frontend_check(self) -> Any:
        from farm.ascend import frontend

        return frontend

    def prompt_text(self) -> str:
        return resources.files("farm.ascend").joinpath("prompt.txt").read_text(encoding="utf-8")


@dataclass(frozen=True)
class AscendTarget(_Ascend, Target):
    def sandbox_nodes(self, index: int | None) -> list[str]:
        """The NPU's node and the driver's shared ones (names from the Ascend container
        runtime's documentation; not run on hardware)."""
        nodes = ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
        if index is not None and os.path.exists(f"/dev/davinci{index}"):
            nodes.append(f"/dev/davinci{index}")
        else:  # logical ids need not match the node numbers: every NPU node, the mask pins
            nodes += sorted(str(p) for p in Path("/dev").glob("davinci[0-9]*"))
        return [n for n in nodes if os.path.exists(n)]

    def sandbox_env(self, index: int | None) -> dict[str, str]:
        # with /dev/davinciN alone bound, the runtime numbers that NPU 0, as in a container the
        # Ascend docker runtime gives one NPU (from its documentation; not run on hardware)
        return {"ASCEND_RT_VISIBLE_DEVICES": "0"} if index is not None and os.path.exists(f"/dev/davinci{index}") else {}

    def sandbox_paths(self) -> list[str]:
        # the driver and CANN (/usr/local/Ascend is under /usr already); the installer's record
        return [p for p in ("/etc/ascend_install.info", "/usr/local/dcmi") if os.path.exists(p)]

    def properties(self) -> dict[str, Any]:
        # triton-ascend reports cores through its driver (no SM count on NPUs; its docs' names)
        import torch
        import triton

        npu = torch.npu  # type: ignore[attr-defined]  # torch_npu adds it; torch's stubs do not know it
        props = triton.runtime.driver.active.utils.get_device_properties(npu.current_device())
        return {"num_aicore": props.get("num_aicore"), "num_vectorcore": props.get("num_vectorcore")}

    def device_monitor(self) -> NpuSmi:
        return NpuSmi()

    def profile_ms(self, fn: Callable[[], object], timer: Any) -> float:
        return npu_profiler_ms(fn, timer)


@dataclass(frozen=True)
class AscendStandIn(_Ascend, StandInTarget):
    """Ascend without an NPU: correctness in the CPU interpreter, compilation checked by
    triton-ascend's own frontend (farm.ascend.frontend); nothing is timed on Ascend."""


ASCEND_ON_CPU = AscendStandIn("ascend", "cpu", None, 0, interpret=True, lint_rules="ascend", label="ascend:cpu",
                              device_timing=False, stands_for="Ascend", max_block=8192,
                              child_env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})
# ASCEND_RT_VISIBLE_DEVICES takes logical ids in ascending order; the device is then npu:0.
# Blocks: the unified buffer (96 KB live, ~3 fp32 tensors). num_warps / num_stages mean nothing
# to triton-ascend. Event timing includes ~24 us of host launch cost (triton-ascend#1675), so
# the host check is off and the profiler is offered. triton-ascend replaces the triton package.
ASCEND = AscendTarget("ascend", "npu", "ASCEND_RT_VISIBLE_DEVICES", 192 * 1024**2, triton_backend="ascend",
                      runtime_module="torch_npu", install_hint="pip install 'kernel-farm[ascend]' on an NPU host",
                      lint_rules="ascend", device_nodes=("/dev/davinci[0-9]*",), stand_in=ASCEND_ON_CPU,
                      aliases=("npu",), driver_env=("ASCEND_",), max_block=8192, profiler="npu-profiler", hardware="Ascend NPUs",
                      triton_distribution="triton-ascend")


# ---------------------------------------------------------------- profiler device time
#
# Not run on an NPU yet. torch_npu.profiler writes ASCEND_PROFILER_OUTPUT/op_statistic.csv,
# whose times are MICROSECONDS ("Total Time(us)").

FLUSH_KERNEL_MARKERS = ("ZerosLike", "Zero", "Fill", "farm_flush")


def parse_op_statistic(csv_text: str, active: int, exclude: tuple[str, ...] = FLUSH_KERNEL_MARKERS) -> float:
    """Milliseconds of device time per call from op_statistic.csv: the ops that ran a multiple
    of `active` times (once or more per call), minus the cache flush, divided by `active`."""
    import csv
    import io

    total_us = 0.0
    for row in csv.DictReader(io.StringIO(csv_text)):
        name = row.get("OP Type") or row.get("Op Name") or ""
        count = int(float(row.get("Count", "0") or 0))
        if count == 0 or count % active or any(m.lower() in name.lower() for m in exclude):
            continue
        total_us += float(row["Total Time(us)"])
    return total_us / active / 1000.0  # us -> ms


def npu_profiler_ms(fn: Callable[[], object], timer: Any, active: int = 50) -> float:
    """Device time per call from torch_npu's profiler (untested on hardware: no NPU here)."""
    import glob
    import tempfile

    import torch_npu

    prof_dir = tempfile.mkdtemp(prefix="farm-npu-prof-")
    schedule = torch_npu.profiler.schedule(wait=0, warmup=1, active=active, repeat=1)
    with torch_npu.profiler.profile(activities=[torch_npu.profiler.ProfilerActivity.NPU], schedule=schedule,
                                    on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(prof_dir)) as prof:
        for _ in range(active + 1):
            timer.flush()
            fn()
            prof.step()
    timer.synchronize()
    files = glob.glob(f"{prof_dir}/**/op_statistic.csv", recursive=True)
    if not files:
        raise RuntimeError(f"torch_npu profiler wrote no op_statistic.csv under {prof_dir}")
    with open(files[0]) as f:
        return parse_op_statistic(f.read(), active)


# ---------------------------------------------------------------- npu-smi gauges


class NpuSmi:
    """The worker supervisor's device gauges (farm.observe.devices) from `npu-smi info -t usages`,
    parsed from Huawei's documentation of it; no Ascend device has run this code."""

    def stats(self, devices: list[int]) -> dict[int, dict]:
        found = {}
        for device in devices:
            out = _run(["npu-smi", "info", "-t", "usages", "-i", str(device)])
            if out:
                found[device] = parse_npu_smi_usages(out)
        return found


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s: %s", cmd[0], exc)
        return None
    return done.stdout if done.returncode == 0 else None


def parse_npu_smi_usages(text: str) -> dict:
    """`npu-smi info -t usages -i N`: 'HBM Capacity(MB) : 65536', 'HBM Usage Rate(%) : 3',
    'Aicore Usage Rate(%) : 40' lines (devices without HBM report Memory Capacity instead)."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[re.sub(r"\s+", " ", key.strip()).lower()] = value.strip()
    capacity = _num(fields.get("hbm capacity(mb)") or fields.get("memory capacity(mb)"), MIB)
    rate = _num(fields.get("hbm usage rate(%)") or fields.get("memory usage rate(%)"), 0.01)
    used = capacity * rate if capacity is not None and rate is not None else None
    return {"used_bytes": used, "total_bytes": capacity, "utilization": _num(fields.get("aicore usage rate(%)"), 0.01)}


def _num(text: str | None, scale: float) -> float | None:
    if text is None:
        return None
    try:
        return float(text) * scale
    except ValueError:
        return None  # '[N/A]', '[Not Supported]'
