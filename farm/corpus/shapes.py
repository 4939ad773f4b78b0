"""Shapes that fit the machine: measured on the meta device, derived when a file gives none.

Both jobs work on torch's `meta` device (shapes and dtypes, no storage), so nothing is allocated:

guard      before a task's inputs are drawn for real, its inputs, the truth's parameters and
           buffers and the forward's outputs are measured; over `corpus.memory_limit_mb` the task
           stops with a TaskError naming the size, not an out-of-memory fault half way through.
derive     for the `small` shape set of a file without SMALL_SHAPES (or config shapes), the
           module's size constants are halved until the footprint fits `corpus.small_budget_mb`
           and `corpus.small_budget_mflop`, keeping what divided what and a Model that still
           runs; where nothing fits the task says so rather than run at full size as `small`.
           The rule: docs/task-format.md ("Small shapes").
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import types
from dataclasses import dataclass
from typing import Any, Callable, TypeGuard

_STRUCTURAL = {"kernel", "stride", "strides", "padding", "pad", "dilation", "dilations", "groups", "group", "axis",
               "axes"}
_AXIS_LIMIT = 8  # a `dim` constant below this is an axis index, above it a size


class NoShapes(Exception):
    """Derivation found no shapes within the budget; the message says why."""


@dataclass(frozen=True)
class ShapePolicy:
    """What the corpus settings say about shapes, carried with a TaskRef into every process."""

    small_budget_mb: float = 4.0
    small_budget_mflop: float = 1.0
    memory_limit_mb: float = 0.0  # 0: half of the memory available when the guard runs
    overrides: tuple[tuple[str, Any], ...] = ()  # small shapes from the config (per source/op)
    op_overrides: tuple[str, ...] = ()  # names given for this op itself (must exist in its file)
    space_max: int = 16384  # a derived shape space's dimensions reach at most this (farm.corpus.space)
    small_space_max: int = 64  # ... at small shapes (the interpreter runs them)

    @property
    def override_dict(self) -> dict[str, Any]:
        return dict(self.overrides)


@dataclass
class Footprint:
    input_bytes: int = 0
    param_bytes: int = 0
    output_bytes: int = 0
    flops: int = 0
    forward_ok: bool = True
    forward_error: str = ""

    @property
    def total_bytes(self) -> int:
        return self.input_bytes + self.param_bytes + self.output_bytes

    def describe(self) -> str:
        text = (f"{_mib(self.total_bytes)} (inputs {_mib(self.input_bytes)}, parameters {_mib(self.param_bytes)}, "
                f"outputs {_mib(self.output_bytes)})")
        if self.flops:
            text += f", {self.flops / 1e6:.1f} MFLOP"
        return text


def _mib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _nbytes(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0


def measure(module: types.ModuleType, cls: type, input_kwargs: dict | None = None) -> Footprint:
    """Inputs, parameters, outputs and FLOPs of one forward, all on the meta device
    (`input_kwargs`: keyword arguments of get_inputs, for a case of a shape space).

    Raises whatever get_inputs/get_init_inputs/the constructor raise; a forward that the meta
    device cannot run (data-dependent ops) is recorded, not raised."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        init_inputs = list(module.get_init_inputs())
        inputs = list(module.get_inputs(**(input_kwargs or {})))
        model = cls(*init_inputs)
    # inputs a file builds by other means (numpy, torch.tensor(list)) are real but small
    inputs = [v.to("meta") if isinstance(v, torch.Tensor) else v for v in inputs]
    model = model.to("meta")
    fp = Footprint(input_bytes=_nbytes(inputs),
                   param_bytes=sum(_nbytes(t) for t in list(model.parameters()) + list(model.buffers())))
    try:
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter, no_kernel_launches():
            out = model(*inputs)
        fp.output_bytes = _nbytes(out)
        fp.flops = int(counter.get_total_flops())
    except Exception as exc:  # noqa: BLE001 - data-dependent forwards do not run on meta
        fp.forward_ok = False
        fp.forward_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return fp


class KernelOnMeta(RuntimeError):
    """A Triton kernel was about to be launched with meta tensors."""


@contextlib.contextmanager
def no_kernel_launches():
    """Triton launches raise KernelOnMeta for the duration. A meta tensor's data_ptr() is 0:
    on a GPU, Triton would launch the kernel on null pointers, and the illegal memory access
    breaks the process's CUDA context, so every later call of the op fails (seen on an H100:
    17 of 25 bundled ops failed reference generation). The forward of a Model that launches
    Triton kernels is then recorded as not runnable on meta, like a data-dependent one."""
    import sys

    patched = []
    for module, cls in (("triton.runtime.jit", "JITFunction"), ("triton.runtime.interpreter", "InterpretedFunction")):
        owner = getattr(sys.modules.get(module), cls, None)  # only if the task imported triton
        if owner is not None and "run" in vars(owner):
            patched.append((owner, vars(owner)["run"]))
            owner.run = _refuse_launch
    try:
        yield
    finally:
        for owner, run in patched:
            owner.run = run


def _refuse_launch(self, *args, **kwargs):
    raise KernelOnMeta(f"Triton kernel {getattr(self, '__name__', '?')} not launched on the meta device")


def memory_limit_bytes(policy: ShapePolicy) -> int:
    if policy.memory_limit_mb > 0:
        return int(policy.memory_limit_mb * 2**20)
    return available_bytes() // 2


def available_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


# ---------------------------------------------------------------- derivation


def _code_names(fn: Callable) -> set[str]:
    names: set[str] = set()
    todo = [getattr(fn, "__code__", None)]
    while todo:
        code = todo.pop()
        if code is None:
            continue
        names |= set(code.co_names)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return names


def _structural(name: str, value: int) -> bool:
    segments = set(re.split(r"_+", re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()))
    segments |= {re.sub(r"\d+$", "", s) for s in segments}
    if segments & _STRUCTURAL or any(s.startswith("kernel") for s in segments):
        return True
    return bool({"dim", "reduce"} & segments) and value < _AXIS_LIMIT and "dim" in name.lower()


def _is_size(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def size_constants(module: types.ModuleType) -> tuple[dict[str, Any], dict[str, Any]]:
    """(scalable, structural) module globals read by get_inputs/get_init_inputs."""
    read = _code_names(module.get_inputs) | _code_names(module.get_init_inputs)
    scalable: dict[str, Any] = {}
    fixed: dict[str, Any] = {}
    for name in sorted(read):
        value = module.__dict__.get(name)
        if _is_size(value):
            (fixed if _structural(name, value) or value < 1 else scalable)[name] = value
        elif isinstance(value, tuple) and value and all(_is_size(v) for v in value):
            (fixed if _structural(name, max(value)) else scalable)[name] = value
    return scalable, fixed


def _units(scalable: dict[str, Any]) -> list[tuple[str, int | None]]:
    """(name, tuple index or None) for every scalable int."""
    out: list[tuple[str, int | None]] = []
    for name, value in scalable.items():
        if isinstance(value, tuple):
            out += [(name, i) for i in range(len(value))]
        else:
            out.append((name, None))
    return out


def _assign(module: types.ModuleType, original: dict[str, Any], values: dict[tuple[str, int | None], int]) -> dict:
    """Module globals for unit values; returns the override dict."""
    new: dict[str, Any] = {}
    for name, orig in original.items():
        if isinstance(orig, tuple):
            new[name] = tuple(values.get((name, i), v) for i, v in enumerate(orig))
        else:
            new[name] = values.get((name, None), orig)
    for name, value in new.items():
        setattr(module, name, value)
    return new


def _divisibility(orig: dict[tuple, int], fixed: dict[str, Any]) -> list[tuple[Any, Any]]:
    """Pairs (size unit a, structural int b) with a % b == 0 at the original values (channels by
    groups). Relations among size constants are kept by halving them (powers of two stay
    divisible) and checked by the meta forward (a view that no longer fits fails there)."""
    pool: dict[Any, int] = dict(orig)
    for name, value in fixed.items():
        if _is_size(value):
            pool[("fixed", name)] = value
    pairs = []
    for a, va in pool.items():
        for b, vb in pool.items():
            if a != b and a[0] != "fixed" and b[0] == "fixed" and 1 < vb < va and va % vb == 0:
                pairs.append((a, b))
    return pairs


def derive(module: types.ModuleType, cls: type, policy: ShapePolicy,
           fixed_names: tuple[str, ...] = ()) -> tuple[dict[str, Any], Footprint, str]:
    """Scale the module's size constants down until the footprint fits the small budget.

    Leaves the module at the derived values; returns (overrides, footprint, note). Raises
    NoShapes with the reason when it cannot."""
    budget = policy.small_budget_mb * 2**20
    flop_budget = policy.small_budget_mflop * 1e6
    scalable, fixed = size_constants(module)
    for name in fixed_names:
        if name in scalable:
            fixed[name] = scalable.pop(name)
    try:
        fp = measure(module, cls)
    except Exception as exc:  # noqa: BLE001
        raise NoShapes(f"the file cannot be measured on the meta device: {type(exc).__name__}: {exc}") from None

    def fits(f: Footprint) -> bool:
        return f.total_bytes <= budget and f.flops <= flop_budget

    if fits(fp):
        return {}, fp, f"its own shapes fit the budget ({fp.describe()})"
    if not scalable:
        raise NoShapes(f"{fp.describe()} is over the small budget and get_inputs/get_init_inputs read no "
                       "module-level size constant to scale")
    units = _units(scalable)
    orig = {u: (scalable[u[0]][u[1]] if u[1] is not None else scalable[u[0]]) for u in units}
    groups: dict[int, list] = {}
    for u, v in orig.items():
        groups.setdefault(v, []).append(u)
    pairs = _divisibility(orig, fixed)
    values = dict(orig)
    frozen: set[int] = set()
    original_forward_ok = fp.forward_ok
    steps = 0
    while not fits(fp):
        movable = [g for g in groups if g not in frozen and values[groups[g][0]] > 1]
        if not movable:
            _assign(module, scalable, values)
            if fp.total_bytes <= budget:
                # memory is the hard limit; compute only makes the interpreter slow
                break
            raise NoShapes(f"scaled {', '.join(sorted(scalable))} as far as the Model allows and still need "
                           f"{fp.describe()}, over the small budget ({policy.small_budget_mb:g} MiB, "
                           f"{policy.small_budget_mflop:g} MFLOP)")
        key = max(movable, key=lambda g: values[groups[g][0]])
        trial = dict(values)
        for u in groups[key]:
            step = math.lcm(*[fixed[b[1]] for a, b in pairs if a == u] or [1])
            trial[u] = max(step, math.ceil(math.ceil(values[u] / 2) / step) * step)
        if any(trial[u] >= values[u] for u in groups[key]) or not _divides(trial, pairs, fixed):
            frozen.add(key)
            continue
        _assign(module, scalable, trial)
        try:
            new_fp = measure(module, cls)
        except Exception:  # noqa: BLE001 - these shapes are not valid for the Model
            frozen.add(key)
            _assign(module, scalable, values)
            continue
        if original_forward_ok and not new_fp.forward_ok:
            frozen.add(key)
            _assign(module, scalable, values)
            continue
        values, fp = trial, new_fp
        steps += 1
    overrides = _assign(module, scalable, values)
    overrides = {k: v for k, v in overrides.items() if v != scalable[k]}
    note = f"derived in {steps} halvings: {fp.describe()}"
    if not fits(fp):
        note += f" (the smallest the file allows; over the {policy.small_budget_mflop:g} MFLOP compute budget)"
    if not fp.forward_ok:
        note += f" (forward not measurable on meta: {fp.forward_error}; inputs and parameters only)"
    return overrides, fp, note


def _divides(values: dict, pairs: list, fixed: dict) -> bool:
    def val(u):
        return fixed[u[1]] if u[0] == "fixed" else values[u]

    return all(val(a) % val(b) == 0 for a, b in pairs)
