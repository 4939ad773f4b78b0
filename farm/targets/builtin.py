"""The built-in targets: cuda, ascend, cpu.

Ascend: written from the torch_npu / triton-ascend documentation. Nothing here has run on an
Ascend NPU; tests cover what can be checked without one (names, environment, resolution).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.targets.base import Target


@dataclass(frozen=True)
class CudaTarget(Target):
    def unusable(self) -> str | None:
        import torch

        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return (f"torch {torch.__version__} is built without CUDA: install a CUDA build of torch for this "
                    "host, or use --target cpu")
        return None

    def properties(self) -> dict[str, Any]:
        import torch

        props = torch.cuda.get_device_properties(0)
        return {"sm_count": props.multi_processor_count, "total_memory": props.total_memory,
                "capability": f"{props.major}.{props.minor}"}


    def sandbox_nodes(self, index: int | None) -> list[str]:
        """The control nodes (they serve every GPU) and the pinned GPU's /dev/nvidiaN. Children
        count GPUs in PCI bus order (CUDA_DEVICE_ORDER below), as the driver's
        /proc/driver/nvidia/gpus/<bus id> folders sort, which name each GPU's minor number. Where
        that list does not give the node (a container that shows other GPUs' folders but not
        their nodes), every GPU node present is bound and CUDA_VISIBLE_DEVICES alone pins."""
        control = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
                               "/dev/nvidia-caps") if os.path.exists(p)]
        minors = _nvidia_minors_by_bus()
        if index is not None and 0 <= index < len(minors) and os.path.exists(f"/dev/nvidia{minors[index]}"):
            return control + [f"/dev/nvidia{minors[index]}"]
        return control + sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))


def _nvidia_minors_by_bus() -> list[int]:
    minors = []
    try:
        for folder in sorted(Path("/proc/driver/nvidia/gpus").iterdir(), key=lambda p: p.name.lower()):
            match = re.search(r"Device Minor:\s*(\d+)", (folder / "information").read_text())
            if match:
                minors.append(int(match.group(1)))
    except OSError:
        return []
    return minors


@dataclass(frozen=True)
class AscendTarget(Target):
    def sandbox_nodes(self, index: int | None) -> list[str]:
        """The NPU's node and the driver's shared ones (names from the Ascend container
        runtime's documentation; not run on hardware)."""
        nodes = ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
        if index is not None and os.path.exists(f"/dev/davinci{index}"):
            nodes.append(f"/dev/davinci{index}")
        else:  # logical ids need not match the node numbers: every NPU node, the mask pins
            nodes += sorted(str(p) for p in Path("/dev").glob("davinci[0-9]*"))
        return [n for n in nodes if os.path.exists(n)]

    def sandbox_paths(self) -> list[str]:
        # the driver and CANN (/usr/local/Ascend is under /usr already); the installer's record
        return [p for p in ("/etc/ascend_install.info", "/usr/local/dcmi") if os.path.exists(p)]

    def properties(self) -> dict[str, Any]:
        # num_vectorcore / num_aicore as triton-ascend's driver reports them (its docs' names)
        try:
            import triton.runtime.driver as driver

            props = driver.active.utils.get_device_properties(0)
            return {k: props[k] for k in ("num_vectorcore", "num_aicore") if k in props}
        except Exception:  # noqa: BLE001 -- properties are advisory; the target still works without them
            return {}


# PCI order, so that index N is the GPU nvidia-smi (and the metrics) call N; CUDA's default
# order puts the fastest first, which differs on mixed hosts.
CUDA = CudaTarget("cuda", "cuda", "CUDA_VISIBLE_DEVICES", 256 * 1024**2, triton_backend="nvidia",
                  lint_rules="cuda", device_nodes=("/dev/nvidia[0-9]*",),
                  child_env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
@dataclass(frozen=True)
class StandInTarget(Target):
    """A target's flow on a host without its device: kernels run in the CPU interpreter (real
    semantics, so verdicts hold) and timings are the interpreter's, never the device's."""

    stands_for: str = ""

    def device_name(self) -> str:
        return f"CPU interpreter standing in for {self.stands_for} (no {self.stands_for} timing)"


# Ascend without an NPU: correctness in the CPU interpreter, compilation checked by
# triton-ascend's own frontend (farm.ascend.frontend); nothing is timed on Ascend.
ASCEND_ON_CPU = StandInTarget("ascend", "cpu", None, 0, interpret=True, lint_rules="ascend", label="ascend:cpu",
                              device_timing=False, frontend="ascend", stands_for="Ascend",
                              child_env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})
# ASCEND_RT_VISIBLE_DEVICES takes logical ids in ascending order; the device is then npu:0.
ASCEND = AscendTarget("ascend", "npu", "ASCEND_RT_VISIBLE_DEVICES", 192 * 1024**2, triton_backend="ascend",
                      runtime_module="torch_npu", install_hint="pip install 'kernel-farm[ascend]' on an NPU host",
                      lint_rules="ascend", device_nodes=("/dev/davinci[0-9]*",), stand_in=ASCEND_ON_CPU,
                      frontend="ascend")
# Hide GPUs from CPU children so nothing initialises a device by accident.
CPU = Target("cpu", "cpu", None, 0, interpret=True,
             child_env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})

BUILTIN = {t.name: t for t in (CUDA, ASCEND, CPU)}
