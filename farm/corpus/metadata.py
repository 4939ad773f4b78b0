"""The optional module-level metadata of a task file (docs/task-format.md): TOLERANCE,
INPLACE_ARGS, TAGS, BACKWARD, GRAD_INPUTS, SMALL_SHAPES, each checked with an error naming
the file (SHAPE_SPACE: farm.corpus.space)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import TYPE_CHECKING

from farm.errors import TaskError

if TYPE_CHECKING:
    from torch import nn

_TOLERANCE_DTYPES = ("float16", "bfloat16", "float32", "float64")


def tolerance(path: Path, module: types.ModuleType) -> dict[str, tuple[float, float]]:
    raw = getattr(module, "TOLERANCE", {}) or {}
    if not isinstance(raw, dict):
        raise TaskError(path, "TOLERANCE must be a dict like {'float16': (atol, rtol)}")
    out = {}
    for dtype, pair in raw.items():
        if dtype not in _TOLERANCE_DTYPES:
            raise TaskError(path, "TOLERANCE keys must be float dtype names",
                            f"'{dtype}' is not one of {', '.join(_TOLERANCE_DTYPES)}")
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(v, (int, float)) and v >= 0 for v in pair)):
            raise TaskError(path, "TOLERANCE values must be (atol, rtol) pairs of non-negative numbers",
                            f"{dtype}: {pair!r}")
        out[dtype] = (float(pair[0]), float(pair[1]))
    return out


def int_tuple(path: Path, module: types.ModuleType, name: str) -> tuple[int, ...]:
    raw = getattr(module, name, None)
    raw = () if raw is None else raw  # 0, False or "" is a mistake, not "none"
    if not isinstance(raw, (tuple, list)) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                     for v in raw):
        raise TaskError(path, f"{name} must be a tuple of argument indices", repr(raw))
    return tuple(raw)


def indices_in_forward(path: Path, model_cls: type[nn.Module], name: str, indices: tuple[int, ...]) -> None:
    """INPLACE_ARGS and GRAD_INPUTS name forward's arguments: an index past them names nothing."""
    import inspect

    params = list(inspect.signature(model_cls.forward).parameters.values())[1:]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    count = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    outside = [i for i in indices if i >= count]
    if outside:
        raise TaskError(path, f"{name} must index forward's arguments",
                        f"{outside} past the {count} argument(s) of {model_cls.__name__}.forward")


def small_shapes(path: Path, module: types.ModuleType) -> None:
    """SMALL_SHAPES overrides existing globals with values of their kind (an int size stays a
    non-negative int), checked whenever the file loads, so a bad one is not listed ok."""
    small = getattr(module, "SMALL_SHAPES", None)
    if small is None:
        return
    if not isinstance(small, dict):
        raise TaskError(path, "SMALL_SHAPES must be a dict of module constants to override", repr(small)[:200])
    for key, value in small.items():
        if not isinstance(key, str) or not hasattr(module, key):
            raise TaskError(path, "SMALL_SHAPES may only override existing module globals",
                            f"'{key}' is not defined in the file")
        was = getattr(module, key)
        if isinstance(was, bool) or not isinstance(was, int):
            ok = isinstance(value, type(was)) or isinstance(was, float) and isinstance(value, int)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if not ok:
            raise TaskError(path, "SMALL_SHAPES values must be of the kind of the global they replace",
                            f"{key} = {was!r} in the file, {value!r} in SMALL_SHAPES")


def backward(path: Path, module: types.ModuleType) -> bool:
    raw = getattr(module, "BACKWARD", False)
    if not isinstance(raw, bool):
        raise TaskError(path, "BACKWARD must be True or False", repr(raw))
    return raw


def str_tuple(path: Path, module: types.ModuleType, name: str) -> tuple[str, ...]:
    raw = getattr(module, name, ()) or ()
    if not isinstance(raw, (tuple, list)) or not all(isinstance(v, str) for v in raw):
        raise TaskError(path, f"{name} must be a tuple of strings", repr(raw))
    return tuple(raw)
