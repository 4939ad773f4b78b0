"""The target interface: what the farm needs to know to run Triton kernels on one kind of device.

A target is a value, not a process. It has two kinds of members (docs/architecture.md,
"Adding a target"):

- capabilities, the dataclass fields: read by the parent (CLI, worker supervisor, evaluator,
  generators, export) to decide what to do, never touching a device;
- hooks, the methods: called where the device is, inside the child that `pin_env` pinned
  (`import_runtime`, `synchronize`, `event_class`, `device_name`, `properties`, `spin`,
  `capture_graph`, `profile_ms`...), except those that run in the parent and touch no device
  (`pin_env`, `present`, `visible_by_env`, `sandbox_nodes`, `sandbox_paths`, `unusable`,
  `device_monitor`, `frontend_check`, `prompt_text`).

Nothing outside a target's own module compares its name: the farm asks the target instead
(tests/test_target_names.py). Every default here is what a plain compiled target with device
events gets; a built-in or plug-in target overrides what its device does differently.
"""

from __future__ import annotations

import glob
import os
import platform
from dataclasses import dataclass, field
from typing import Any, Callable


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
    aliases: tuple[str, ...] = ()  # other names --device and --target accept (ascend: its torch name, npu)
    # Environment variables the device's runtime reads, kept in a sandboxed runner's otherwise
    # allow-listed environment (farm.evaluate.runner); a name ending in "_" is a prefix.
    driver_env: tuple[str, ...] = ()

    # -- timing capabilities (farm.evaluate: timing, comparison, floor, timed_checks) --------
    # The timer queues a spin kernel (`spin`) ahead of each timed call, so that the device is
    # still busy when the host has launched the call and the host's launch stays outside the events.
    spins: bool = False
    # Calls can be captured in a device graph and replayed (`capture_graph`): timing mode "graph".
    graphs: bool = False
    # Device events time only device work: a call whose host time is far beyond them did work
    # they could not see (a host thread, another stream), a cheat. Off where the host's own launch
    # cost dominates the events (Ascend: ~24 us a launch) or the events are the host's clock.
    host_check: bool = False
    # The device's vendor matmul is worth measuring as its compute peak (the physical limit's
    # third term, farm.evaluate.limits).
    compute_peaks: bool = False
    # A profiler's device time per call that `farm eval --timing NAME` may ask for (`profile_ms`).
    profiler: str | None = None

    # -- what the generators may assume (farm.generators) -----------------------------------
    tunes_warps: bool = False  # num_warps / num_stages mean something to the compiler: tune them
    max_block: int = 16384  # largest block a tile knob may reach (registers, on-chip buffer...)
    # torch.compile modes whose Triton output seeds a search (farm.generators.inductor); none:
    # inductor has no Triton backend for this device.
    inductor_modes: tuple[str, ...] = ()

    # -- what an exported package says and ships (farm.export) ------------------------------
    hardware: str = ""  # the devices in words, plural ("CUDA GPUs"), for a package's docs
    # The distribution that provides `import triton` here; a package whose kernels are all for
    # targets with another one (triton-ascend replaces triton) does not depend on triton.
    triton_distribution: str = "triton"
    aot_c: bool = False  # Triton's AOT compiler makes C launchers for this target's kernels

    # ---------------------------------------------------------------- parent-side hooks

    def pin_env(self, index: int | None) -> dict[str, str]:
        """Environment that makes device `index` the only visible one (as device 0)."""
        env = dict(self.child_env)
        if self.triton_backend:
            env["TRITON_DEFAULT_BACKEND"] = self.triton_backend
        if self.visible_env and index is not None:
            env[self.visible_env] = str(index)
        return env

    def present(self) -> bool:
        """Whether this host has one of the target's devices (`--device auto`, the stand-in
        choice), judged from device nodes: never initialises a runtime."""
        return any(glob.glob(pattern) for pattern in self.device_nodes)

    def visible_by_env(self) -> bool:
        """Whether the environment says this host has the device though no node shows yet
        (a container runtime's variable); asked after every target's `present`."""
        return False

    def sandbox_nodes(self, index: int | None) -> list[str]:
        """Device files a sandboxed child of device `index` needs (farm.evaluate.sandbox binds
        them, and nothing else of /dev beyond null, zero, random, shm...). None for cpu."""
        return []

    def sandbox_env(self, index: int | None) -> dict[str, str]:
        """Variables that replace pin_env's inside the sandbox: where sandbox_nodes binds the
        pinned device's node alone, the runtime inside counts one device, so the pin names it
        by its index there (0), not by its index on the host."""
        return {}

    def sandbox_paths(self) -> list[str]:
        """Driver folders and files outside /usr that the child reads (bound read-only)."""
        return []

    def unusable(self) -> str | None:
        """Why this process cannot run the target at all (checked in the parent, before any
        child is started; never initialises a device), or None."""
        return None

    @property
    def event_method(self) -> str:
        """How a per-call figure of this target is timed, as results name it."""
        return "host_clock" if self.interpret else f"{self.torch_device}_event"

    @property
    def graph_method(self) -> str:
        return f"{self.torch_device}_graph"

    def device_monitor(self) -> Any | None:
        """For the worker supervisor's device gauges (farm.observe.devices): an object whose
        `stats(devices)` maps device index to {"used_bytes", "total_bytes", "utilization"}
        (0..1; any may be None), read from the driver without a device context; None: the
        gauges show the worker's process tree (memory, CPU time), as for cpu."""
        return None

    def frontend_check(self) -> Any | None:
        """The module that compiles candidates with this target's own Triton frontend before
        any device time (farm.ascend.frontend: configured_python, check_source, ...), or None."""
        return None

    def prompt_text(self) -> str | None:
        """The LLM prompt's section about this target: a string.Template with $target and
        $device (its properties); None: a generic one."""
        return None

    # ---------------------------------------------------------------- child-side hooks

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

    def device_module(self) -> Any | None:
        """torch.cuda, torch.npu, ...: the torch module of this device type, or None where
        Triton interprets on the host (cpu): nothing to synchronise, no device events."""
        import torch

        return None if self.interpret else getattr(torch, self.torch_device, None)

    def synchronize(self) -> None:
        module = self.device_module()
        if module is not None:
            module.synchronize()

    def event_class(self) -> type | None:
        """The device's timing event class (torch.cuda.Event...), or None: an interpreting
        target has real semantics but no device clock, and times on the host."""
        return None if self.interpret else getattr(self.device_module(), "Event", None)

    def event(self) -> Any:
        """A timing event of this device (torch.cuda.Event / torch.npu.Event)."""
        event_class = self.event_class()
        assert event_class is not None, f"target {self.name} has no device events"  # asked of device targets only
        return event_class(enable_timing=True)

    def device_name(self) -> str:
        module = self.device_module()
        if module is not None:
            return module.get_device_name(0)
        return platform.processor() or platform.machine() or "cpu"

    def properties(self) -> dict[str, Any]:
        """What the runner reports of its device (EvalResult.device), which generators and the
        LLM prompt read: compute units and memory. Inside the child."""
        return {"cores": os.cpu_count()}

    def limit_memory(self, fraction: float) -> None:
        """Cap this process's share of device memory (a runner beside others on one device)."""

    def release_memory(self) -> None:
        """Give cached device memory back after a candidate is unloaded (its allocator's cache)."""

    def on_side_stream(self, capture_stream: Any) -> bool:
        """At a kernel launch: whether it goes to a stream other than the default one and the
        harness's `capture_stream` (work the timer's events may not see). Per launch: cheap."""
        return False

    def spin(self, cycles: int) -> None:
        """Keep the device busy for `cycles` clock cycles (a kernel that waits); only where `spins`."""
        raise NotImplementedError(f"target {self.name} has no spin kernel")

    def capture_graph(self, calls: list[Callable[[], object]], on_stream: Callable[[Any], None] | None = None) -> Any:
        """A device graph of the calls, in order, to `replay()`; only where `graphs`. `on_stream`
        is told the capture stream before any call (launches there are the harness's; the caller
        resets it). Whatever breaks the capture is raised as is (farm.evaluate.timing classifies it)."""
        raise NotImplementedError(f"target {self.name} has no device graphs")

    def profile_ms(self, fn: Callable[[], object], timer: Any) -> float:
        """Device ms per call of `fn` from the device's profiler (`profiler`); `timer` flushes
        the cache (`timer.flush()`) and synchronises (`timer.synchronize()`)."""
        raise NotImplementedError(f"target {self.name} has no profiler")


@dataclass(frozen=True)
class StandInTarget(Target):
    """A target's flow on a host without its device: kernels run in the CPU interpreter (real
    semantics, so verdicts hold) and timings are the interpreter's, never the device's."""

    stands_for: str = ""

    def device_name(self) -> str:
        return f"CPU interpreter standing in for {self.stands_for} (no {self.stands_for} timing)"


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
