"""A stand-in Triton driver for hosts with none (the cpu target, and loading task files there).

Task files written for CUDA probe the device at import time, e.g. AKG's
`_is_hip = triton.runtime.driver.active.get_current_target().backend == "hip"`. On a host
without a GPU Triton has no active driver and that line raises, so the file cannot even be
listed. The Triton interpreter (TRITON_INTERPRET=1) runs kernels without any driver; only the
probe needs an answer. The stand-in answers as the platform these files were written for
(CUDA), is installed only where no real driver is active, and never compiles or launches.

May import: nothing of the farm (a leaf of farm.targets).
"""

from __future__ import annotations


class InterpreterDriver:
    """The minimum of triton's DriverBase that module-level device probes call."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 80, 32)

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def is_active(self) -> bool:
        return True


def ensure_driver() -> bool:
    """Install the stand-in if Triton has no active driver here; True if it did."""
    try:
        from triton.runtime import driver as config  # the DriverConfig instance
    except ImportError:
        return False
    try:
        config.active  # noqa: B018 - the property creates the real driver where there is one
        return False
    except RuntimeError:
        config.set_active(InterpreterDriver())
        return True
