"""The verified envelope of an exported kernel (copied into the package as `_envelope.py`).

Imports nothing of Kernel Farm. An envelope is what the kernel was checked on: per verified
dtype, one signature of the forward arguments, where a tensor's dimension is either a fixed
size or an affine function of one dimension of the task's shape space,

    {"dim": "NUM_TOKENS", "a": 1, "b": 0}       size = a * NUM_TOKENS + b, NUM_TOKENS in low..high

(an indptr of a batch has a = 1, b = 1). A call is inside the envelope when some signature
matches every argument and each space dimension takes one value, inside its range, across all
the arguments that follow it. `infer` builds the signatures from the inputs drawn at the
checked cases; `outside` is what the dispatcher asks on every call.
"""

from __future__ import annotations

from typing import Any

import torch


def describe(value: Any) -> dict:
    """One forward argument as the dispatch rule compares it."""
    if isinstance(value, torch.Tensor):
        return {"kind": "tensor", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    if isinstance(value, (list, tuple)):
        return {"kind": "sequence", "items": [describe(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"kind": "scalar", "type": type(value).__name__, "value": value}
    return {"kind": "other", "type": type(value).__name__}


# ---------------------------------------------------------------- building (at export time)


def infer(space: dict, checked: list[tuple[dict, list[dict]]]) -> list[dict]:
    """Signatures from (case, described inputs) pairs, one per dtype of the cases. A size that
    follows no single dimension affinely keeps the values seen; a scalar that changed between
    cases (a count drawn with the inputs) may take any value of its type."""
    by_dtype: dict[Any, list[tuple[dict, list[dict]]]] = {}
    for case, inputs in checked:
        by_dtype.setdefault(case.get("dtype"), []).append((case, inputs))
    signatures = []
    for dtype, group in by_dtype.items():
        values = [case["values"] for case, _ in group]
        first = group[0][1]
        items = [_merge([inputs[i] for _, inputs in group], values, space) for i in range(len(first))]
        signatures.append({"dtype": dtype, "inputs": items})
    return signatures


def _merge(seen: list[dict], values: list[dict], space: dict) -> dict:
    first = seen[0]
    if any(s["kind"] != first["kind"] for s in seen):
        return {"kind": "other", "type": "mixed"}
    if first["kind"] == "tensor":
        ranks = {len(s["shape"]) for s in seen}
        if len(ranks) != 1 or len({s["dtype"] for s in seen}) != 1:
            return {"kind": "other", "type": "mixed"}
        shape = [_size([s["shape"][d] for s in seen], values, space) for d in range(len(first["shape"]))]
        return {"kind": "tensor", "dtype": first["dtype"], "shape": shape}
    if first["kind"] == "sequence":
        if len({len(s["items"]) for s in seen}) != 1:
            return {"kind": "other", "type": "mixed"}
        return {"kind": "sequence", "items": [_merge([s["items"][i] for s in seen], values, space)
                                              for i in range(len(first["items"]))]}
    if first["kind"] == "scalar" and any(s.get("value") != first.get("value") for s in seen):
        return {"kind": "scalar", "type": first["type"], "any": True}
    return first


def _size(sizes: list[int], values: list[dict], space: dict) -> Any:
    if len(set(sizes)) == 1:
        return sizes[0]
    for dim in space.get("dims", []):
        xs = [x for v in values if (x := v.get(dim["name"])) is not None]
        if len(xs) < len(values) or len(set(xs)) < 2:
            continue
        pairs = sorted(set(zip(xs, sizes)))
        (x0, s0), (x1, s1) = pairs[0], pairs[-1]
        if x1 == x0 or (s1 - s0) % (x1 - x0):
            continue
        a = (s1 - s0) // (x1 - x0)
        b = s0 - a * x0
        if a > 0 and all(s == a * x + b for x, s in pairs):
            return {"dim": dim["name"], "a": a, "b": b}
    return {"one_of": sorted(set(sizes))}


# ---------------------------------------------------------------- matching (every call)


def outside(envelope: dict, inputs: tuple, loose: bool = False) -> str:
    """'' if the inputs are inside some signature of the envelope, else why not (the closest
    signature's first mismatch: same dtypes first). `loose`: any size and scalar value, same
    ranks, types and dtypes (KFARM_SHAPES=rank: unverified)."""
    ranges = {d["name"]: (d["low"], d["high"]) for d in (envelope.get("space") or {}).get("dims", [])}
    reasons = []
    for sig in envelope["signatures"]:
        why = _match(sig["inputs"], inputs, None if loose else ranges)
        if not why:
            return ""
        reasons.append(why)
    dtypes = sorted({str(s.get("dtype")) for s in envelope["signatures"]})
    dtype_miss = [r for r in reasons if "dtype" in r]
    best = next((r for r in reasons if "dtype" not in r), dtype_miss[0] if dtype_miss else "no signature")
    return best if len(dtypes) < 2 or "dtype" not in best else f"{best} (verified dtypes: {', '.join(dtypes)})"


def slower(envelope: dict, inputs: tuple) -> str:
    """'' unless the inputs' tensor shapes are those of a timed case where the kernel was slower
    than the original (best.json's slower_cases, issue 32): there the original is the faster path."""
    shapes = [list(v.shape) for v in inputs if isinstance(v, torch.Tensor)]
    hit = next((row for row in envelope.get("slower") or [] if row.get("shape") == shapes), None)
    return "" if hit is None else f"the {hit.get('label')} case {shapes}: timed {hit.get('speedup', 0):.2f}x the original"


def _match(signature: list[dict], inputs: tuple, ranges: dict | None) -> str:
    if len(inputs) != len(signature):
        return f"{len(inputs)} arguments, verified {len(signature)}"
    bound: dict[str, tuple[int, str]] = {}
    for i, (want, value) in enumerate(zip(signature, inputs)):
        why = _match_one(want, value, ranges, bound, f"input {i}")
        if why:
            return why
    return ""


def _match_one(want: dict, value: Any, ranges: dict | None, bound: dict, where: str) -> str:
    got = describe(value)
    if want["kind"] == "other":
        return f"{where}: not checked ({want.get('type')})"
    if got["kind"] != want["kind"]:
        return f"{where}: {got['kind']}, verified {want['kind']}"
    if got["kind"] == "tensor":
        if got["dtype"] != want["dtype"]:
            return f"{where}: dtype {got['dtype']}, verified {want['dtype']}"
        if len(got["shape"]) != len(want["shape"]):
            return f"{where}: {len(got['shape'])} dimensions {got['shape']}, verified {len(want['shape'])}"
        for d, (size, rule) in enumerate(zip(got["shape"], want["shape"])):
            why = _match_size(size, rule, ranges, bound, f"{where} dimension {d}")
            if why:
                return why
        return ""
    if got["kind"] == "sequence":
        if len(got["items"]) != len(want["items"]):
            return f"{where}: {len(got['items'])} items, verified {len(want['items'])}"
        for j, (w, v) in enumerate(zip(want["items"], value)):
            why = _match_one(w, v, ranges, bound, f"{where}[{j}]")
            if why:
                return why
        return ""
    if got["type"] != want["type"]:
        return f"{where}: {got['type']}, verified {want['type']}"
    if ranges is not None and not want.get("any") and got.get("value") != want.get("value"):
        return f"{where}: {got.get('value')!r}, verified {want.get('value')!r}"
    return ""


def _match_size(size: int, rule: Any, ranges: dict | None, bound: dict, where: str) -> str:
    if ranges is None:
        return ""
    if isinstance(rule, int):
        return "" if size == rule else f"{where} is {size}, verified {rule}"
    if "one_of" in rule:
        return "" if size in rule["one_of"] else f"{where} is {size}, verified {rule['one_of']}"
    name, a, b = rule["dim"], rule["a"], rule["b"]
    if (size - b) % a:
        return f"{where} is {size}, not {a} x {name} + {b}"
    x = (size - b) // a
    low, high = ranges.get(name, (x, x))
    if not low <= x <= high:
        return f"{where} is {size}: {name} = {x}, outside the verified {low}..{high}"
    if name in bound and bound[name][0] != x:
        return f"{where} gives {name} = {x}, {bound[name][1]} gave {bound[name][0]}"
    bound.setdefault(name, (x, where))
    return ""


def same_init(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
                    and x.shape == y.shape and torch.equal(x.cpu(), y.cpu())):
                return False
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            if not same_init(list(x), list(y)):
                return False
        elif x != y:
            return False
    return True


def exact(inputs: list) -> list[dict]:
    """The signature of one stored seed set, as it is: no dimension varies."""
    return [{"dtype": None, "inputs": [describe(v) for v in inputs]}]


def text(envelope: dict) -> str:
    """A line for docs: the space's ranges and the verified dtypes."""
    dims = ", ".join(f"{d['name']} {d['low']}..{d['high']}" for d in (envelope.get("space") or {}).get("dims", []))
    dtypes = sorted({str(s["dtype"]) for s in envelope["signatures"] if s.get("dtype")})
    return (dims or "the stored seed set's shapes only") + (f"; dtypes {', '.join(dtypes)}" if dtypes else "")
