"""The cuda target: NVIDIA GPUs (and ROCm builds of torch, which answer as torch.cuda).

Everything the farm does differently on a CUDA GPU is here, asked through the Target
interface: the spin kernel that leads each timed call, CUDA graphs, the host-time check, the
matmul peak, the runner's memory share and allocator cache, side-stream launches, SM count,
the sandbox's device nodes, NVML gauges and the LLM prompt's section.

May import: farm.targets.base, farm.errors.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from farm.targets.base import Target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CudaTarget(Target):
    def unusable(self) -> str | None:
        import torch

        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return (f"torch {torch.__version__} is built without CUDA: install a CUDA build of torch for this "
                    "host, or use --target cpu")
        return None

    def visible_by_env(self) -> bool:
        # the NVIDIA container runtime's variable: GPUs are on their way into this container
        return os.environ.get("NVIDIA_VISIBLE_DEVICES") not in (None, "", "void", "none")

    def properties(self) -> dict[str, Any]:
        import torch

        props = torch.cuda.get_device_properties(0)
        return {"sm_count": props.multi_processor_count, "memory_bytes": props.total_memory,
                "capability": f"{props.major}.{props.minor}"}

    def sandbox_nodes(self, index: int | None) -> list[str]:
        """The control nodes (they serve every GPU) and the pinned GPU's /dev/nvidiaN. Children
        count GPUs in PCI bus order (CUDA_DEVICE_ORDER below), as the driver's
        /proc/driver/nvidia/gpus/<bus id> folders sort, which name each GPU's minor number. Where
        that list does not give the node (a container that shows other GPUs' folders but not
        their nodes), every GPU node present is bound and CUDA_VISIBLE_DEVICES alone pins."""
        control = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
                               "/dev/nvidia-caps") if os.path.exists(p)]
        node = _pinned_node(index)
        return control + ([node] if node else sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*")))

    def sandbox_env(self, index: int | None) -> dict[str, str]:
        # CUDA counts only the GPUs whose node it can open: with the pinned GPU's node alone
        # bound, that GPU is device 0 inside, and pinning its host index (cuda:1 -> "1") left
        # the runner with no GPU at all (every device but the first on a several-GPU host)
        return {"CUDA_VISIBLE_DEVICES": "0"} if _pinned_node(index) else {}

    def device_monitor(self) -> Nvml:
        return Nvml()

    def prompt_text(self) -> str:
        return resources.files("farm.targets").joinpath("prompt_cuda.txt").read_text(encoding="utf-8")

    def limit_memory(self, fraction: float) -> None:
        import torch

        torch.cuda.set_per_process_memory_fraction(fraction, 0)

    def release_memory(self) -> None:
        import torch

        torch.cuda.empty_cache()

    def on_side_stream(self, capture_stream: Any) -> bool:
        import torch

        current = torch.cuda.current_stream()
        return current != torch.cuda.default_stream() and current != capture_stream

    def spin(self, cycles: int) -> None:
        import torch

        torch.cuda._sleep(cycles)

    def capture_graph(self, calls: list[Callable[[], object]], on_stream: Callable[[Any], None] | None = None) -> Any:
        import torch

        stream = torch.cuda.Stream()
        if on_stream is not None:
            on_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # a side stream must see the calls once before capture (lazy init, allocator)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for call in calls[: max(1, len(calls) // 8)]:
                call()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for call in calls:
                call()
        torch.cuda.synchronize()
        return graph


def _pinned_node(index: int | None) -> str | None:
    """/dev/nvidiaN of the GPU at host index `index` (PCI bus order), where the driver names it."""
    minors = _nvidia_minors_by_bus()
    if index is not None and 0 <= index < len(minors) and os.path.exists(f"/dev/nvidia{minors[index]}"):
        return f"/dev/nvidia{minors[index]}"
    return None


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


class Nvml:
    """The GPU gauges (farm.observe.devices) from NVML, through nvidia-ml-py (`pynvml`, the extra
    `nvml`), initialised once per monitor on first use: the driver's own counters, no child
    process and no text to parse. A host without the driver or without nvidia-ml-py reports no
    devices (said once in the log, not on every scrape)."""

    def __init__(self):
        self._lib = None
        self._failed = ""

    def _load(self):
        if self._lib is None and not self._failed:
            try:
                import pynvml  # nvidia-ml-py: only cuda workers need it

                pynvml.nvmlInit()
                self._lib = pynvml
            except ImportError:
                self._failed = "nvidia-ml-py is not installed (pip install 'kernel-farm[nvml]')"
            except Exception as exc:  # noqa: BLE001 - pynvml.NVMLError: no driver, no device
                self._failed = f"NVML cannot start: {exc}"
            if self._failed:
                log.warning("GPU gauges off: %s; the cluster's DCGM exporter has them too", self._failed)
        return self._lib

    def stats(self, devices: list[int]) -> dict[int, dict]:
        """Every GPU NVML sees (its index is the worker's: both count in PCI bus order)."""
        nvml = self._load()
        if nvml is None:
            return {}
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            log.warning("NVML: %s", exc)
            return {}
        found = {}
        for index in range(count):
            stats: dict[str, float | None] = {"used_bytes": None, "total_bytes": None, "utilization": None}
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError:
                continue  # a device lost from the bus: no gauges rather than a failed scrape
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                stats["used_bytes"], stats["total_bytes"] = float(memory.used), float(memory.total)
            except nvml.NVMLError:
                pass
            try:
                stats["utilization"] = min(1.0, nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
            except nvml.NVMLError:
                pass  # "Not Supported" on some boards
            found[index] = stats
        return found


# PCI order, so that index N is the GPU nvidia-smi (and the metrics) call N; CUDA's default
# order puts the fastest first, which differs on mixed hosts.
CUDA = CudaTarget("cuda", "cuda", "CUDA_VISIBLE_DEVICES", 256 * 1024**2, triton_backend="nvidia",
                  lint_rules="cuda", device_nodes=("/dev/nvidia[0-9]*",),
                  child_env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, driver_env=("CUDA_", "NVIDIA_"),
                  spins=True, graphs=True, host_check=True, compute_peaks=True,
                  # CUDA registers: 32768 fp32 over 32 warps is 32 registers a thread (a 32k-column row held whole)
                  tunes_warps=True, max_block=32768, inductor_modes=("default", "max-autotune-no-cudagraphs"),
                  hardware="CUDA GPUs", aot_c=True)
