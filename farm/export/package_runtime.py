"""Runtime of a kernel package written by `farm export` (copied into it as `_runtime.py`).

It imports nothing of Kernel Farm: the package must work where the farm is not installed.

The dispatch rule, the same for every op of the package. For each call, in this order:

1. the fallback is forced (environment variable KFARM_FORCE_FALLBACK=1 or <PACKAGE>_FORCE_FALLBACK=1,
   or `<package>.force_fallback(True)`): fallback;
2. no kernel of the op was verified on the inputs' device type (cuda tensors: the cuda kernel;
   npu tensors: the ascend kernel; cpu tensors: the cpu kernel), or this process cannot run it
   (no such device; the cpu kernel is Triton's interpreter and runs only when TRITON_INTERPRET=1
   was set before Triton was imported): fallback;
3. the inputs are not what the kernel was verified on (by default the exact dtypes, shapes, scalar
   values and constructor arguments of the stored seed set; KFARM_SHAPES=rank relaxes shapes to the
   same rank and scalars to the same type): fallback;
4. the kernel module cannot be imported: fallback, with a FallbackWarning naming the error (once);
5. otherwise the kernel.

The fallback is the task's PyTorch Reference (or its Model, for tasks whose Model is PyTorch).
Where there is none (a Triton task in reference-data mode), a call that would fall back raises
NoFallbackError saying why the kernel could not run. Errors raised by a kernel while it runs are
not caught: a fallback would hide them.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORCE_ENV = "KFARM_FORCE_FALLBACK"
SHAPES_ENV = "KFARM_SHAPES"
TRUE = ("1", "true", "yes", "on")

_forced: bool | None = None
_lock = threading.Lock()


class FallbackWarning(UserWarning):
    """A kernel could not be used for a reason other than the dispatch rule (its import failed)."""


class NoFallbackError(RuntimeError):
    """The kernel cannot run here and the op has no PyTorch fallback."""


def force_fallback(on: bool | None = True) -> None:
    """Force the fallback for every op (True), forbid forcing it (False), or follow the environment (None)."""
    global _forced
    _forced = on


def fallback_forced(package_env: str) -> str:
    """Why the fallback is forced, or ''."""
    if _forced is not None:
        return "force_fallback(True)" if _forced else ""
    for name in (FORCE_ENV, package_env):
        if os.environ.get(name, "").strip().lower() in TRUE:
            return f"{name}={os.environ[name]}"
    return ""


def shape_policy() -> str:
    value = os.environ.get(SHAPES_ENV, "exact").strip().lower() or "exact"
    if value not in ("exact", "rank"):
        raise ValueError(f"{SHAPES_ENV}={value!r}: use 'exact' (default) or 'rank'")
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


# ---------------------------------------------------------------- what was verified


def describe(value: Any) -> dict:
    """One forward argument as the dispatch rule compares it."""
    if isinstance(value, torch.Tensor):
        return {"kind": "tensor", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    if isinstance(value, (list, tuple)):
        return {"kind": "sequence", "items": [describe(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"kind": "scalar", "type": type(value).__name__, "value": value}
    return {"kind": "other", "type": type(value).__name__}


def mismatch(verified: dict, value: Any, policy: str, where: str) -> str:
    """'' if `value` is inside what was verified, else a short reason."""
    got = describe(value)
    if got["kind"] != verified["kind"]:
        return f"{where}: {got['kind']}, verified {verified['kind']}"
    if got["kind"] == "tensor":
        if got["dtype"] != verified["dtype"]:
            return f"{where}: dtype {got['dtype']}, verified {verified['dtype']}"
        same = got["shape"] == verified["shape"] if policy == "exact" else len(got["shape"]) == len(verified["shape"])
        return "" if same else f"{where}: shape {got['shape']}, verified {verified['shape']}"
    if got["kind"] == "sequence":
        if len(got["items"]) != len(verified["items"]):
            return f"{where}: {len(got['items'])} items, verified {len(verified['items'])}"
        for i, (v, item) in enumerate(zip(verified["items"], value)):
            why = mismatch(v, item, policy, f"{where}[{i}]")
            if why:
                return why
        return ""
    if got["type"] != verified["type"]:
        return f"{where}: {got['type']}, verified {verified['type']}"
    if got["kind"] == "scalar" and policy == "exact" and got["value"] != verified["value"]:
        return f"{where}: {got['value']!r}, verified {verified['value']!r}"
    return ""


def same_init(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
                    and x.shape == y.shape and torch.equal(x.cpu(), y.cpu())):
                return False
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            if not same_init(list(x), list(y)):
                return False
        elif x != y:
            return False
    return True


# ---------------------------------------------------------------- the op


@dataclass
class Decision:
    backend: str  # "kernel" or "fallback"
    target: str | None
    reason: str
    name: str  # backend name: triton-cuda, pytorch-reference, ...

    def as_dict(self) -> dict:
        return {"backend": self.backend, "target": self.target, "reason": self.reason, "name": self.name}


class Op:
    """One exported op: its kernels (one per target), its fallback and what each kernel was verified on."""

    def __init__(self, folder: str | Path, module: str):
        self.folder = Path(folder)
        self.module = module  # dotted name of the op's package
        self.meta = json.loads((self.folder / "op.json").read_text())
        self.name = self.meta["op"]
        self.source = self.meta["source"]
        self.targets: list[str] = sorted(self.meta["kernels"])
        self.truth = self.meta["truth"]  # "Reference", "Model" or None
        self.package_env = self.meta["package_env"]
        self._kernel_classes: dict[str, type | None] = {}
        self.kernel_errors: dict[str, str] = {}
        self._task = None
        self._default = None

    # -- pieces, imported on first use
    @property
    def has_fallback(self) -> bool:
        return self.truth is not None

    @property
    def tolerance(self) -> dict:
        return {k: tuple(v) for k, v in self.meta["tolerance"].items()}

    def init_inputs(self) -> list:
        return list(torch.load(self.folder / "init.pt", weights_only=True)["init_inputs"])

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
                except BaseException as exc:  # noqa: BLE001 - any failure to import means: use the fallback
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    why = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    self.kernel_errors[target] = why
                    self._kernel_classes[target] = None
                    warnings.warn(f"{self.source}/{self.name}: the {target} kernel failed to import ({why}); "
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
    def decide(self, inputs: tuple, init_inputs: list | None = None) -> Decision:
        forced = fallback_forced(self.package_env)
        if forced:
            return self._fallback(f"fallback forced ({forced})")
        devices = {v.device.type for v in _tensors(inputs)}
        if len(devices) > 1:
            return self._fallback(f"inputs on several devices ({', '.join(sorted(devices))})")
        device = devices.pop() if devices else "cpu"
        target = next((t for t in self.targets if self.device_type(t) == device), None)
        if target is None:
            have = ", ".join(f"{t} ({self.device_type(t)})" for t in self.targets) or "none"
            return self._fallback(f"no kernel verified for {device} tensors (kernels: {have})")
        not_ready = self.ready(target)
        if not_ready:
            return self._fallback(not_ready)
        why = self._outside(target, inputs, init_inputs)
        if why:
            return self._fallback(f"not verified for these inputs ({why})")
        if self.kernel_class(target) is None:
            return self._fallback(f"the {target} kernel failed to import ({self.kernel_errors[target]})")
        name = "triton-interpreter" if self.meta["kernels"][target].get("interpret") else f"triton-{target}"
        return Decision("kernel", target, f"verified on {self.meta['kernels'][target].get('device_name') or target}",
                        name)

    def _outside(self, target: str, inputs: tuple, init_inputs: list | None) -> str:
        policy = shape_policy()
        verified = self.meta["kernels"][target]["verified_inputs"]
        if len(inputs) != len(verified):
            return f"{len(inputs)} arguments, verified {len(verified)}"
        for i, (v, value) in enumerate(zip(verified, inputs)):
            why = mismatch(v, value, policy, f"input {i}")
            if why:
                return why
        if policy == "exact" and init_inputs is not None and not same_init(list(init_inputs), self.init_inputs()):
            return "constructor arguments differ from the verified ones"
        return ""

    def _fallback(self, reason: str) -> Decision:
        return Decision("fallback", None, reason, self.fallback_name())

    def explain(self, *inputs, init_inputs: list | None = None) -> dict:
        """What a call with these inputs would run, and why."""
        return self.decide(inputs, init_inputs).as_dict()

    # -- calls
    def __call__(self, *inputs):
        if self._default is None:
            self._default = OpModule(self, self.init_inputs())
        return self._default(*inputs)

    def run_kernel(self, target: str, *inputs, init_inputs: list | None = None):
        """The kernel alone, rule bypassed (tests compare it with the truth on fresh inputs)."""
        cls = self.kernel_class(target)
        if cls is None:
            raise RuntimeError(f"{self.source}/{self.name}: the {target} kernel does not import: {self.kernel_errors[target]}")
        model = _build(cls, self.init_inputs() if init_inputs is None else init_inputs)
        return model.to(_device_of(inputs))(*inputs)

    def run_truth(self, *inputs, init_inputs: list | None = None):
        cls = self.truth_class()
        if cls is None:
            raise NoFallbackError(f"{self.source}/{self.name} has no PyTorch fallback")
        model = _build(cls, self.init_inputs() if init_inputs is None else init_inputs)
        return model.to(_device_of(inputs))(*inputs)

    def fresh_inputs(self, seed: int, device: str = "cpu") -> list:
        """New inputs from the task's get_inputs() under the verified shape set (`seed` seeds torch)."""
        task = _fresh_task_module(self.folder / "task.py", self.meta.get("shapes"))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            values = list(task.get_inputs())
        return _to(values, device)


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
        self.fallback = _build(cls, init_inputs) if cls is not None else None
        self._kernels: dict[tuple[str, str], torch.nn.Module] = {}

    def forward(self, *inputs):
        decision = self._op.decide(inputs, self._init_inputs)
        device = _device_of(inputs)
        if decision.backend == "kernel":
            key = (decision.target, str(device))
            if key not in self._kernels:
                self._kernels[key] = _build(self._op.kernel_class(decision.target), self._init_inputs).to(device)
            return self._kernels[key](*inputs)
        if self.fallback is None:
            raise NoFallbackError(f"{self._op.source}/{self._op.name}: the kernel cannot run here ({decision.reason}) "
                                  "and the op has no PyTorch fallback (its task has no Reference and its Model "
                                  "launches Triton kernels)")
        return self.fallback.to(device)(*inputs)


def _build(cls: type, init_inputs: list) -> torch.nn.Module:
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


_fresh_count = 0


def _fresh_task_module(path: Path, shapes: str | None):
    """A private copy of the task module, with SMALL_SHAPES applied where the kernel was verified on them."""
    global _fresh_count
    _fresh_count += 1
    name = f"_kfarm_task_{_fresh_count}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and triton.jit look their module up
    spec.loader.exec_module(module)
    if shapes == "small":
        for key, value in (getattr(module, "SMALL_SHAPES", None) or {}).items():
            setattr(module, key, value)
    return module


# ---------------------------------------------------------------- checking outputs


def load_case(path: str | Path, device: str = "cpu") -> dict:
    """A stored seed set (the farm's .pt): inputs on `device`, expected outputs on the CPU."""
    data = torch.load(path, weights_only=True)
    return {"inputs": _to(list(data["inputs"]), device), "outputs": list(data["outputs"]),
            "init_inputs": list(data.get("init_inputs", [])), "seed": data.get("seed")}


def as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_outputs(actual, expected, tolerance: dict) -> None:
    """Assert the farm's tolerance policy: same structure, dtype and shape; floats within
    atol + rtol*|expected| with equal NaN/Inf positions; integers and bools exact."""
    actual, expected = as_list(actual), as_list(expected)
    assert len(actual) == len(expected), f"{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        _check_one(str(i), a, e, tolerance)


def _check_one(where: str, a, e, tolerance: dict) -> None:
    if isinstance(e, (list, tuple)):
        assert isinstance(a, (list, tuple)) and len(a) == len(e), f"output {where}: expected {len(e)} items"
        for j, (x, y) in enumerate(zip(a, e)):
            _check_one(f"{where}.{j}", x, y, tolerance)
        return
    if not isinstance(e, torch.Tensor):
        if isinstance(e, float) and isinstance(a, (int, float)):
            assert abs(a - e) <= 1e-6 * max(abs(e), 1e-12) or a == e, f"output {where}: {a!r} != {e!r}"
        else:
            assert a == e, f"output {where}: {a!r} != {e!r}"
        return
    assert isinstance(a, torch.Tensor), f"output {where}: expected a tensor, got {type(a).__name__}"
    assert a.dtype == e.dtype, f"output {where}: dtype {a.dtype}, expected {e.dtype}"
    assert a.shape == e.shape, f"output {where}: shape {list(a.shape)}, expected {list(e.shape)}"
    a, e = a.detach().cpu(), e.detach().cpu()
    if not e.is_floating_point():
        bad = int((a != e).sum())
        assert bad == 0, f"output {where}: {bad} of {e.numel()} elements differ (exact dtype {e.dtype})"
        return
    atol, rtol = tolerance.get(str(e.dtype).removeprefix("torch."), tolerance.get("float32", (1e-5, 1e-4)))
    a64, e64 = a.double(), e.double()
    assert torch.equal(torch.isnan(a64), torch.isnan(e64)), f"output {where}: NaN positions differ"
    inf = torch.isinf(e64)
    assert torch.equal(torch.isinf(a64), inf) and torch.equal(a64[inf], e64[inf]), f"output {where}: Inf differs"
    finite = torch.isfinite(e64)
    err = (a64[finite] - e64[finite]).abs()
    bound = atol + rtol * e64[finite].abs()
    bad = int((err > bound).sum())
    worst = float(err.max()) if err.numel() else 0.0
    assert bad == 0, (f"output {where}: {bad} of {int(finite.sum())} elements outside atol={atol} rtol={rtol} "
                      f"(max abs error {worst:.3g})")
