"""The torch.nn layers that hold a ground truth's parameters and buffers, as constructor calls a
candidate can repeat (docs/inductor.md, "Parameters and buffers")."""

from __future__ import annotations


class Unsupported(Exception):
    """What inductor produced cannot become a candidate; the message says why."""


def state_layers(model, class_name: str, seed: int) -> list[dict]:
    """The layers that hold the module's parameters and buffers, as `torch.nn` constructor calls
    that a candidate's __init__ can make in the same order, so that under the evaluator's seed
    they hold the same values as the ground truth's. Checked here: the calls, made under the
    seed the module was built with, reproduce its state exactly; else Unsupported says why.

    [{"path": "conv", "call": "nn.Conv2d(3, 96, kernel_size=(11, 11), stride=(4, 4))"}, ...]"""
    import torch
    import torch.nn as nn

    from farm.runtime.tensors import seed_all

    if not list(model.state_dict()):
        return []
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
        if path in rebuilt:
            want, got = sub.state_dict(), rebuilt[path].state_dict()
            same = list(want) == list(got) and all(
                want[k].shape == got[k].shape and want[k].dtype == got[k].dtype
                and torch.equal(want[k].cpu(), got[k]) for k in want)
            if not same:
                raise Unsupported(f"{class_name}.{path} rebuilt as nn.{type(sub).__name__}(...) does not hold the "
                                  "ground truth's values (the Model draws random numbers in another order, or "
                                  "changes the layer after building it)")
    return layers
