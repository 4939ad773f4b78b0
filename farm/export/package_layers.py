"""Drop-in layers and `patch(model)` (copied into an exported package as `_layers.py`).

Imports nothing of Kernel Farm. A catalogue of the layers a model team swaps (RMSNorm,
LayerNorm, SiLU, GELU, the SwiGLU MLP), each with its PyTorch meaning. `farm export` finds
which exported op implements which layer by behaviour, not by name: it computes each layer's
meaning from the op's stored seed set under every assignment of the op's arguments to the
layer's roles (x, weight, eps, ...) and keeps an assignment whose result equals the stored
outputs (`recognise`). The package lists what it found in LAYERS; the modules here call the
op with that assignment, flattening leading dimensions to the rank the kernel was verified at
(a [batch, seq, hidden] activation becomes [batch*seq, hidden] rows).

`patch(model)` walks the model, and swaps each module it recognises (a class named *RMSNorm
with weight and eps, nn.LayerNorm, nn.SiLU/GELU and the Hugging Face activation classes, an
MLP with gate_proj/up_proj/down_proj and a SiLU act_fn) for the drop-in, reusing the module's
own parameters, but only after a swap check: the original and the drop-in (its PyTorch
fallback) must give the same output on a random input; a layer that differs (GemmaRMSNorm's 1 + weight)
is left alone and reported. Like Liger-Kernel's apply_* functions, with a report of what was
swapped.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


def _rms(r, i):
    x = r["x"]
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + i["eps"])).to(x.dtype) * r["weight"]


def _half(x):
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]


# kind -> (forward roles, constructor roles, meaning); every meaning in float32, cast back
KINDS = {
    "rms_norm": (("x", "weight"), ("eps",), _rms),
    "layer_norm": (("x", "weight", "bias"), ("eps",), lambda r, i: F.layer_norm(
        r["x"].float(), (r["x"].shape[-1],), r["weight"].float(), r["bias"].float(), i["eps"]).to(r["x"].dtype)),
    "silu": (("x",), (), lambda r, i: F.silu(r["x"].float()).to(r["x"].dtype)),
    "gelu": (("x",), (), lambda r, i: F.gelu(r["x"].float()).to(r["x"].dtype)),
    "gelu_tanh": (("x",), (), lambda r, i: F.gelu(r["x"].float(), approximate="tanh").to(r["x"].dtype)),
    "swiglu": (("gate", "up"), (), lambda r, i: (F.silu(r["gate"].float()) * r["up"].float()).to(r["gate"].dtype)),
    "silu_and_mul": (("x",), (), lambda r, i: (F.silu(_half(r["x"])[0].float()) * _half(r["x"])[1].float())
                     .to(r["x"].dtype)),
}
ROWWISE = ("x", "gate", "up")  # roles whose leading dimensions are rows


def recognise(inputs: list, init_inputs: list, outputs: list, tolerance: dict) -> list[dict]:
    """The layer kinds the op's stored seed set behaves as, with the argument assignment."""
    if len(outputs) != 1 or not isinstance(outputs[0], torch.Tensor) or not outputs[0].is_floating_point():
        return []
    expected = outputs[0]
    atol, rtol = tolerance.get(str(expected.dtype).removeprefix("torch."), (1e-5, 1e-4))
    found = []
    for kind, (roles, init_roles, meaning) in KINDS.items():
        if len(roles) != len(inputs) or len(init_roles) != len(init_inputs):
            continue
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in init_inputs):
            continue
        init = dict(zip(init_roles, init_inputs))
        for order in itertools.permutations(roles):
            named = dict(zip(order, inputs))
            if not all(isinstance(v, torch.Tensor) and v.is_floating_point() for v in named.values()):
                continue
            try:
                got = meaning(named, init)
            except Exception:  # noqa: BLE001, S112 - this assignment does not fit the layer
                continue
            if got.shape == expected.shape and got.dtype == expected.dtype and torch.allclose(
                    got.double(), expected.double(), atol=2 * atol, rtol=2 * rtol, equal_nan=True):
                found.append({"kind": kind, "forward": list(order), "init": list(init_roles),
                              "ranks": {role: inputs[i].dim() for i, role in enumerate(order)}})
                break
    return found


# ---------------------------------------------------------------- the drop-in modules

_LAYERS: dict[str, dict] = {}  # kind -> {"module", "class", "op", "forward", "init", "ranks"}, from the package


def configure(layers: dict[str, dict]) -> None:
    _LAYERS.clear()
    _LAYERS.update(layers)


def available() -> dict[str, str]:
    """kind -> the op that implements it in this package."""
    return {kind: spec["op"] for kind, spec in _LAYERS.items()}


def _run(owner: nn.Module, kind: str, roles: dict, init: dict):
    spec = _LAYERS.get(kind)
    if spec is None:
        raise RuntimeError(f"this package exports no op that implements {kind} (available: {available()})")
    key = tuple(init[r] for r in spec["init"])
    cache = owner.__dict__.setdefault("_kfarm_ops", {})
    if key not in cache:
        cls = getattr(importlib.import_module(spec["module"]), spec["class"])
        cache[key] = cls(*key)
    shape = None
    args = []
    for role in spec["forward"]:
        value = roles[role]
        if role in ROWWISE and spec["ranks"][role] == 2 and value.dim() != 2:
            shape = value.shape
            value = value.reshape(-1, value.shape[-1])
        elif role in ROWWISE and spec["ranks"][role] == 1 and value.dim() != 1:
            shape = value.shape
            value = value.reshape(-1)
        args.append(value)
    out = cache[key](*args)
    if shape is not None:
        out = out.reshape(*shape[:-1], -1) if spec["ranks"][spec["forward"][0]] == 2 else out.reshape(shape)
    return out


def _vector(given: nn.Parameter | None, hidden_size: int | None, fill: float) -> nn.Parameter:
    """`given`, else a new parameter of `hidden_size` elements, each `fill`: one of the two is needed."""
    if given is not None:
        return given
    if hidden_size is None:
        raise TypeError("give hidden_size, or the weights themselves")
    return nn.Parameter(torch.full((hidden_size,), fill))


class RMSNorm(nn.Module):
    """y = x / rms(x) * weight (in float32, cast to x's dtype before the weight), attributes as
    Hugging Face's LlamaRMSNorm: weight, variance_epsilon."""

    def __init__(self, hidden_size: int | None = None, eps: float = 1e-6, weight: nn.Parameter | None = None):
        super().__init__()
        self.weight = _vector(weight, hidden_size, 1.0)
        self.variance_epsilon = eps

    def forward(self, x):
        return _run(self, "rms_norm", {"x": x, "weight": self.weight}, {"eps": self.variance_epsilon})


class LayerNorm(nn.Module):
    def __init__(self, hidden_size: int | None = None, eps: float = 1e-5, weight=None, bias=None):
        super().__init__()
        self.weight = _vector(weight, hidden_size, 1.0)
        self.bias = _vector(bias, hidden_size, 0.0)
        self.eps = eps

    def forward(self, x):
        return _run(self, "layer_norm", {"x": x, "weight": self.weight, "bias": self.bias}, {"eps": self.eps})


class _Activation(nn.Module):
    kind = ""

    def forward(self, x):
        return _run(self, self.kind, {"x": x}, {})


class SiLU(_Activation):
    kind = "silu"


class GELU(_Activation):
    kind = "gelu"


class GELUTanh(_Activation):
    kind = "gelu_tanh"


class SwiGLUMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)), Llama's MLP, with the op for the middle."""

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear

    def __init__(self, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    def forward(self, x):
        if "swiglu" in _LAYERS:
            middle = _run(self, "swiglu", {"gate": self.gate_proj(x), "up": self.up_proj(x)}, {})
        else:
            middle = _run(self, "silu_and_mul", {"x": torch.cat([self.gate_proj(x), self.up_proj(x)], -1)}, {})
        return self.down_proj(middle)


# ---------------------------------------------------------------- patch(model)


@dataclass
class PatchReport:
    swapped: list[dict] = field(default_factory=list)  # {"name", "was", "now", "op"}
    skipped: list[dict] = field(default_factory=list)  # {"name", "was", "reason"}

    def __str__(self) -> str:
        lines = [f"swapped {len(self.swapped)} module(s)"]
        lines += [f"  {s['name'] or '<model>'}: {s['was']} -> {s['now']} ({s['op']})" for s in self.swapped]
        lines += [f"  kept {s['name']}: {s['was']} ({s['reason']})" for s in self.skipped]
        return "\n".join(lines)


_ACTIVATIONS = {"SiLU": "silu", "SiLUActivation": "silu", "GELU": "gelu", "GELUActivation": "gelu",
                "PytorchGELUTanh": "gelu_tanh", "GELUTanh": "gelu_tanh", "NewGELUActivation": "gelu_tanh"}


def _candidate(module: nn.Module):
    """(drop-in, kind) for a module this catalogue recognises, else (None, None)."""
    name = type(module).__name__
    gate, up, down = (getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj"))
    if isinstance(gate, nn.Linear) and isinstance(up, nn.Linear) and isinstance(down, nn.Linear) \
            and hasattr(module, "act_fn"):
        return SwiGLUMLP(gate, up, down), "swiglu" if "swiglu" in _LAYERS else "silu_and_mul"
    weight = getattr(module, "weight", None)
    if name.endswith("RMSNorm") and isinstance(weight, nn.Parameter) and weight.dim() == 1:
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        if isinstance(eps, float):
            return RMSNorm(eps=eps, weight=weight), "rms_norm"
    if isinstance(module, nn.LayerNorm) and module.weight is not None and module.bias is not None \
            and len(module.normalized_shape) == 1:
        return LayerNorm(eps=module.eps, weight=module.weight, bias=module.bias), "layer_norm"
    act = _ACTIVATIONS.get(name)
    if isinstance(module, nn.GELU) and module.approximate == "tanh":
        act = "gelu_tanh"
    if act:
        return {"silu": SiLU, "gelu": GELU, "gelu_tanh": GELUTanh}[act](), act
    return None, None


def _check_input(module: nn.Module, new: nn.Module) -> torch.Tensor:
    param = next(module.parameters(), None)
    dtype, device = (param.dtype, param.device) if param is not None else (torch.float32, torch.device("cpu"))
    width = param.shape[-1] if param is not None and param.dim() >= 1 else 16
    if isinstance(new, SwiGLUMLP):
        width = new.gate_proj.in_features
    return torch.randn(2, 3, width, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)


def _same(a, b) -> bool:
    atol = 1e-5 if a.dtype in (torch.float32, torch.float64) else 2e-2
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=atol, rtol=atol)


def patch(model: nn.Module, kinds: tuple[str, ...] | None = None) -> PatchReport:
    """Swap the modules of `model` this package has a kernel for; returns what it swapped and kept."""
    from farm.export.package_runtime import force_fallback, restore_state, stats_state

    report = PatchReport()
    saved = stats_state()
    try:
        for name, module in list(model.named_modules()):
            if not name or not _reachable(model, name, module):
                continue  # the model itself, or inside a module already swapped
            new, kind = _candidate(module)
            if new is None or kind not in _LAYERS or (kinds is not None and kind not in kinds):
                continue
            x = _check_input(module, new)
            force_fallback(True)  # the swap check compares the meaning, on any device
            try:
                with torch.no_grad():
                    same = _same(module(x), new(x))
            except Exception as exc:  # noqa: BLE001 - a layer the drop-in cannot stand in for
                same, why = False, f"{type(exc).__name__}: {exc}".splitlines()[0]
            else:
                why = "its output differs from the drop-in's on the swap check's input"
            restore_state(saved)
            if not same:
                report.skipped.append({"name": name, "was": type(module).__name__, "reason": why})
                continue
            _replace(model, name, new)
            report.swapped.append({"name": name, "was": type(module).__name__, "now": type(new).__name__,
                                   "op": _LAYERS[kind]["op"]})
    finally:
        restore_state(saved)
    return report


def _reachable(model: nn.Module, name: str, module: nn.Module) -> bool:
    try:
        return model.get_submodule(name) is module
    except AttributeError:
        return False


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)
