"""Runtime of a kernel package written by `farm export` (copied into it as `_runtime.py`).

It imports nothing of Kernel Farm: the package must work where the farm is not installed.

The dispatch rule, the same for every op of the package. For each call, in this order:

1. the fallback is forced (environment variable KFARM_FORCE_FALLBACK=1 or <PACKAGE>_FORCE_FALLBACK=1,
   or `<package>.force_fallback(True)`): fallback;
2. gradients are needed (grad mode on and an input or parameter requires grad) and the op has no
   verified backward kernel: fallback (KFARM_GRAD=raise, or `<package>.on_grad("raise")`, raises
   KernelGradError instead); the result is never cut from the autograd graph;
3. no kernel of the op was verified on the inputs' device type (cuda tensors: the cuda kernel;
   npu tensors: the ascend kernel; cpu tensors: the cpu kernel), or this process cannot run it
   (no such device; the cpu kernel is Triton's interpreter and runs only when TRITON_INTERPRET=1
   was set before Triton was imported): fallback;
4. the inputs are outside the kernel's verified envelope (the shapes of the task's shape space,
   within its ranges, and the dtypes the kernel was checked at; where the export could not check
   the space, the stored seed set's exact shapes) or the constructor arguments differ from the
   verified ones: fallback (KFARM_SHAPES=rank accepts any shape of the same rank: unverified);
   so are the exact shapes of a timed case where the kernel was slower than the original
   (best.json's slower_cases: rule "slower", counted like every fallback);
5. the kernel module cannot be imported: fallback, with a FallbackWarning naming the error (once);
6. otherwise the kernel.

Rules 2 and 4 warn once per op (FallbackWarning); every call is counted (`<package>.stats()`)
and `explain(*inputs)` says which rule decided. The fallback is the task's PyTorch Reference
(or its Model, for tasks whose Model is PyTorch). Where there is none (a Triton task in
reference-data mode), a call that would fall back raises NoFallbackError saying why the kernel
could not run. Errors raised by a kernel while it runs are not caught: a fallback would hide them.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import json
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from farm.export.package_envelope import describe, outside, same_init, slower

FORCE_ENV = "KFARM_FORCE_FALLBACK"
SHAPES_ENV = "KFARM_SHAPES"
GRAD_ENV = "KFARM_GRAD"
TRUE = ("1", "true", "yes", "on")

_forced: bool | None = None
_grad_mode: str | None = None
_lock = threading.Lock()
_stats: dict[str, dict] = {}
_warned: set[tuple[str, str]] = set()


class FallbackWarning(UserWarning):
    """A call fell back for a reason a user can act on (outside the envelope, gradients, import)."""


class NoFallbackError(RuntimeError):
    """The kernel cannot run here and the op has no PyTorch fallback."""


class KernelGradError(RuntimeError):
    """Gradients were needed from an op with no verified backward kernel, and KFARM_GRAD=raise."""


def force_fallback(on: bool | None = True) -> None:
    """Force the fallback for every op (True), forbid forcing it (False), or follow the environment (None)."""
    global _forced
    _forced = on


@contextlib.contextmanager
def fallback_only():
    """The PyTorch fallback for every op inside the block (the reference a test compares with)."""
    global _forced
    prior = _forced
    _forced = True
    try:
        yield
    finally:
        _forced = prior


def on_grad(mode: str | None) -> None:
    """What a forward-only op does when gradients are needed: "fallback" (default), "raise", or
    None to follow KFARM_GRAD."""
    global _grad_mode
    if mode not in (None, "fallback", "raise"):
        raise ValueError(f"on_grad({mode!r}): use 'fallback', 'raise' or None")
    _grad_mode = mode


def grad_mode() -> str:
    if _grad_mode is not None:
        return _grad_mode
    value = os.environ.get(GRAD_ENV, "fallback").strip().lower() or "fallback"
    if value not in ("fallback", "raise"):
        raise ValueError(f"{GRAD_ENV}={value!r}: use 'fallback' (default) or 'raise'")
    return value


def stats() -> dict[str, dict]:
    """Calls per op since import (or reset_stats): kernel, fallback, and fallbacks by rule."""
    with _lock:
        return copy.deepcopy(_stats)


def stats_state() -> tuple[dict, bool | None]:
    """What patch()'s swap checks leave untouched: the counters and the forced-fallback setting."""
    with _lock:
        return copy.deepcopy(_stats), _forced


def restore_state(state: tuple[dict, bool | None]) -> None:
    global _forced
    with _lock:
        _stats.clear()
        _stats.update(state[0])
    _forced = state[1]


def reset_stats() -> None:
    with _lock:
        _stats.clear()
        _warned.clear()


def fallback_forced(package_env: str) -> str:
    """Why the fallback is forced, or ''."""
    if _forced is not None:
        return "force_fallback(True)" if _forced else ""
    for name in (FORCE_ENV, package_env):
        if os.environ.get(name, "").strip().lower() in TRUE:
            return f"{name}={os.environ[name]}"
    return ""


def shape_policy() -> str:
    value = os.environ.get(SHAPES_ENV, "envelope").strip().lower() or "envelope"
    if value == "exact":
        value = "envelope"  # the name of the old default
    if value not in ("envelope", "rank"):
        raise ValueError(f"{SHAPES_ENV}={value!r}: use 'envelope' (default) or 'rank'")
    return value


def device_ready(device_type: str, interpret: bool) -> str:
    """'' if this process can run a kernel made for `device_type`, else why not."""
    if interpret:
        return "" if os.environ.get("TRITON_INTERPRET") == "1" else \
            "this kernel runs in Triton's interpreter: set TRITON_INTERPRET=1 before importing triton"
    if device_type == "cpu":
        return ""
    module = getattr(torch, device_type, None)
    try:
        return "" if module is not None and module.is_available() else f"no {device_type} device"
    except Exception:  # noqa: BLE001 - a half-installed device runtime means: no device
        return f"no {device_type} device"


# ---------------------------------------------------------------- the op


@dataclass
class Decision:
    backend: str  # "kernel" or "fallback"
    target: str | None
    reason: str
    name: str  # backend name: triton-cuda, pytorch-reference, ...
    rule: str = "kernel"  # forced, grad, device, envelope, init, import, kernel

    def as_dict(self) -> dict:
        return {"backend": self.backend, "target": self.target, "reason": self.reason, "name": self.name,
                "rule": self.rule}


class Op:
    """One exported op: its kernels (one per target), its fallback and each kernel's envelope."""

    def __init__(self, folder: str | Path, module: str):
        self.folder = Path(folder)
        self.module = module  # dotted name of the op's package
        self.meta = json.loads((self.folder / "op.json").read_text())
        self.name = self.meta["op"]
        self.source = self.meta["source"]
        self.key = f"{self.source}/{self.name}"
        self.targets: list[str] = sorted(self.meta["kernels"])
        self.truth = self.meta["truth"]  # "Reference", "Model" or None
        self.package_env = self.meta["package_env"]
        self.backward = bool(self.meta.get("backward"))
        self._kernel_classes: dict[str, type | None] = {}
        self.kernel_errors: dict[str, str] = {}
        self._task = None
        self._default = None
        self._init: list | None = None

    @property
    def has_fallback(self) -> bool:
        return self.truth is not None

    @property
    def tolerance(self) -> dict:
        return {k: tuple(v) for k, v in self.meta["tolerance"].items()}

    def init_inputs(self) -> list:
        if self._init is None:
            self._init = list(torch.load(self.folder / "init.pt", weights_only=True)["init_inputs"])
        return list(self._init)

    def envelope(self, target: str) -> dict:
        return self.meta["kernels"][target]["envelope"]

    def task_module(self):
        """The task file as copied (Reference, Model, get_inputs, get_init_inputs)."""
        if self._task is None:
            self._task = importlib.import_module(f"{self.module}.task")
        return self._task

    def truth_class(self) -> type | None:
        return getattr(self.task_module(), self.truth) if self.truth else None

    def kernel_class(self, target: str) -> type | None:
        """ModelNew of the target's kernel, or None (with a FallbackWarning, once) if it cannot be imported."""
        with _lock:
            if target not in self._kernel_classes:
                try:
                    mod = importlib.import_module(f"{self.module}.{self.meta['kernels'][target]['module']}")
                    self._kernel_classes[target] = mod.ModelNew
                except BaseException as exc:
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    why = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    self.kernel_errors[target] = why
                    self._kernel_classes[target] = None
                    warnings.warn(f"{self.key}: the {target} kernel failed to import ({why}); "
                                  f"using the {self.fallback_name()} instead", FallbackWarning, stacklevel=4)
            return self._kernel_classes[target]

    def device_type(self, target: str) -> str:
        """The torch device type of a target's tensors (cuda, npu, cpu, or a plug-in target's)."""
        return self.meta["kernels"][target]["device_type"]

    def ready(self, target: str) -> str:
        """'' if this process can run the target's kernel, else why not."""
        k = self.meta["kernels"][target]
        return device_ready(k["device_type"], bool(k.get("interpret")))

    def fallback_name(self) -> str:
        return {"Reference": "pytorch-reference", "Model": "pytorch-model"}.get(self.truth or "", "no fallback")

    # -- the rule
    def decide(self, inputs: tuple, init_inputs: list | None = None, needs_grad: bool = False) -> Decision:
        forced = fallback_forced(self.package_env)
        if forced:
            return self._fallback(f"fallback forced ({forced})", "forced")
        if needs_grad and not self.backward:
            return self._fallback("gradients are needed and the op has no verified backward kernel", "grad")
        devices = {v.device.type for v in _tensors(inputs)}
        if len(devices) > 1:
            return self._fallback(f"inputs on several devices ({', '.join(sorted(devices))})", "device")
        device = devices.pop() if devices else "cpu"
        target = next((t for t in self.targets if self.device_type(t) == device), None)
        if target is None:
            have = ", ".join(f"{t} ({self.device_type(t)})" for t in self.targets) or "none"
            return self._fallback(f"no kernel verified for {device} tensors (kernels: {have})", "device")
        not_ready = self.ready(target)
        if not_ready:
            return self._fallback(not_ready, "device")
        policy = shape_policy()
        why = outside(self.envelope(target), inputs, loose=policy == "rank")
        if why:
            return self._fallback(f"outside the verified envelope ({why})", "envelope")
        why = "" if policy == "rank" else slower(self.envelope(target), inputs)
        if why:
            return self._fallback(f"slower than the original here ({why})", "slower")
        if policy != "rank" and init_inputs is not None and not same_init(list(init_inputs), self.init_inputs()):
            return self._fallback("constructor arguments differ from the verified ones", "init")
        if self.kernel_class(target) is None:
            return self._fallback(f"the {target} kernel failed to import ({self.kernel_errors[target]})", "import")
        name = "triton-interpreter" if self.meta["kernels"][target].get("interpret") else f"triton-{target}"
        return Decision("kernel", target, f"verified on {self.meta['kernels'][target].get('device_name') or target}",
                        name)

    def _fallback(self, reason: str, rule: str) -> Decision:
        return Decision("fallback", None, reason, self.fallback_name(), rule)

    def record(self, decision: Decision) -> None:
        """Count the call; warn once per op and rule where the user can act on it."""
        with _lock:
            entry = _stats.setdefault(self.key, {"kernel": 0, "fallback": 0, "by_rule": {}, "last_fallback": None})
            entry[decision.backend] += 1
            if decision.backend == "fallback":
                entry["by_rule"][decision.rule] = entry["by_rule"].get(decision.rule, 0) + 1
                entry["last_fallback"] = decision.reason
            # without a fallback the call raises NoFallbackError instead: nothing to warn about
            warn = (decision.rule in ("envelope", "grad", "init") and self.has_fallback
                    and (self.key, decision.rule) not in _warned)
            if warn:
                _warned.add((self.key, decision.rule))
        if warn:
            warnings.warn(f"{self.key}: {decision.reason}; using the {self.fallback_name()} (this warning shows once "
                          "per op; stats() counts every call)", FallbackWarning, stacklevel=5)

    def explain(self, *inputs, init_inputs: list | None = None) -> dict:
        """What a call with these inputs would run, and why (gradients as the inputs ask)."""
        return self.decide(inputs, init_inputs, _needs_grad(inputs, ())).as_dict()

    # -- calls
    def __call__(self, *inputs):
        if self._default is None:
            self._default = OpModule(self, self.init_inputs())
        return self._default(*inputs)

    def run_kernel(self, target: str, *inputs, init_inputs: list | None = None):
        """The kernel alone, rule bypassed (tests compare it with the truth on fresh inputs)."""
        cls = self.kernel_class(target)
        if cls is None:
            raise RuntimeError(f"{self.key}: the {target} kernel does not import: {self.kernel_errors[target]}")
        model = build(cls, self.init_inputs() if init_inputs is None else init_inputs)
        return model.to(_device_of(inputs))(*inputs)

    def run_truth(self, *inputs, init_inputs: list | None = None):
        cls = self.truth_class()
        if cls is None:
            raise NoFallbackError(f"{self.key} has no PyTorch fallback")
        model = build(cls, self.init_inputs() if init_inputs is None else init_inputs)
        return model.to(_device_of(inputs))(*inputs)

    def fresh_inputs(self, seed: int, device: str = "cpu", values: dict | None = None, dtype: str | None = None) -> list:
        """New inputs from the task's get_inputs() at the verified shape set, or at a case of its
        space (`values` of its dimensions, `dtype`); `seed` seeds torch."""
        task = _fresh_task_module(self.folder / "task.py", self.meta.get("shape_overrides") or {})
        space = self.meta.get("space") or {}
        if any(d["name"].startswith("get_inputs.") for d in space.get("dims", [])):
            from farm.corpus.case_locals import expose_locals

            path = self.folder / "task.py"
            expose_locals(task, path.read_text(), str(path))
        kwargs = {}
        for dim in space.get("dims", []):
            if values and dim["name"] in values:
                if dim.get("keyword"):
                    kwargs[dim["name"]] = values[dim["name"]]
                else:
                    _set_value(task, dim["name"], values[dim["name"]])
        if dtype and space.get("dtype_name"):
            if space.get("dtype_keyword"):
                kwargs[space["dtype_name"]] = getattr(torch, dtype)
            else:
                setattr(task, space["dtype_name"], getattr(torch, dtype))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            values_ = list(task.get_inputs(**kwargs))
        return _to(values_, device)


def _needs_grad(inputs, params) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in list(_tensors(inputs)) + list(params))


class OpModule(torch.nn.Module):
    """nn.Module form of an op: OpModule(op, init_inputs); the generated class binds `op`."""

    op: Op

    def __init__(self, *args):
        op = getattr(type(self), "op", None)
        if isinstance(op, Op):
            init_inputs = list(args)
        else:
            op, init_inputs = args[0], list(args[1])
        super().__init__()
        self._op = op
        self._init_inputs = init_inputs
        cls = op.truth_class()
        self.fallback = build(cls, init_inputs) if cls is not None else None
        self._kernels: dict[tuple[str, str], torch.nn.Module] = {}
        self._library = None

    def kernel_module(self, target: str, device) -> torch.nn.Module:
        key = (target, str(device))
        if key not in self._kernels:
            self._kernels[key] = build(self._op.kernel_class(target), self._init_inputs).to(device)
        return self._kernels[key]

    def forward(self, *inputs):
        params = list(self.fallback.parameters()) if self.fallback is not None else []
        needs_grad = _needs_grad(inputs, params)
        if needs_grad and not self._op.backward and not fallback_forced(self._op.package_env):
            decision = self._op._fallback("gradients are needed and the op has no verified backward kernel", "grad")
            if grad_mode() == "raise":
                raise KernelGradError(f"{self._op.key}: {decision.reason} ({GRAD_ENV}=raise); call it under "
                                      "torch.no_grad(), or let it fall back (KFARM_GRAD=fallback)")
            if not torch.compiler.is_compiling():
                self._op.record(decision)
            return self.run_fallback(decision, inputs)
        library = self.library_op()
        if library is not None:
            return library(*inputs)
        # the fallback's parameters are the module's: a kernel uses them too, so training updates one set
        return self.run(inputs, dict(self.fallback.named_parameters()) if self.fallback is not None else None)

    def library_op(self):
        """This op as a torch.library custom op, or None where it cannot be one (_library.py)."""
        if self._library is None:
            from farm.export.package_library import custom_op

            self._library = custom_op(self, OpModule) or False
        return self._library or None

    def run(self, inputs: tuple, params: dict | None = None):
        """The rule, then the kernel or the fallback (eager; the custom op calls this too)."""
        decision = self._op.decide(inputs, self._init_inputs)
        self._op.record(decision)
        if decision.backend == "kernel":
            module = self.kernel_module(decision.target, _device_of(inputs))
            return _call(module, inputs, params)
        return self.run_fallback(decision, inputs, params)

    def run_fallback(self, decision: Decision, inputs: tuple, params: dict | None = None):
        if self.fallback is None:
            raise NoFallbackError(f"{self._op.key}: the kernel cannot run here ({decision.reason}) and the op has no "
                                  "PyTorch fallback (its task has no Reference and its Model launches Triton kernels)")
        return _call(self.fallback.to(_device_of(inputs)), inputs, params)


def _call(module: torch.nn.Module, inputs: tuple, params: dict | None):
    if not params:
        return module(*inputs)
    return torch.func.functional_call(module, params, tuple(inputs), strict=False)


def build(cls: type, init_inputs: list) -> torch.nn.Module:
    # The farm builds every model under seed 0, so kernel and fallback get the same parameters.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return cls(*init_inputs).eval()


def _tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


def _device_of(inputs) -> torch.device:
    return next((t.device for t in _tensors(inputs)), torch.device("cpu"))


def _to(values, device):
    if isinstance(values, torch.Tensor):
        return values.to(device)
    if isinstance(values, (list, tuple)):
        return type(values)(_to(v, device) for v in values)
    return values


def _set_value(module, name: str, value: int) -> None:
    """A space dimension: a module constant, one element of a tuple constant (`SHAPE[0]`), or a
    literal inside get_inputs (`get_inputs.batch_size`, read through __farm_case__)."""
    if name.startswith("get_inputs."):
        module.__dict__.setdefault("__farm_case__", {})[name] = value
    elif name.endswith("]") and "[" in name:
        root, index = name[:-1].split("[")
        items = list(getattr(module, root))
        items[int(index)] = value
        setattr(module, root, tuple(items))
    else:
        setattr(module, name, value)


_fresh_count = 0


def _fresh_task_module(path: Path, overrides: dict):
    """A private copy of the task module at the verified shape set (the constants the farm set)."""
    global _fresh_count
    _fresh_count += 1
    name = f"_kfarm_task_{_fresh_count}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py path always has both
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and triton.jit look their module up
    spec.loader.exec_module(module)
    for key, value in overrides.items():
        setattr(module, key, tuple(value) if isinstance(value, list) else value)
    return module


__all__ = ["FORCE_ENV", "GRAD_ENV", "SHAPES_ENV", "Decision", "FallbackWarning", "KernelGradError",
           "NoFallbackError", "Op", "OpModule", "build", "describe", "fallback_only", "force_fallback", "on_grad", "reset_stats",
           "stats"]
