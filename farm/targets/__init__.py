"""Targets: the kinds of device the farm runs kernels on, as plug-ins.

Built in: cuda, ascend, cpu (farm.targets.builtin). Another installed package adds one by
exposing a `farm.targets.base.Target` under the entry-point group `farm.targets`, the way
Triton takes third-party backends; `farm run --target NAME` then runs the whole flow on it
(docs/architecture.md, "adding a target").

The parent process (CLI, worker supervisor) never initialises a device: it only resolves a
`DeviceSpec` and hands the child the environment that pins it. Device work happens in
children (farm.runtime.children).

May import: farm.errors only (it is the lowest stage after the shared modules). The ascend
target, defined with the rest of Ascend a stage above (farm.ascend.target), is loaded by name
when the registry is first read, as a plug-in's entry point is.
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import entry_points

from farm.errors import FarmError
from farm.targets.base import Target
from farm.targets.builtin import BUILTIN, LAZY, ORDER

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "farm.targets"

__all__ = ["Target", "DeviceSpec", "available", "builtin_targets", "get_target", "known", "accelerator_present",
           "resolve_device", "usable_device", "through_mask", "import_device_runtime", "synchronize", "device_name", "has_device",
           "on_this_host"]


def _load(value: str) -> Target:
    module, _, attr = value.partition(":")
    return getattr(importlib.import_module(module), attr)


@lru_cache(maxsize=1)
def available() -> dict[str, Target]:
    """Every target: the built-in ones, then those installed packages register."""
    builtin = {**BUILTIN, **{t.name: t for t in map(_load, LAZY)}}
    found = {name: builtin[name] for name in ORDER if name in builtin} | builtin
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found:
            continue  # a plug-in never replaces a built-in target
        try:
            target = ep.load()
        except Exception as exc:  # noqa: BLE001 -- one broken plug-in must not take the farm down
            log.warning("target plug-in %s (%s) cannot be loaded: %s", ep.name, ep.value, exc)
            continue
        if not isinstance(target, Target) or target.name != ep.name:
            log.warning("target plug-in %s (%s) is not a farm.targets.Target named %s", ep.name, ep.value, ep.name)
            continue
        found[ep.name] = target
    return found


def _aliases() -> dict[str, str]:
    """Other names of targets (ascend's torch name, npu); a target's own name comes first."""
    targets = available()
    return {alias: t.name for t in targets.values() for alias in t.aliases if alias not in targets}


def builtin_targets() -> list[Target]:
    """The targets the farm ships (cuda, ascend, cpu), in their order."""
    return [available()[name] for name in ORDER]


def get_target(name: str, option: str = "--target") -> Target:
    name = _aliases().get(name, name)
    targets = available()
    if name not in targets:
        raise FarmError(f"unknown target '{name}' ({option}): use {', '.join(targets)}")
    return targets[name]


def known(name: str | None) -> Target | None:
    """The target of that name, or None where it is not installed here (a run or kernel in the
    store made by a plug-in target this host lacks: callers then say less, not fail)."""
    if not name:
        return None
    return available().get(_aliases().get(name, name))


@dataclass(frozen=True)
class DeviceSpec:
    target: Target
    index: int | None  # physical index to pin; None for a target with no device to pin (cpu)

    @property
    def label(self) -> str:
        if self.index is None:
            return self.target.label or self.target.name
        return f"{self.target.name}:{self.index}"

    @property
    def torch_device(self) -> str:
        """Inside the pinned child the device is always index 0."""
        return self.target.torch_device if self.index is None else f"{self.target.torch_device}:0"

    def child_env(self) -> dict[str, str]:
        return self.target.pin_env(self.index)


def accelerator_present() -> str | None:
    """Which accelerator this host has, judged from device nodes: never initialises a runtime."""
    for target in available().values():
        if target.present():
            return target.name
    for target in available().values():
        if target.visible_by_env():
            return target.name
    return None


def usable_device(text: str | int | None, default_target: str = "auto", option: str = "--device",
                  notify=None) -> DeviceSpec:
    """resolve_device for work in this process and its children, on this host (on_this_host:
    a stand-in where one exists); a target the installed packages cannot run (a CPU-only torch
    asked for cuda) is an error now, not one per op."""
    spec = on_this_host(through_mask(resolve_device(text, default_target, option), option), notify)
    why = spec.target.unusable()
    if why:
        raise FarmError(f"target {spec.target.name} ({option} {text}): {why}")
    return spec


def through_mask(spec: DeviceSpec, option: str = "--device") -> DeviceSpec:
    """The device the user's environment means. Under CUDA_VISIBLE_DEVICES=2,3 (a scheduler's
    share of the host, or a user picking a GPU) cuda:0 is the host's GPU 2, as in every CUDA
    program; the farm numbers devices by host index (its labels, locks and children's pins), so
    the mask is read once, where the user names a device, and never again in a child."""
    var = spec.target.visible_env
    mask = os.environ.get(var, "").strip() if var else ""
    if spec.index is None or not mask or not var:
        return spec
    shown = [part.strip() for part in mask.split(",")]
    if not all(part.isdigit() for part in shown):
        raise FarmError(f"{var}={mask}: the farm pins {spec.target.name} devices by their index on the host and "
                        f"cannot place names or UUIDs; set {var} to indices (e.g. 2,3) or unset it and use "
                        f"{option} {spec.target.name}:<host index>")
    if spec.index >= len(shown):
        raise FarmError(f"{option} {spec.label}: {var}={mask} shows {len(shown)} device(s), numbered "
                        f"{spec.target.name}:0..{len(shown) - 1} (host index {', '.join(shown)})")
    return DeviceSpec(spec.target, int(shown[spec.index]))


def resolve_device(text: str | int | None, default_target: str = "auto", option: str = "--device") -> DeviceSpec:
    """Parse --device: 'cpu', 'cuda', 'cuda:1', 'npu:0', 'ascend:2', a plug-in's name, 'auto', or a bare index."""
    raw = "auto" if text in (None, "") else str(text).strip().lower()
    name, _, idx = raw.partition(":")
    if name.isdigit() and not idx:
        name, idx = default_target, name
    name = _aliases().get(name, name)
    if name == "auto":
        name = accelerator_present() or "cpu"
    targets = available()
    if name not in targets:
        raise FarmError(f"unknown device '{text}' ({option}): use {', '.join(f'{t}[:N]' for t in targets)}, "
                        "auto, or N")
    target = targets[name]
    if target.stand_in is not None and f"{name}:{idx}" == target.stand_in.label:  # ascend:cpu, asked for by name
        return DeviceSpec(target.stand_in, None)
    if target.visible_env is None:
        if idx:
            raise FarmError(f"target {name} has no devices to number: '{text}' ({option}) takes no index")
        return DeviceSpec(target, None)
    if idx and not idx.isdigit():
        raise FarmError(f"device index in '{text}' ({option}) must be a number >= 0")
    return DeviceSpec(target, int(idx) if idx else 0)


def has_device(target: Target) -> bool:
    return target.present()


def on_this_host(spec: DeviceSpec, notify=None) -> DeviceSpec:
    """The spec to use here: a target with a stand-in (ascend) whose device this host lacks
    runs as that stand-in, and `notify` is told so (never silently)."""
    stand_in = spec.target.stand_in
    if stand_in is None or has_device(spec.target):
        return spec
    if notify is not None:
        notify(f"no {spec.target.name} device on this host: running as {stand_in.label} "
               f"({stand_in.device_name()}; kernels compiled by the target's frontend check where it is configured)")
    return DeviceSpec(stand_in, None)


def import_device_runtime(spec: DeviceSpec) -> None:
    """In a child: load what the device needs (torch_npu registers the 'npu' device) and name
    the target's Triton driver (Triton refuses to guess between two active ones)."""
    spec.target.import_runtime()
    spec.target.choose_triton_driver()


def synchronize(spec: DeviceSpec) -> None:
    spec.target.synchronize()


def device_name(spec: DeviceSpec) -> str:
    """Human name of the pinned device; call only inside the child."""
    return spec.target.device_name()
