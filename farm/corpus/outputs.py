"""What a task's forward may return: data a .pt can hold and a candidate can be compared
against, with at least one tensor (a forward returning None, or Python numbers alone, has
nothing a kernel computes)."""

from __future__ import annotations

from typing import Any

from farm.errors import TaskError


def check_outputs(task, cls: type, value: Any) -> Any:
    """A forward's result must be data the .pt can hold and a candidate can be compared
    against: tensors (numbers, None) or lists/tuples of them, never a string or an object."""
    import torch

    def bad(v: Any, where: str) -> str | None:
        if isinstance(v, (list, tuple)):
            return next((b for i, item in enumerate(v) if (b := bad(item, f"{where}[{i}]"))), None)
        if v is None or isinstance(v, (torch.Tensor, bool, int, float)):
            return None
        return f"{where} is a {type(v).__name__}"

    def tensors(v: Any) -> bool:
        return isinstance(v, torch.Tensor) or isinstance(v, (list, tuple)) and any(map(tensors, v))

    problem = bad(value, "the output") or (None if tensors(value) else f"it returned {_kind(value)}, no tensor")
    if problem:
        raise TaskError(task.ref.path, f"{cls.__name__}.forward must return tensors (or a list/tuple of them)",
                        problem)
    return value


def _kind(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return f"a {type(v).__name__} of {', '.join(sorted({type(x).__name__ for x in v})) or 'nothing'}"
    return "None" if v is None else f"a {type(v).__name__}"
