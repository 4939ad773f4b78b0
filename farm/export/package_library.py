"""Each exported op as a torch.library custom op (copied into the package as `_library.py`).

torch.compile and torch.export then see one node, `<package>::<source>__<op>`, instead of
breaking the graph at Python they cannot trace. The op's body is the whole dispatch rule
(_runtime.py), decided per call at run time, so a compiled model keeps falling back outside
the envelope; its fake implementation runs the PyTorch fallback on fake tensors, which gives
the output shapes. A training op registers its backward as a second custom op
(`..._backward`) that recomputes the forward with gradients through the same module the rule
picks (the kernel's own autograd.Function, whose backward is the verified backward kernel) and
returns the gradients.

Why custom_op, not triton_op: triton_op traces the body, so the per-call rule would be frozen
into the graph at compile time, and it needs each launch wrapped in wrap_triton, which the
searched kernels do not do. An op gets no custom op (and runs eagerly, a graph break under
torch.compile) where it has no PyTorch fallback to give shapes, where an argument or output is
not a tensor, number or list of them, or where this torch has no torch.library.custom_op; the
op's `library_why` says which.
"""

from __future__ import annotations

import contextlib
import itertools

import torch

from farm.export.package_envelope import same_init

_REGISTRY: dict[str, list[tuple[list, object]]] = {}
_counter = itertools.count()


def custom_op(module, module_class: type):
    """The callable that runs `module` (an OpModule, of `module_class`) through its custom op, or None."""
    op = module._op
    why = _unsupported(op, module)
    if why:
        op.library_why = why
        return None
    entries = _REGISTRY.setdefault(op.key, [])
    for init, call in entries:
        if same_init(init, module._init_inputs):
            return _bound(call, module)
    call = _register(op, module, module_class, suffix="" if same_init(module._init_inputs, op.init_inputs()) else
                     f"_i{next(_counter)}")
    entries.append((list(module._init_inputs), call))
    return _bound(call, module)


def _bound(call, module):
    def run(*inputs):
        return call(module, *inputs)

    return run


def _unsupported(op, module) -> str:
    if not hasattr(torch.library, "custom_op"):
        return "this torch has no torch.library.custom_op"
    if module.fallback is None:
        return "no PyTorch fallback to give the output shapes"
    outputs = op.meta.get("outputs") or {}
    if not outputs.get("tensors"):
        return "its outputs are not all tensors (or were not recorded)"
    if schema(op) is None:
        return "an argument is not a tensor, number or list of them"
    return ""


def _arg_type(desc: dict) -> str | None:
    if desc["kind"] == "tensor":
        return "Tensor"
    if desc["kind"] == "scalar":
        return {"bool": "bool", "int": "SymInt", "float": "float", "str": "str"}.get(desc["type"])
    if desc["kind"] == "sequence" and desc["items"]:
        kinds = {_arg_type(item) for item in desc["items"]}
        return f"{kinds.pop()}[]" if len(kinds) == 1 and kinds <= {"Tensor", "SymInt", "float"} else None
    return None


def schema(op, mutable: bool = True) -> str | None:
    inputs = op.meta.get("inputs") or []
    mutated = set(op.meta.get("mutated_inputs") or []) if mutable else set()
    args = []
    for i, desc in enumerate(inputs):
        kind = _arg_type(desc)
        if kind is None:
            return None
        args.append(f"Tensor(a{i}!) a{i}" if i in mutated and kind == "Tensor" else f"{kind} a{i}")
    return f"({', '.join(args + ['Tensor[] params'])}) -> Tensor[]"


def _register(op, owner, module_class: type, suffix: str):
    """Register the forward (and backward) custom op for one set of constructor arguments."""
    executor = module_class(op, list(owner._init_inputs))
    names = [n for n, _ in executor.fallback.named_parameters()]
    namespace = op.module.split(".")[0]
    ident = op.meta.get("library_name") or "op"
    qualname = f"{namespace}::{ident}{suffix}"
    single = bool((op.meta.get("outputs") or {}).get("single"))
    mutated = tuple(f"a{i}" for i in sorted(set(op.meta.get("mutated_inputs") or [])))

    def impl(*args):
        *inputs, params = args
        out = executor.run(tuple(inputs), dict(zip(names, params)) if names else None)
        return _fresh(_as_list(out), inputs)

    def fake(*args):
        *inputs, params = args
        with torch.no_grad():
            out = torch.func.functional_call(executor.fallback, dict(zip(names, params)), tuple(inputs), strict=False)
        return [torch.empty_like(t) for t in _as_list(out)]

    forward = torch.library.custom_op(qualname, impl, mutates_args=mutated, schema=schema(op))
    forward.register_fake(fake)
    if op.backward:
        _register_backward(op, executor, forward, qualname, names)

    def call(module, *inputs):
        params = list(module.fallback.parameters())
        outs = forward(*inputs, params)
        return outs[0] if single else tuple(outs)

    return call


def _register_backward(op, executor, forward, qualname: str, names: list[str]) -> None:
    grad_positions = [i for i, d in enumerate(op.meta.get("inputs") or [])
                      if d["kind"] == "tensor" and d.get("dtype", "").startswith(("float", "bfloat"))]
    full = schema(op, mutable=False)
    assert full is not None  # the forward's was checked before it was registered
    base = full[:-len(") -> Tensor[]")]

    def bwd_impl(*args):
        *inputs, params, grads = args
        decision = executor._op.decide(tuple(inputs), executor._init_inputs, needs_grad=True)
        module = (executor.kernel_module(decision.target, grads[0].device) if decision.backend == "kernel"
                  else executor.fallback)
        with torch.enable_grad(), _autograd_on():
            inputs = list(inputs)
            leaves = []
            for i in grad_positions:
                inputs[i] = inputs[i].detach().requires_grad_(True)
                leaves.append(inputs[i])
            live = {n: p.detach().requires_grad_(True) for n, p in zip(names, params)}
            leaves += list(live.values())
            out = _as_list(torch.func.functional_call(module, live, tuple(inputs), strict=False)
                           if live else module(*inputs))
            pairs = [(o, g) for o, g in zip(out, grads) if o.requires_grad]
            if not pairs:
                raise RuntimeError(f"{op.key}: the {decision.name} recorded no autograd graph in the backward; "
                                   "refusing to return zero gradients")
            got = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
        return [g.detach() if g is not None else torch.zeros_like(leaf) for g, leaf in zip(got, leaves)]

    def bwd_fake(*args):
        *inputs, params, _grads = args
        return [torch.empty_like(inputs[i]) for i in grad_positions] + [torch.empty_like(p) for p in params]

    backward_op = torch.library.custom_op(f"{qualname}_backward", bwd_impl, mutates_args=(),
                                          schema=f"{base}, Tensor[] grads) -> Tensor[]")
    backward_op.register_fake(bwd_fake)

    def setup_context(ctx, inputs, output):
        ctx.inputs = inputs
        ctx.outputs = [(o.shape, o.dtype, o.device) for o in output]

    def backward(ctx, grads):
        *inputs, params = ctx.inputs
        grads = [g if g is not None else torch.zeros(s, dtype=d, device=dev)
                 for g, (s, d, dev) in zip(grads, ctx.outputs)]
        got = backward_op(*inputs, params, grads)
        per_input = [None] * len(inputs)
        for i, g in zip(grad_positions, got):
            per_input[i] = g
        return (*per_input, list(got[len(grad_positions):]))

    forward.register_autograd(backward, setup_context=setup_context)


def _autograd_on():
    """Autograd inside a custom op's body: the dispatcher runs the body below autograd, where
    PyTorch ops record no graph (an autograd.Function still would), so a PyTorch fallback's
    gradients would come out as nothing. This re-includes the autograd keys for the recompute."""
    guard = getattr(torch._C, "_SetExcludeDispatchKeyGuard", None)
    key = getattr(getattr(torch._C, "DispatchKey", None), "AutogradFunctionality", None)
    return guard(key, False) if guard is not None and key is not None else contextlib.nullcontext()


def _as_list(value) -> list:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(v, torch.Tensor) for v in values):
        raise TypeError(f"a custom op returns tensors only, got {[type(v).__name__ for v in values]}")
    return values


def _fresh(outputs: list, inputs: list) -> list:
    """A custom op may not return its inputs or one tensor twice: copies where it would."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}
    out = []
    for t in outputs:
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None and ptr in seen:
            t = t.clone()
        elif ptr is not None:
            seen.add(ptr)
        out.append(t)
    return out
