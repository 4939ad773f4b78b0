"""The optional module-level metadata of a task file (docs/task-format.md): TOLERANCE,
INPLACE_ARGS, TAGS, BACKWARD, GRAD_INPUTS, each checked with an error naming the file."""

from __future__ import annotations

import types
from pathlib import Path

from farm.errors import TaskError

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
    raw = getattr(module, name, ()) or ()
    if not isinstance(raw, (tuple, list)) or not all(isinstance(v, int) and v >= 0 for v in raw):
        raise TaskError(path, f"{name} must be a tuple of argument indices", repr(raw))
    return tuple(raw)


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
