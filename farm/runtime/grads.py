"""Backward passes of training ops: which inputs need gradients, the stored upstream gradient,
and one forward+backward that the reference worker and the evaluator both call.

A task declares `BACKWARD = True` (and optionally `GRAD_INPUTS`, the forward-argument indices
that need gradients; by default every floating-point tensor input). Every trainable
parameter of the module gets a gradient too. The upstream gradient is drawn from its own
seeded generator, so the reference, every secret input set and every candidate see the same
one for the same inputs.
"""

from __future__ import annotations

from typing import Any

GRAD_SEED_OFFSET = 7919  # the upstream gradient's generator: seed + this, apart from the inputs' draw
# Gradient tolerance: the forward tolerance of the gradient's dtype (a task's TOLERANCE included)
# times this. Gradients sum over the batch (a weight's gradient adds one term per row), so a
# correct kernel that accumulates in another order drifts further than a forward output does;
# the scale admits that and not a wrong mask or a missing term.
GRAD_TOLERANCE_SCALE = 8.0


def grad_tolerance(task_tolerance: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    from farm.runtime.tolerance import DEFAULT_TOLERANCE

    merged = {**DEFAULT_TOLERANCE, **task_tolerance}
    return {dtype: (atol * GRAD_TOLERANCE_SCALE, rtol * GRAD_TOLERANCE_SCALE) for dtype, (atol, rtol) in merged.items()}


def grad_failures(labelled: list[tuple[str, Any, Any]], tolerance: dict) -> str:
    """(label, got, expected) gradients compared at `tolerance`; "" when all agree. An expected
    None (no gradient flows there) is skipped; a missing one where one is expected fails."""
    from farm.runtime.tolerance import compare_outputs

    failures = []
    for label, got, expected in labelled:
        if expected is None:
            continue
        if got is None:
            failures.append(f"gradient of {label}: none computed")
            continue
        check = compare_outputs([got], [expected], tolerance)[0]
        if not check.ok:
            failures.append(f"gradient of {label}: {check.reason}")
    return "; ".join(failures)


def grad_indices(declared: tuple[int, ...] | None, inputs: list) -> list[int]:
    import torch

    if declared is not None:
        return list(declared)
    return [i for i, v in enumerate(inputs) if isinstance(v, torch.Tensor) and v.is_floating_point()]


def upstream(outputs: list, seed: int) -> list:
    """dL/d(output) for each floating-point output (None for the others), on CPU."""
    import torch

    gen = torch.Generator().manual_seed(seed + GRAD_SEED_OFFSET)
    grads: list[torch.Tensor | None] = []
    for out in outputs:
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            grads.append(torch.randn(out.shape, generator=gen, dtype=torch.float32).to(out.dtype))
        else:
            grads.append(None)
    return grads


def trainable(model) -> dict[str, Any]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def forward_backward(model, inputs: list, indices: list[int], grad_outputs: list | None, seed: int,
                     device: str) -> tuple[Any, list, list, dict]:
    """Run forward with gradients on `indices` and backward with the upstream gradient.

    Returns (raw output, upstream gradients used (CPU), input gradients (CPU, one per index),
    parameter gradients by name (CPU)). `grad_outputs` None draws them from `seed`."""
    import torch

    from farm.runtime.tensors import to_cpu
    from farm.runtime.tolerance import as_output_list

    for i in indices:
        inputs[i] = inputs[i].detach().requires_grad_(True)
    params = trainable(model)
    for p in params.values():
        p.grad = None
    with torch.enable_grad():
        raw = model(*inputs)
        outs = as_output_list(raw)
        if grad_outputs is None:
            grad_outputs = upstream(as_output_list(to_cpu(raw)), seed)
        pairs = [(o, g.to(device)) for o, g in zip(outs, grad_outputs)
                 if g is not None and isinstance(o, torch.Tensor) and o.requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    grad_inputs = [None if inputs[i].grad is None else inputs[i].grad.detach().cpu() for i in indices]
    grad_params = {name: (None if p.grad is None else p.grad.detach().cpu()) for name, p in params.items()}
    return raw, grad_outputs, grad_inputs, grad_params
