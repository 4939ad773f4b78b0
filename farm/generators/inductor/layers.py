"""The torch.nn layers that hold a ground truth's parameters and buffers, as constructor calls a
candidate can repeat (docs/inductor.md, "Parameters and buffers")."""

from __future__ import annotations

import ast


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


# module names a copied __init__ may use, with the import that gives the candidate each one
INIT_IMPORTS = {"torch": "import torch", "nn": "import torch.nn as nn", "F": "import torch.nn.functional as F",
                "math": "import math"}


def copied_init(cls, model, init_inputs: list, seed: int) -> dict:
    """The ground truth's own __init__ body, for a module whose state no `torch.nn` constructor
    call rebuilds (a bare `nn.Parameter(torch.randn(...))`, a layer changed after it was built:
    38 of KernelBench level 2's 100 files). Run in the same order under the same seed, the
    same statements draw the same numbers. Accepted only if the body uses nothing from its
    module but torch, nn, F and math, and if the copy, built here under the seed the ground
    truth was built with, holds every one of its tensors bit for bit; else Unsupported.

    {"body": ["self.conv = nn.Conv2d(...)", ...], "imports": ["import torch.nn as nn", ...]}"""
    import builtins
    import inspect
    import textwrap

    import torch

    from farm import pyast
    from farm.runtime.tensors import seed_all

    name = cls.__name__
    try:
        fn = pyast.parse(textwrap.dedent(inspect.getsource(cls.__init__))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError) as exc:
        raise Unsupported(f"{name}.__init__'s source cannot be read to copy it: {exc}") from None
    if not isinstance(fn, ast.FunctionDef) or fn.args.vararg or fn.args.kwarg:
        raise Unsupported(f"{name}.__init__ takes *args/**kwargs: its copy could not name them")
    body = [s for s in fn.body if not _is_docstring(s) and not _is_super_init(s)]
    own = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
    own |= {n.id for s in body for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    used = {n.id for s in body for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    foreign = sorted(used - own - set(INIT_IMPORTS) - set(dir(builtins)))
    if foreign:
        raise Unsupported(f"{name}.__init__ uses {', '.join(foreign)} from its module: a copy in a candidate "
                          "could not")
    lines = [line for s in body for line in ast.unparse(s).splitlines()]
    copy = _build_copy(fn, lines)
    seed_all(seed)
    try:
        rebuilt = copy(*init_inputs)
    except Exception as exc:  # noqa: BLE001
        raise Unsupported(f"a copy of {name}.__init__ fails: {type(exc).__name__}: {exc}") from None
    want, got = model.state_dict(), rebuilt.state_dict()
    if list(want) != list(got) or not all(want[k].shape == got[k].shape and want[k].dtype == got[k].dtype
                                          and torch.equal(want[k].cpu(), got[k]) for k in want):
        raise Unsupported(f"a copy of {name}.__init__ does not hold the ground truth's values (its state is "
                          "not a function of the seed and the constructor's arguments)")
    return {"body": lines, "imports": [INIT_IMPORTS[m] for m in sorted(used & set(INIT_IMPORTS))]}


def _build_copy(fn: ast.FunctionDef, lines: list[str]):
    """A module class whose __init__ is the copy, built as the candidate will build it."""
    import torch
    import torch.nn as nn

    args = ast.unparse(fn.args)
    source = "\n".join([f"class _Copy(nn.Module):\n    def __init__({args}):", "        super().__init__()",
                        *(f"        {line}" for line in lines)])
    scope = {"torch": torch, "nn": nn, "F": torch.nn.functional, "math": __import__("math")}
    exec(compile(source, "<copied __init__>", "exec"), scope)  # noqa: S102 - the task's own trusted code
    return scope["_Copy"]


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _is_super_init(stmt: ast.stmt) -> bool:
    """`super().__init__()` or `super(Model, self).__init__()`: the candidate makes its own."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__init__"
            and isinstance(call.func.value, ast.Call) and isinstance(call.func.value.func, ast.Name)
            and call.func.value.func.id == "super")
