"""Inputs that hold addresses of tensors.

Some task files pass a tensor's address as a value: AKG's vLLM block-table files hand their
kernel `torch.tensor([table.data_ptr()], dtype=torch.uint64)` and the kernel loads that
pointer. An address differs with every call, means nothing once the `.pt` leaves the machine,
and points into host memory once the inputs are moved to the device. So while inputs are drawn,
every such address is rewritten as a machine-independent token, and every time a set of inputs
is placed on a device or cloned, the tokens become the addresses of the tensors they name there.
The `.pt` stores tokens; everything that runs a Model on stored inputs goes through
`farm.runtime.tensors.to_device`, which resolves them.

A token names either another input (`input k`, byte offset) or a *pointee*: a tensor whose
address get_inputs() took but did not return (`gather_block_tables_kernel` keeps only the
address of its source table, so the table's memory is free once get_inputs() returns and the
kernel reads whatever lies there). A pointee is kept alive with the tensor that points at it, as
that tensor's attribute POINTEES, which torch.save and pickle both keep.

Only 64-bit integer tensors of at most MAX_ELEMENTS values are looked at: an address needs 64
bits, pointer tables are tiny, and looking costs a device-to-host copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

TAG = 0x5AFE  # the top 16 bits of a token; a user-space address has at most 48 bits
MAX_ELEMENTS = 64
POINTEES = "_farm_pointees"
_OWN = 1 << 47  # the token names one of the holder's pointees, not an input
_OFFSET_BITS = 32
_INDEX_MASK = (1 << 15) - 1


def _holders(values: list):
    import torch

    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor) and v.dtype in (torch.int64, torch.uint64) and 0 < v.numel() <= MAX_ELEMENTS:
            yield i, v


def _span(t) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + max(t.numel() * t.element_size(), 1)


def _is_token(n: int) -> bool:
    return (n >> 48) == TAG


def _rebuild(template, numbers: list[int], pointees: list | None):
    import torch

    out = torch.tensor(numbers, dtype=template.dtype, device=template.device).reshape(template.shape)
    if pointees:
        setattr(out, POINTEES, pointees)
    return out


def pointees_of(t) -> list:
    return list(getattr(t, POINTEES, None) or [])


@contextlib.contextmanager
def watching_addresses():
    """Collect every tensor whose data_ptr() is taken (while get_inputs() runs): a pointer to
    a tensor that get_inputs() does not return can then be matched to that tensor."""
    import torch

    seen: list = []
    original = torch.Tensor.data_ptr

    def data_ptr(self):
        seen.append(self)
        return original(self)

    torch.Tensor.data_ptr = data_ptr
    try:
        yield seen
    finally:
        torch.Tensor.data_ptr = original


def encode(values: list, seen: Sequence = ()) -> list:
    """`values` with every live address of a tensor replaced by its token (new tensors; the
    originals are untouched). `seen`: tensors get_inputs() took addresses of."""
    holders = list(_holders(values))
    if not holders:
        return values
    import torch

    inputs = [(k, t) for k, t in enumerate(values) if isinstance(t, torch.Tensor) and t.numel()]
    out = list(values)
    for i, v in holders:
        numbers = [int(x) for x in v.flatten().tolist()]
        own = pointees_of(v)
        changed = False
        for j, n in enumerate(numbers):
            token = _token_for(n, i, inputs, own, seen)
            if token is not None:
                numbers[j], changed = token, True
        if changed:
            out[i] = _rebuild(v, numbers, own)
    return out


def _token_for(n: int, holder: int, inputs: list, own: list, seen) -> int | None:
    if n == 0 or _is_token(n):
        return None
    for k, t in inputs:
        start, end = _span(t)
        if k != holder and start <= n < end and k <= _INDEX_MASK:
            return (TAG << 48) | (k << _OFFSET_BITS) | (n - start)
    for h, t in enumerate(own):
        start, end = _span(t)
        if start <= n < end:
            return (TAG << 48) | _OWN | (h << _OFFSET_BITS) | (n - start)
    for t in seen:
        if t.numel() and _span(t)[0] <= n < _span(t)[1] and len(own) <= _INDEX_MASK:
            own.append(t.detach().clone())  # kept alive, and unchanged by what get_inputs() does later
            return (TAG << 48) | _OWN | ((len(own) - 1) << _OFFSET_BITS) | (n - _span(t)[0])
    return None


def resolve(values: list) -> list:
    """`values` with every token replaced by the current address of the tensor it names."""
    import torch

    out = None
    for i, v in _holders(values):
        numbers = [int(x) for x in v.flatten().tolist()]
        if not any(_is_token(n) for n in numbers):
            continue
        own = pointees_of(v)
        for j, n in enumerate(numbers):
            if not _is_token(n):
                continue
            k, offset = (n >> _OFFSET_BITS) & _INDEX_MASK, n & ((1 << _OFFSET_BITS) - 1)
            target = (own[k] if k < len(own) else None) if n & _OWN else (values[k] if k < len(values) else None)
            if isinstance(target, torch.Tensor):
                numbers[j] = target.data_ptr() + offset
        out = out or list(values)
        out[i] = _rebuild(v, numbers, own)
    return values if out is None else out


def holders(values: list) -> set[int]:
    """Indices of the inputs that hold addresses (live or as tokens)."""
    encoded = encode(values)
    return {i for i, v in _holders(encoded)
            if any(_is_token(int(n)) for n in v.flatten().tolist())}


def moved(v, device: str):
    """`v` on `device`, with its pointees."""
    out = v.to(device)
    own = pointees_of(v)
    if own:
        if out is v:
            out = v.detach().clone()
        setattr(out, POINTEES, [p.to(device) for p in own])
    return out


def repoint(original: list, copy: list) -> list:
    """`copy` (an element-wise copy of `original`, which loses tensor attributes) with each
    holder's pointees copied too, and the live addresses that `original` holds replaced by those
    of the matching tensors of `copy`; tokens stay tokens."""
    encoded = encode(original)
    out = list(copy)
    live = []
    for i, v in _holders(original):
        if encoded[i] is v and not pointees_of(v):
            continue
        out[i] = _rebuild(encoded[i], [int(n) for n in encoded[i].flatten().tolist()],
                          [p.clone() for p in pointees_of(encoded[i])])
        if encoded[i] is not v:
            live.append(i)
    if live:
        resolved = resolve(out)
        for i in live:
            out[i] = resolved[i]
    return out
