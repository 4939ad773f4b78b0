"""A sandboxed runner of device N sees the device it was given: with the pinned device's node
alone bound, the runtime inside counts one device, so the pin inside names it 0 (on an H100 host
of four GPUs, every runner of cuda:1..3 started with "No CUDA GPUs are available")."""

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from farm.evaluate import sandbox
from farm.evaluate.runner import Limits, Runner
from farm.targets import DeviceSpec, cuda, resolve_device

CPU = resolve_device("cpu")


def _gpus(monkeypatch, minors: list[int], nodes: set[str]) -> None:
    monkeypatch.setattr(cuda, "_nvidia_minors_by_bus", lambda: minors)
    real = os.path.exists
    monkeypatch.setattr(cuda.os.path, "exists", lambda p: p in nodes or (not p.startswith("/dev/nvidia") and real(p)))


@pytest.mark.parametrize("index", [0, 1, 3])
def test_a_gpu_whose_node_is_bound_alone_is_device_0_inside(monkeypatch, index):
    minors = [0, 1, 2, 3]
    _gpus(monkeypatch, minors, {f"/dev/nvidia{m}" for m in minors} | {"/dev/nvidiactl"})
    target = resolve_device(f"cuda:{index}").target
    nodes = target.sandbox_nodes(index)
    assert [n for n in nodes if n[-1].isdigit()] == [f"/dev/nvidia{index}"]
    assert resolve_device(f"cuda:{index}").child_env()["CUDA_VISIBLE_DEVICES"] == str(index)  # on the host
    assert target.sandbox_env(index) == {"CUDA_VISIBLE_DEVICES": "0"}  # inside the sandbox


def test_minor_numbers_out_of_bus_order_pin_by_bus_order(monkeypatch):
    """The driver may number nodes out of bus order: cuda:0 is the first bus id's minor (here 2)."""
    _gpus(monkeypatch, [2, 0], {"/dev/nvidia0", "/dev/nvidia2", "/dev/nvidiactl"})
    target = resolve_device("cuda:0").target
    assert "/dev/nvidia2" in target.sandbox_nodes(0) and "/dev/nvidia0" not in target.sandbox_nodes(0)
    assert target.sandbox_env(0) == {"CUDA_VISIBLE_DEVICES": "0"}


def test_where_the_node_is_unknown_every_node_is_bound_and_the_host_index_pins(monkeypatch):
    """A container showing no driver folders: all nodes bound, so the host's index still holds."""
    _gpus(monkeypatch, [], {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"})
    target = resolve_device("cuda:1").target
    assert target.sandbox_env(1) == {}


@dataclass(frozen=True)
class _OneNode(type(CPU.target)):  # type: ignore[misc]
    def sandbox_env(self, index):
        return {"CUDA_VISIBLE_DEVICES": "pinned-inside"}


def _started_env(box: Runner) -> dict[str, str]:
    box.start()
    try:
        raw = Path(f"/proc/{box.proc.pid}/environ").read_bytes().split(b"\0")
    finally:
        box.close()
    return dict(e.decode().partition("=")[::2] for e in raw if e)


def test_the_sandbox_starts_its_runner_with_the_targets_pin_inside():
    found = sandbox.probe()
    if not found.on:
        if os.environ.get("CI"):
            pytest.fail(f"no sandbox here ({found.why}): CI must run the sandbox tests")
        pytest.skip(found.why)
    spec = DeviceSpec(_OneNode(**{f: getattr(CPU.target, f) for f in CPU.target.__dataclass_fields__}), None)
    assert _started_env(Runner(spec, Limits(start_s=60), found))["CUDA_VISIBLE_DEVICES"] == "pinned-inside"
    # without the OS boundary nothing is narrowed, so the host's pin stays
    assert _started_env(Runner(spec, Limits(start_s=60), sandbox.Boundary("none", "off")))[
        "CUDA_VISIBLE_DEVICES"] == ""
