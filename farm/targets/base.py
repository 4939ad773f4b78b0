"""The target interface: what the farm needs to know to run Triton kernels on one kind of device.

A target is a value, not a process: the parent (CLI, worker supervisor) only reads its fields
and hands a child the environment that pins one device (`pin_env`). Everything that touches
the device (`import_runtime`, `synchronize`, `event`, `device_name`, `properties`) is called
only inside that child.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Target:
    name: str  # the farm's name: --target, queue search.<name>, kernels/<name>/
    torch_device: str  # device type as torch names it ("cuda", "npu", "cpu")
    visible_env: str | None  # variable that pins one device per process
    flush_bytes: int  # cache flush buffer before each timed run (bigger than the device's cache)
    interpret: bool = False  # Triton kernels run in the interpreter: real semantics, no meaningful timing
    # Triton's name for the backend whose driver this target's processes use. Triton refuses to
    # guess between two active drivers, so every child names its own (TRITON_DEFAULT_BACKEND).
    triton_backend: str | None = None
    runtime_module: str | None = None  # imported in the child before first use (torch_npu registers 'npu')
    install_hint: str = ""  # what to install when runtime_module is missing
    lint_rules: str | None = None  # `farm lint --target` rule set for kernels meant for this target
    device_nodes: tuple[str, ...] = ()  # globs of device files whose presence means "this host has one"
    child_env: dict[str, str] = field(default_factory=dict)
    # Where this host has none of the target's devices, run as this stand-in instead (ascend:
    # the CPU interpreter for correctness plus the frontend check); None: the device is required.
    stand_in: Target | None = None
    label: str = ""  # how a device-less spec of this target is written (round-trips resolve_device)
    device_timing: bool = True  # False: timings are not the target's (a stand-in): never report them as such
    # The evaluator's static stage compiles candidates with this target's own Triton frontend
    # ("ascend": farm.ascend.frontend) where that environment is configured.
    frontend: str | None = None

    def pin_env(self, index: int | None) -> dict[str, str]:
        """Environment that makes device `index` the only visible one (as device 0)."""
        env = dict(self.child_env)
        if self.triton_backend:
            env["TRITON_DEFAULT_BACKEND"] = self.triton_backend
        if self.visible_env and index is not None:
            env[self.visible_env] = str(index)
        return env

    def sandbox_nodes(self, index: int | None) -> list[str]:
        """Device files a sandboxed child of device `index` needs (farm.evaluate.boundary binds
        them, and nothing else of /dev beyond null, zero, random, shm...). None for cpu."""
        return []

    def sandbox_paths(self) -> list[str]:
        """Driver folders and files outside /usr that the child reads (bound read-only)."""
        return []

    def import_runtime(self) -> None:
        if not self.runtime_module:
            return
        import importlib

        from farm.errors import FarmError

        try:
            importlib.import_module(self.runtime_module)
        except ImportError as exc:
            hint = f" ({self.install_hint})" if self.install_hint else ""
            raise FarmError(f"target {self.name} needs {self.runtime_module}{hint}") from exc

    def choose_triton_driver(self) -> None:
        """In a child, before Triton is used: make this target's backend the process's Triton
        driver by name. Triton >= 3.4 reads TRITON_DEFAULT_BACKEND (pin_env sets it); triton-ascend
        3.2 and older pick whichever driver says it is active and refuse two, so the choice is
        also made here through `driver.set_active`. The driver itself is created on first use
        (creating it may initialise the device). Interpreter targets use no driver."""
        if not self.triton_backend:
            return
        os.environ["TRITON_DEFAULT_BACKEND"] = self.triton_backend
        from triton.backends import backends
        from triton.runtime.driver import driver

        from farm.errors import FarmError

        if self.triton_backend not in backends:
            raise FarmError(f"target {self.name} runs Triton's '{self.triton_backend}' backend, which is not "
                            f"installed here (installed: {', '.join(sorted(backends)) or 'none'})")
        driver.set_active(_LazyDriver(backends[self.triton_backend].driver))

    def unusable(self) -> str | None:
        """Why this process cannot run the target at all (checked in the parent, before any
        child is started; never initialises a device), or None."""
        return None

    def device_module(self) -> Any | None:
        """torch.cuda, torch.npu, ...: the torch module of this device type, or None (cpu)."""
        import torch

        return None if self.torch_device == "cpu" else getattr(torch, self.torch_device, None)

    def synchronize(self) -> None:
        module = self.device_module()
        if module is not None:
            module.synchronize()

    def event(self) -> Any:
        """A timing event of this device (torch.cuda.Event / torch.npu.Event)."""
        return self.device_module().Event(enable_timing=True)

    def device_name(self) -> str:
        module = self.device_module()
        if module is not None:
            return module.get_device_name(0)
        return platform.processor() or platform.machine() or "cpu"

    def properties(self) -> dict[str, Any]:
        """What a generator or the lint may use: compute units, memory (inside the child)."""
        return {}


class _LazyDriver:
    """A Triton driver created when first used, so that choosing one touches no device."""

    def __init__(self, cls: type):
        object.__setattr__(self, "_cls", cls)
        object.__setattr__(self, "_obj", None)

    def _get(self) -> Any:
        if self._obj is None:
            object.__setattr__(self, "_obj", self._cls())
        return self._obj

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._get(), name, value)

    def __repr__(self) -> str:
        return f"<Triton driver {self._cls.__name__} (chosen by the farm target)>"
