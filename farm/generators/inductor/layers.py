"""The torch.nn layers that hold a ground truth's parameters and buffers, as constructor calls a
candidate can repeat (docs/inductor.md, "Parameters and buffers")."""

from __future__ import annotations


class Unsupported(Exception):
    """What inductor produced cannot become a candidate; the message says why."""


def tensor_state(module) -> dict[str, tuple[str, object]]:
    """Every tensor a module holds, by dotted path -> (kind, tensor): parameters ("param"),
    buffers ("buffer", non-persistent ones included: a cos/sin cache registered with
    persistent=False is in no state_dict) and plain tensor attributes ("attr",
    `self.std_multiplier = torch.tensor(...)`: torch.compile lifts them as graph inputs)."""
    import torch

    out: dict[str, tuple[str, object]] = {}
    for path, sub in module.named_modules():
        prefix = f"{path}." if path else ""
        for name, t in sub._parameters.items():
            if t is not None:
                out[prefix + name] = ("param", t)
        for name, t in sub._buffers.items():
            if t is not None:
                out[prefix + name] = ("buffer", t)
        for name, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and prefix + name not in out:
                out[prefix + name] = ("attr", value)
    return out


def same_state(want: dict, got: dict) -> bool:
    """Two tensor_state()s hold the same paths, kinds, shapes, dtypes and values, bit for bit."""
    import torch

    return list(want) == list(got) and all(
        want[k][0] == got[k][0] and want[k][1].shape == got[k][1].shape and want[k][1].dtype == got[k][1].dtype
        and torch.equal(want[k][1].detach().cpu(), got[k][1].detach().cpu()) for k in want)


def state_layers(model, class_name: str, seed: int) -> list[dict]:
    """The layers that hold the module's parameters and buffers, as `torch.nn` constructor calls
    that a candidate's __init__ can make in the same order, so that under the evaluator's seed
    they hold the same values as the ground truth's. Checked here: the calls, made under the
    seed the module was built with, reproduce its state exactly; else Unsupported says why.

    [{"path": "conv", "call": "nn.Conv2d(3, 96, kernel_size=(11, 11), stride=(4, 4))"}, ...]"""
    import torch
    import torch.nn as nn

    from farm.runtime.tensors import seed_all

    state = tensor_state(model)
    if not state:
        return []
    plain = [path for path, (kind, _) in state.items() if kind == "attr"]
    if plain:
        raise Unsupported(f"{class_name} holds plain tensor attributes ({', '.join(plain[:3])}) outside a torch.nn "
                          "layer: no layer's constructor rebuilds them")
    layers = []
    for path, sub in model.named_modules():
        own = list(sub.named_parameters(recurse=False)) + list(sub.named_buffers(recurse=False))
        if not own:
            continue
        kind = type(sub)
        if not path or not kind.__module__.startswith("torch.nn.modules"):
            where = f"{class_name}.{path}" if path else class_name
            raise Unsupported(f"{where} holds parameters/buffers ({', '.join(n for n, _ in own[:3])}) outside a "
                              "torch.nn layer: a candidate cannot rebuild their values")
        if any(True for _ in sub.children()):
            raise Unsupported(f"{class_name}.{path} ({kind.__name__}) holds parameters and sublayers")
        layers.append({"path": path, "call": f"nn.{kind.__name__}({sub.extra_repr()})"})
    # rebuild as a candidate would, under the seed the ground truth was built with, and
    # compare every tensor bit for bit
    scope = {"nn": nn, "torch": torch}
    seed_all(seed)
    try:
        rebuilt = {layer["path"]: eval(layer["call"], scope) for layer in layers}  # noqa: S307 - repr of nn layers
    except Exception as exc:  # noqa: BLE001
        raise Unsupported(f"a layer of {class_name} cannot be rebuilt from its repr: {type(exc).__name__}: {exc}") \
            from None
    for path, sub in model.named_modules():
        if path in rebuilt and not same_state(tensor_state(sub), tensor_state(rebuilt[path])):
            raise Unsupported(f"{class_name}.{path} rebuilt as nn.{type(sub).__name__}(...) does not hold the "
                              "ground truth's values (the Model draws random numbers in another order, or "
                              "changes the layer after building it)")
    return layers
