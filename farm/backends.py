"""Targets: cuda, ascend, cpu. What each knows about pinning a device, naming it in torch,
synchronising and timing.

The parent process (CLI, worker supervisor) never initialises a device: it only resolves a
`DeviceSpec` and hands the child the environment that pins it. Device work happens in
children (farm.isolation).

Ascend: written from the torch_npu / triton-ascend documentation. No part of this module has
run on an Ascend NPU; tests cover what can be checked without one (names, environment,
resolution rules).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

from farm.errors import FarmError


@dataclass(frozen=True)
class Backend:
    name: str
    torch_device: str  # device type as torch names it
    visible_env: str | None  # variable that pins one device per process
    flush_bytes: int  # cache flush buffer before each timed run
    interpret: bool = False  # Triton kernels run in the interpreter (CPU)
    child_env: dict[str, str] = field(default_factory=dict)

    def pin_env(self, index: int | None) -> dict[str, str]:
        """Environment that makes device `index` the only visible one (as device 0)."""
        env = dict(self.child_env)
        if self.visible_env and index is not None:
            env[self.visible_env] = str(index)
        return env


BACKENDS: dict[str, Backend] = {
    # PCI order, so that index N is the GPU nvidia-smi (and the metrics) call N; CUDA's default
    # order puts the fastest first, which differs on mixed hosts.
    "cuda": Backend("cuda", "cuda", "CUDA_VISIBLE_DEVICES", 256 * 1024**2,
                    child_env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
    # ASCEND_RT_VISIBLE_DEVICES takes logical ids in ascending order; the device is then npu:0.
    "ascend": Backend("ascend", "npu", "ASCEND_RT_VISIBLE_DEVICES", 192 * 1024**2),
    # Hide GPUs from CPU children so nothing initialises a device by accident.
    "cpu": Backend("cpu", "cpu", None, 0, interpret=True,
                   child_env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}),
}


@dataclass(frozen=True)
class DeviceSpec:
    backend: Backend
    index: int | None  # physical index to pin; None for cpu

    @property
    def label(self) -> str:
        return self.backend.name if self.index is None else f"{self.backend.name}:{self.index}"

    @property
    def torch_device(self) -> str:
        """Inside the pinned child the device is always index 0."""
        return self.backend.torch_device if self.index is None else f"{self.backend.torch_device}:0"

    def child_env(self) -> dict[str, str]:
        return self.backend.pin_env(self.index)


def accelerator_present() -> str | None:
    """Which accelerator this host has, judged from device nodes: never initialises a runtime."""
    if glob.glob("/dev/davinci[0-9]*"):
        return "ascend"
    if glob.glob("/dev/nvidia[0-9]*") or os.environ.get("NVIDIA_VISIBLE_DEVICES") not in (None, "", "void", "none"):
        return "cuda"
    return None


def resolve_device(text: str | int | None, default_target: str = "auto") -> DeviceSpec:
    """Parse --device: 'cpu', 'cuda', 'cuda:1', 'npu:0', 'ascend:2', 'auto', or a bare index."""
    raw = "auto" if text in (None, "") else str(text).strip().lower()
    target, _, idx = raw.partition(":")
    if target.isdigit() and not idx:
        target, idx = default_target, target
    if target == "npu":
        target = "ascend"
    if target == "auto":
        target = accelerator_present() or "cpu"
    if target not in BACKENDS:
        raise FarmError(f"unknown device '{text}' (--device): use cpu, cuda[:N], ascend[:N]/npu[:N], auto, or N")
    if target == "cpu":
        return DeviceSpec(BACKENDS["cpu"], None)
    if idx and not idx.isdigit():
        raise FarmError(f"device index in '{text}' (--device) must be a number")
    return DeviceSpec(BACKENDS[target], int(idx) if idx else 0)


def import_device_runtime(spec: DeviceSpec) -> None:
    """In a child: load what the device needs (torch_npu registers the 'npu' device)."""
    if spec.backend.name == "ascend":
        try:
            import torch_npu  # noqa: F401
        except ImportError as exc:
            raise FarmError("target ascend needs torch_npu (pip install 'kernel-farm[ascend]' on an NPU host)") from exc


def synchronize(spec: DeviceSpec) -> None:
    import torch

    if spec.backend.name == "cuda":
        torch.cuda.synchronize()
    elif spec.backend.name == "ascend":
        torch.npu.synchronize()


def device_name(spec: DeviceSpec) -> str:
    """Human name of the pinned device; call only inside the child."""
    import torch

    if spec.backend.name == "cuda":
        return torch.cuda.get_device_name(0)
    if spec.backend.name == "ascend":
        return torch.npu.get_device_name(0)
    import platform

    return platform.processor() or platform.machine() or "cpu"
