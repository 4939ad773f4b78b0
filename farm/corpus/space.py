"""Shape spaces: which dimensions of a task vary, over what range, and the cases drawn from them.

A serving engine calls a kernel with a different token count on nearly every step, so one
benchmark shape says little about a kernel. A task's space names module constants (or
keyword parameters of get_inputs) that may take any value in a range, and optionally a dtype
constant with the dtypes it may take; everything else stays at the shape set's values.
Inputs are always drawn by the file's own get_inputs at those values, so index inputs
(indptr, slot mappings, positions) stay as valid as the file makes them.

declared   SHAPE_SPACE = {"NUM_TOKENS": (1, 16384), "DTYPE": ("float16", "bfloat16")} in the
           file (docs/task-format.md). Checked on the meta device: get_inputs must honour every
           dimension at both ends of its range, and the largest corner must fit the memory limit.
derived    where the file says nothing (AKG's and KernelBench's files, used unchanged): among
           the size constants the small-shape derivation finds (farm.corpus.shapes), those that
           change the leading dimension of the most tensor inputs and nothing else; low is the
           smallest value from 1 on that get_inputs accepts, high the largest up to
           corpus.space_max (corpus.small_space_max at small shapes) whose footprint fits.
"""

from __future__ import annotations

import time
import types
from typing import Any

from farm.corpus.cases import (
    Case,
    applied,
    bench_case,
    dtype_of,
    expose_locals,
    get_inputs_keywords,
    get_value,
    with_values,
)
from farm.corpus.shapes import measure, memory_limit_bytes, size_constants
from farm.corpus.space_types import Dim, ShapeSpace
from farm.errors import TaskError
from farm.runtime.tensors import own_generator

SPACE_NAME = "SHAPE_SPACE"
PROBE_LIMIT = 40  # values tried upward from 1 for a derived dimension's low end
REAL_PROBE_S = 1.0  # derivation draws for real (get_inputs fails on meta) only where a draw is this quick

# ---------------------------------------------------------------- the space of a task


def space_of(task) -> ShapeSpace:
    """The task's space at its shape set: declared in the file, else derived (cached on the task)."""
    if task._space is None:
        raw = getattr(task.module, SPACE_NAME, None)
        task._space = declared(task, raw) if raw is not None else derived(task)
    return task._space


def _limit(task) -> tuple[int, int]:
    """(the largest a dimension may reach, the bytes a case may need) at the task's shape set."""
    policy = task.ref.policy
    if task.shapes == "small":
        return policy.small_space_max, int(policy.small_budget_mb * 2**20)
    limit = task._host_limit = task._host_limit or memory_limit_bytes(policy)  # read once per task (Task.guard)
    return policy.space_max, min(limit, task.device_budget_bytes or limit)


def declared(task, raw: Any) -> ShapeSpace:
    path, module = task.ref.path, task.module
    if not isinstance(raw, dict) or not raw:
        raise TaskError(path, f"{SPACE_NAME} must be a non-empty dict",
                        "like {'NUM_TOKENS': (1, 16384), 'DTYPE': ('float16', 'bfloat16')}")
    keywords = get_inputs_keywords(module)
    dims: list[Dim] = []
    dtype: tuple[str, tuple[str, ...], bool] | None = None
    for name, spec in raw.items():
        keyword = name in keywords
        current = keywords[name] if keyword else get_value(module, name, _MISSING) if isinstance(name, str) else _MISSING
        if current is _MISSING:
            raise TaskError(path, f"{SPACE_NAME} names {name!r}, which is neither a module constant nor a keyword "
                                  "parameter of get_inputs()")
        if _is_dtype(current):
            dtype = (name, _dtype_names(path, name, spec, current), keyword)
            continue
        if not (isinstance(current, int) and not isinstance(current, bool)):
            raise TaskError(path, f"{SPACE_NAME}[{name!r}]: {name} must be an int (a size) or a torch dtype",
                            f"it is {current!r}")
        if not (isinstance(spec, (tuple, list)) and len(spec) == 2 and all(type(v) is int for v in spec)
                and 1 <= spec[0] <= spec[1]):
            raise TaskError(path, f"{SPACE_NAME}[{name!r}] must be a (low, high) pair of ints, 1 <= low <= high",
                            repr(spec))
        dims.append(Dim(name, spec[0], spec[1], min(max(current, spec[0]), spec[1]), keyword))
    dtype_name, dtypes, dtype_keyword = dtype or (None, (), False)
    space = ShapeSpace(tuple(dims), dtype_name, dtypes, dtype_keyword, origin="declared")
    cap, budget = _limit(task)
    if task.shapes == "small":  # the interpreter runs these: the declared range, cut to the small budget
        space = _clip(task, space, cap, budget)
    _check_honoured(task, space, budget)
    return space


_MISSING = object()


def _is_dtype(value: Any) -> bool:
    import torch

    return isinstance(value, torch.dtype)


def _dtype_names(path, name: str, spec: Any, current) -> tuple[str, ...]:
    base = str(current).removeprefix("torch.")
    try:
        if not isinstance(spec, (tuple, list)):
            raise TypeError(f"a {type(spec).__name__}, not a tuple")
        names = [str(v).removeprefix("torch.") for v in spec]
        for n in names:
            dtype_of(n)
    except (TypeError, ValueError) as exc:
        raise TaskError(path, f"{SPACE_NAME}[{name!r}] must be a tuple of torch dtype names",
                        f"{spec!r}: {exc}") from None
    if not names:
        raise TaskError(path, f"{SPACE_NAME}[{name!r}] must name at least one dtype")
    return tuple(dict.fromkeys([base] + names)) if base in names else tuple(dict.fromkeys(names))


def _clip(task, space: ShapeSpace, cap: int, budget: int) -> ShapeSpace:
    dims = []
    for d in space.dims:
        top = max(d.base, min(d.high, cap))
        high = _largest_fitting(task, space, d, d.base, top, budget)
        dims.append(Dim(d.name, min(d.low, high), high, min(d.base, high), d.keyword))
    cut = [f"{d.name} to {n.high}" for d, n in zip(space.dims, dims) if n.high < d.high]
    note = f"declared; at small shapes cut {', '.join(cut)} (corpus.small_space_max, the small budget)" if cut else ""
    return ShapeSpace(tuple(dims), space.dtype_name, space.dtypes, space.dtype_keyword, space.origin, note)


def _check_honoured(task, space: ShapeSpace, budget: int) -> None:
    """Every dimension at both ends changes what get_inputs draws, and the largest corner fits."""
    base = bench_case(space, 0)
    base_shapes = _input_shapes(task, space, base)
    for d in space.dims:
        for value in sorted({d.low, d.high} - {d.base}):
            case = with_values(base, {d.name: value}, "corner")
            shapes = _input_shapes(task, space, case)
            if shapes == base_shapes:
                raise TaskError(task.ref.path, f"{SPACE_NAME} declares {d.name} {d.low}..{d.high}, which get_inputs() "
                                               f"does not honour", f"at {case.describe()} it draws the same shapes")
    if space.dtype_name:
        for dt in space.dtypes:
            _input_shapes(task, space, Case(base.values, dt, 0, "dtype"))
    corner = Case(tuple(sorted((d.name, d.high) for d in space.dims)), base.dtype, 0, "largest")
    need = _footprint(task, space, corner)
    if need is not None and need > budget:
        raise TaskError(task.ref.path, f"{SPACE_NAME}: the {corner.describe()} needs {need / 2**20:.1f} MiB, over "
                                       f"the memory limit of {budget / 2**20:.1f} MiB",
                        "narrow the range, or raise corpus.memory_limit_mb")


def _input_shapes(task, space: ShapeSpace, case: Case, strict: bool = True, real: bool = True) -> list | None:
    """Shapes (None for non-tensors) of get_inputs at `case`, on the meta device where it runs
    there, else (`real`) for real; a failure is the task's error naming the case (None if not
    strict)."""
    import torch

    with applied(task, space, case):
        try:
            try:
                with torch.device("meta"), own_generator():
                    values = task.module.get_inputs(**task.input_kwargs)
            except Exception:
                if not real:
                    raise
                with own_generator(case.seed):
                    values = task.module.get_inputs(**task.input_kwargs)
        except Exception as exc:  # noqa: BLE001 - the file's own failure at this case
            if not strict:
                return None
            raise TaskError(task.ref.path, f"get_inputs() fails at the {case.describe()}",
                            f"{type(exc).__name__}: {exc}") from None
    return [tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in values]


def _footprint(task, space: ShapeSpace, case: Case) -> int | None:
    """Bytes of inputs + parameters + outputs at `case` (meta device); None if not measurable."""
    with applied(task, space, case):
        try:
            return measure(task.module, task.model_cls).total_bytes
        except Exception:  # noqa: BLE001 - get_inputs cannot run on meta: the guard measures for real later
            return None


def _largest_fitting(task, space: ShapeSpace, d: Dim, low: int, high: int, budget: int,
                     valid=lambda v: True) -> int:
    """The largest value in [low, high] of dimension d (others at base) whose footprint fits
    (and, for a derived dimension, whose inputs keep their relation to it: `valid`)."""
    base = bench_case(space, 0)

    def fits(v: int) -> bool:
        need = _footprint(task, space, with_values(base, {d.name: v}, "probe"))
        return (need is None or need <= budget) and valid(v)

    if fits(high):
        return high
    while low < high:  # bisection: footprints grow with a leading dimension
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def derived(task) -> ShapeSpace:
    """The leading dimension(s) the tensor inputs share (see the module docstring)."""
    module = task.module
    local = expose_locals(module, task.ref.path)
    scalable, _fixed = size_constants(module)
    init_names = _init_names(module)
    empty = ShapeSpace(origin="none")
    candidates = {}
    for n, v in scalable.items():
        if n in init_names:
            continue
        if isinstance(v, tuple):
            candidates.update({f"{n}[{i}]": item for i, item in enumerate(v) if item >= 2})
        else:
            candidates[n] = v
    candidates.update(local)
    if not candidates:
        return ShapeSpace(origin="none", note="get_inputs reads no size constant to vary")
    space0 = ShapeSpace(origin="derived")
    base = Case((), None, 0, "bench")
    base_shapes = _input_shapes(task, space0, base, strict=False, real=False)
    if base_shapes is None:  # probing needs real draws: only where one is quick
        started = time.perf_counter()
        base_shapes = _input_shapes(task, space0, base, strict=False)
        if base_shapes is None:
            return ShapeSpace(origin="none", note="get_inputs fails at the shape set's own values")
        if time.perf_counter() - started > REAL_PROBE_S:
            return ShapeSpace(origin="none", note=f"get_inputs does not run on the meta device and one real draw "
                                                  f"takes over {REAL_PROBE_S:g} s: declare {SPACE_NAME}")
    slopes: dict[str, dict[int, int]] = {}
    for name, value in candidates.items():
        found = _probe(task, space0, name, value, base_shapes)
        if found:
            slopes[name] = found
    if not slopes:
        return ShapeSpace(origin="none", note="no size constant changes only the inputs' leading dimension")
    best = max(len(v) for v in slopes.values())
    names = sorted(n for n, v in slopes.items() if len(v) == best)
    cap, budget = _limit(task)
    dims = []
    for name in names:
        value = candidates[name]
        probe_space = ShapeSpace((Dim(name, 1, value, value),), origin="derived")

        def valid(v: int, name=name, value=value, probe_space=probe_space) -> bool:
            shapes = _input_shapes(task, probe_space, Case(((name, v),), None, 0, "probe"), strict=False)
            return shapes is not None and _follows(base_shapes, shapes, slopes[name], v - value)

        low = next((v for v in range(1, min(value, PROBE_LIMIT) + 1) if valid(v)), value)
        top = max(value, cap)
        high = _largest_fitting(task, probe_space, Dim(name, low, top, value), value, top, budget, valid)
        dims.append(Dim(name, low, high, value))
    dtype_name = _dtype_constant(module)
    dtypes = (str(getattr(module, dtype_name)).removeprefix("torch."),) if dtype_name else ()
    return ShapeSpace(tuple(dims), dtype_name, dtypes, False, "derived",
                      f"leading dimension of {best} tensor input(s)") if dims else empty


def _init_names(module: types.ModuleType) -> set[str]:
    from farm.corpus.shapes import _code_names

    return _code_names(module.get_init_inputs)


def _dtype_constant(module: types.ModuleType) -> str | None:
    from farm.corpus.shapes import _code_names

    read = _code_names(module.get_inputs)
    found = [n for n in sorted(read) if _is_dtype(module.__dict__.get(n))]
    return found[0] if len(found) == 1 else None


def _probe(task, space0: ShapeSpace, name: str, value: int, base_shapes: list) -> dict[int, int]:
    """{input index: how much its leading dimension moves per unit of `name`} for the tensor
    inputs whose leading dimension alone follows it; {} where it changes anything else, or nothing."""
    for trial in (value - 1, value + 1) if value > 2 else (value + 1,):
        space = ShapeSpace((Dim(name, 1, max(trial, value), value),), origin="derived")
        shapes = _input_shapes(task, space, Case(((name, trial),), None, 0, "probe"), strict=False)
        if shapes is None or len(shapes) != len(base_shapes):
            continue
        slopes = {}
        for i, (before, after) in enumerate(zip(base_shapes, shapes)):
            if before == after:
                continue
            if before is None or after is None or len(before) != len(after) or not before or before[1:] != after[1:]:
                return {}
            slopes[i] = (after[0] - before[0]) * (trial - value)  # trial - value is 1 or -1
        return slopes
    return {}


def _follows(base_shapes: list, shapes: list, slopes: dict[int, int], delta: int) -> bool:
    """The inputs at a dimension moved by `delta` keep the relation the probe found: an index
    input (randperm(pool)[:n], indptr of n + 1) that stops following it is no longer valid there."""
    if len(shapes) != len(base_shapes):
        return False
    for i, (before, after) in enumerate(zip(base_shapes, shapes)):
        want = before if i not in slopes else (before[0] + slopes[i] * delta,) + tuple(before[1:])
        if after != want:
            return False
    return True
