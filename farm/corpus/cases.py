"""Cases of a shape space: a point (dimension values, dtype, seed), how get_inputs draws at it,
and the spread of cases the reference worker and the verifiers iterate.

A case is applied to a loaded task by setting module constants (one element of a tuple
constant: `SHAPE[0]`), passing keyword arguments of get_inputs, or, for sizes a file keeps
as literals inside get_inputs (AKG's style), by a rewritten get_inputs that reads them from
the case (expose_locals). Outside a case every task draws exactly what its file says.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from farm.corpus import case_locals
from farm.corpus.case_locals import CASE_GLOBAL as _CASE_GLOBAL
from farm.corpus.case_locals import LOCAL_PREFIX
from farm.corpus.space_types import Dim, ShapeSpace


@dataclass(frozen=True)
class Case:
    """One point of a space: the dimension values, the dtype, and the seed of its inputs."""

    values: tuple[tuple[str, int], ...]
    dtype: str | None
    seed: int
    label: str  # bench, low, prime, pow2+1, high, dtype, random

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.values] + ([f"dtype={self.dtype}"] if self.dtype else [])
        return f"{self.label} case ({', '.join(parts) or 'fixed'}; seed {self.seed})"

    def as_dict(self) -> dict:
        return {"values": dict(self.values), "dtype": self.dtype, "seed": self.seed, "label": self.label}

    @classmethod
    def from_dict(cls, doc: dict) -> Case:
        return cls(tuple(sorted((k, int(v)) for k, v in doc["values"].items())), doc.get("dtype"), int(doc["seed"]),
                   doc.get("label", "case"))


# ---------------------------------------------------------------- applying a case


def get_inputs_keywords(module: types.ModuleType) -> dict[str, Any]:
    import inspect

    try:
        params = inspect.signature(module.get_inputs).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def dtype_of(name: str):
    import torch

    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name!r} is not a torch dtype")
    return value


def expose_locals(module: types.ModuleType, path) -> dict[str, int]:
    """Sizes a file keeps as literals inside get_inputs, made settable per case (case_locals)."""
    from farm import pyast

    try:
        source = path.read_text(errors="replace")
    except OSError:
        return {}
    return case_locals.expose_locals(module, source, str(path), parse=pyast.parse)


_ELEMENT = re.compile(r"^([A-Za-z_]\w*)\[(\d+)\]$")  # SHAPE[0]: one element of a tuple constant


def get_value(module: types.ModuleType, name: str, default: Any = None) -> Any:
    m = _ELEMENT.match(name)
    if not m:
        return getattr(module, name, default)
    value = getattr(module, m[1], None)
    return value[int(m[2])] if isinstance(value, tuple) and int(m[2]) < len(value) else default


def set_value(module: types.ModuleType, name: str, value: Any) -> None:
    m = _ELEMENT.match(name)
    if not m:
        setattr(module, name, value)
        return
    items = list(getattr(module, m[1]))
    items[int(m[2])] = value
    setattr(module, m[1], tuple(items))


@contextlib.contextmanager
def applied(task, space: ShapeSpace, case: Case) -> Iterator[None]:
    """The task's get_inputs draws at `case` for the duration (module constants set, keyword
    arguments passed); the memory guard measures again."""
    module = task.module
    saved: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    keyword_dims = {d.name for d in space.dims if d.keyword}
    local = {name: value for name, value in case.values if name.startswith(LOCAL_PREFIX)}
    saved_local = module.__dict__.get(_CASE_GLOBAL)
    if local:
        module.__dict__[_CASE_GLOBAL] = local
    for name, value in case.values:
        if name in keyword_dims:
            kwargs[name] = value
        elif name not in local:
            root = _ELEMENT.sub(r"\1", name)
            saved.setdefault(root, getattr(module, root))
            set_value(module, name, value)
    if case.dtype and space.dtype_name:
        if space.dtype_keyword:
            kwargs[space.dtype_name] = dtype_of(case.dtype)
        else:
            saved[space.dtype_name] = getattr(module, space.dtype_name)
            setattr(module, space.dtype_name, dtype_of(case.dtype))
    before = (task.input_kwargs, task._guarded)
    task.input_kwargs, task._guarded = kwargs, False
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
        if local:
            module.__dict__[_CASE_GLOBAL] = saved_local if saved_local is not None else {}
        task.input_kwargs, task._guarded = before


def bench_case(space: ShapeSpace, seed: int) -> Case:
    return Case(tuple(sorted((d.name, d.base) for d in space.dims)), space.dtypes[0] if space.dtypes else None, seed,
                "bench")


def with_values(case: Case, values: dict[str, int], label: str) -> Case:
    merged = {**dict(case.values), **values}
    return Case(tuple(sorted(merged.items())), case.dtype, case.seed, label)


# ---------------------------------------------------------------- cases


def awkward(d: Dim) -> list[tuple[str, int]]:
    """1 (or low), a prime, one past a power of two, the largest: where tail masks, grids and
    offsets break."""
    out = [("low", d.low)]
    prime = _prime_between(max(d.low, 2), max(d.low, int(math.sqrt(d.low * d.high)) | 1))
    if prime is not None:
        out.append(("prime", prime))
    k = int(math.log2(max(d.high - 1, 1)))
    while k >= 1 and 2**k + 1 > d.high:
        k -= 1
    if k >= 1 and 2**k + 1 >= d.low:
        out.append(("pow2+1", 2**k + 1))
    out.append(("high", d.high))
    return out


def _prime_between(low: int, high: int) -> int | None:
    """The largest prime in [low, high]."""
    for n in range(high, low - 1, -1):
        if n >= 2 and all(n % p for p in range(2, math.isqrt(n) + 1)):
            return n
    return None


def draw_cases(space: ShapeSpace, count: int, seed: int, bench_seed: int) -> list[Case]:
    """The benchmark case, the awkward ones, each other dtype, then random ones (log-uniform
    per dimension) up to `count`; each with a seed of its own from `seed`'s generator."""
    rng = random.Random(seed)
    base = bench_case(space, bench_seed)
    wanted: list[Case] = [base]
    for d in space.dims:
        wanted += [with_values(base, {d.name: v}, label) for label, v in awkward(d)]
    for dt in space.dtypes[1:]:
        wanted.append(Case(base.values, dt, 0, "dtype"))
    tries = 0
    while len(_unique(wanted)) < count and space.dims and tries < 20 * count:
        tries += 1
        values = {d.name: _log_uniform(rng, d.low, d.high) for d in space.dims}
        wanted.append(Case(tuple(sorted(values.items())), rng.choice(space.dtypes) if space.dtypes else None, 0,
                           "random"))
    out = []
    for case in _unique(wanted)[:max(count, 1)]:
        out.append(case if case.label == "bench" else
                   Case(case.values, case.dtype, rng.randrange(1, 2**31 - 1), case.label))
    return out


def _unique(cases: list[Case]) -> list[Case]:
    seen, out = set(), []
    for c in cases:
        if (c.values, c.dtype) not in seen:
            seen.add((c.values, c.dtype))
            out.append(c)
    return out


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return min(high, max(low, round(math.exp(rng.uniform(math.log(low), math.log(high))))))
