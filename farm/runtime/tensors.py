"""Trees of forward values (tensors, lists of tensors, plain Python values): seeding,
moving, cloning, describing. Shared by ops check, reference generation and the evaluator."""

from __future__ import annotations

import contextlib
import io
import pickle
import threading
from typing import Any

from farm.runtime import pointers

# torch's global generator is one per process: where threads of one process draw inputs or build
# models (ops searched or exported side by side), a draw seeded in one thread was advanced or
# re-seeded by another's, and the task was called nondeterministic. Every use takes turns here.
GENERATOR = threading.RLock()


@contextlib.contextmanager
def own_generator(seed: int | None = None):
    """torch's global generator for this thread alone while the block runs: seeded where `seed`
    is given, and restored afterwards (the caller's draws continue as if nothing ran)."""
    import torch

    with GENERATOR, torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def seed_all(seed: int) -> None:
    import torch

    torch.manual_seed(seed)  # also seeds every CUDA/NPU device


def to_device(values: list, device: str) -> list:
    import torch

    def move(v):
        if isinstance(v, torch.Tensor):
            return pointers.moved(v, device)
        if isinstance(v, (list, tuple)):
            return type(v)(move(x) for x in v)
        return v

    # an input holding another's address (farm.runtime.pointers) gets the address it has there
    return pointers.resolve([move(v) for v in values])


def clone_values(values: list) -> list:
    import torch

    def cp(v):
        if isinstance(v, torch.Tensor):
            return v.clone()
        if isinstance(v, (list, tuple)):
            return type(v)(cp(x) for x in v)
        return v

    return pointers.repoint(values, [cp(v) for v in values])


def describe_values(values: list) -> tuple[list, list]:
    """(shapes, dtypes) as the .pt and the tables show them; None for non-tensors."""
    import torch

    shapes: list[list[int] | None] = []
    dtypes: list[str | None] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            shapes.append(list(v.shape))
            dtypes.append(str(v.dtype))
        else:
            shapes.append(None)
            dtypes.append(None)
    return shapes, dtypes


def same_values(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape):
            return False
        if torch.equal(a, b):
            return True
        # NaN where both have NaN is the same value (torch.empty buffers filled with NaN)
        return a.is_floating_point() and bool(((a == b) | (a.isnan() & b.isnan())).all())
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b))
    return a == b


def to_cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def identical(a: Any, b: Any) -> bool:
    """Bitwise-identical trees, NaN equal to NaN (a second run must reproduce NaNs too)."""
    import torch

    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape):
            return False
        if a.is_floating_point() or a.is_complex():
            both_nan = torch.isnan(a) & torch.isnan(b)
            return bool(((a == b) | both_nan).all())
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return type(a) is type(b) and a == b


_SIGNED_OF = {"uint16": "int16", "uint32": "int32", "uint64": "int64"}


def _unsigned(signed, dtype: str, state: dict):
    import torch

    out = signed.view(getattr(torch, dtype))
    out.__dict__.update(state)
    return out


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        import torch

        if isinstance(obj, torch.Tensor) and str(obj.dtype).removeprefix("torch.") in _SIGNED_OF:
            dtype = str(obj.dtype).removeprefix("torch.")
            return _unsigned, (obj.view(getattr(torch, _SIGNED_OF[dtype])), dtype, dict(obj.__dict__))
        return NotImplemented


def dumps(obj: Any) -> bytes:
    """pickle.dumps, except that unsigned tensors (uint16/32/64) cross as views of signed ones:
    torch cannot unpickle their storages (its legacy storage path has no unsigned dtypes)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def tensor_bytes(value: Any) -> int:
    """Bytes of tensor data in a tree of lists, tuples and dicts."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0
