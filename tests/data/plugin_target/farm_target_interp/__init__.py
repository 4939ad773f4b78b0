"""A target defined outside the farm, the way a team bringing up a new chip plugs one in.

This one runs Triton kernels through the interpreter on the host (real semantics, no device
to pin), so the suite can run the whole flow on it without the chip. It overrides every hook
of farm.targets.base.Target with what a host-side "chip" can do (its clock is the host's, its
graphs replay Python calls, its profiler times on the host), and counts each call in CALLS,
so tests/targets/test_plugin_hooks.py can check that the farm reaches every hook of a target
it did not ship. Its capabilities stay those of an interpreter for the whole-flow test; that
test flips them (graphs, spins, host_check...) to make the farm call the matching hooks.
"""

from __future__ import annotations

import collections
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from farm.targets.base import Target

CALLS: collections.Counter = collections.Counter()  # hook -> calls in this process
HERE = Path(__file__).resolve().parent

PROMPT = """## Target: $target, a test chip whose Triton runs in the interpreter

Device: $device

Write plain `tl` code; the chip has 4 lanes per core (see lanes above)."""


class HostEvent:
    """The chip's timing event: here, the host clock."""

    def __init__(self, enable_timing: bool = True):
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, other: HostEvent) -> float:
        return (other.t - self.t) * 1e3


class HostGraph:
    """The chip's graph: the captured calls, replayed in order."""

    def __init__(self, calls):
        self.calls = list(calls)

    def replay(self) -> None:
        for call in self.calls:
            call()


class HostStream:
    """The stream a graph is captured on (the host has one)."""


class NoMonitor:
    """The chip's driver counters: a fixed answer, since the chip is the host."""

    def stats(self, devices: list[int]) -> dict[int, dict]:
        CALLS["device_monitor.stats"] += 1
        return {d: {"used_bytes": 1.0, "total_bytes": 2.0, "utilization": 0.5} for d in devices}


@dataclass(frozen=True)
class InterpTarget(Target):
    def present(self) -> bool:
        CALLS["present"] += 1
        return False  # never picked by --device auto: the suite's hosts have no such chip

    def visible_by_env(self) -> bool:
        CALLS["visible_by_env"] += 1
        return False

    def sandbox_nodes(self, index: int | None) -> list[str]:
        CALLS["sandbox_nodes"] += 1
        return []  # no device files: the chip is the host

    def sandbox_env(self, index: int | None) -> dict[str, str]:
        CALLS["sandbox_env"] += 1
        return {}

    def sandbox_paths(self) -> list[str]:
        CALLS["sandbox_paths"] += 1
        return [str(HERE)]  # the "driver": this package, read-only in the sandbox

    def unusable(self) -> str | None:
        CALLS["unusable"] += 1
        return None

    def device_monitor(self) -> NoMonitor:
        CALLS["device_monitor"] += 1
        return NoMonitor()

    def frontend_check(self):
        CALLS["frontend_check"] += 1
        from farm_target_interp import frontend

        return frontend

    def prompt_text(self) -> str:
        CALLS["prompt_text"] += 1
        return PROMPT

    def import_runtime(self) -> None:
        CALLS["import_runtime"] += 1
        super().import_runtime()

    def choose_triton_driver(self) -> None:
        CALLS["choose_triton_driver"] += 1
        super().choose_triton_driver()  # no triton_backend: the interpreter needs no driver

    def synchronize(self) -> None:
        CALLS["synchronize"] += 1

    def event_class(self) -> type:
        CALLS["event_class"] += 1
        return HostEvent

    def device_name(self) -> str:
        CALLS["device_name"] += 1
        return "Interp test chip (Triton interpreter on the host)"

    def properties(self) -> dict:
        CALLS["properties"] += 1
        return {"cores": os.cpu_count(), "lanes": 4}

    def limit_memory(self, fraction: float) -> None:
        CALLS["limit_memory"] += 1

    def release_memory(self) -> None:
        CALLS["release_memory"] += 1

    def on_side_stream(self, capture_stream) -> bool:
        CALLS["on_side_stream"] += 1
        return False

    def spin(self, cycles: int) -> None:
        CALLS["spin"] += 1
        end = time.perf_counter() + cycles * 1e-9  # a 1 GHz clock
        while time.perf_counter() < end:
            pass

    def capture_graph(self, calls, on_stream=None) -> HostGraph:
        CALLS["capture_graph"] += 1
        if on_stream is not None:
            on_stream(HostStream())
        for call in calls:  # what a capture does: run each call once, here on the host
            call()
        return HostGraph(calls)

    def profile_ms(self, fn, timer) -> float:
        CALLS["profile_ms"] += 1
        times = []
        for _ in range(5):
            timer.flush()
            t0 = time.perf_counter()
            fn()
            timer.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


TARGET = InterpTarget(
    name="interp",
    torch_device="cpu",
    visible_env=None,
    flush_bytes=0,
    interpret=True,
    runtime_module="farm_target_interp.runtime",
    child_env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""},
    driver_env=("INTERP_",),
    profiler="interp-profiler",
    hardware="Interp test chips",
)
