"""`farm ops check`: does each task's Model agree with its Reference on a device?

Each op runs in its own child (farm.isolation) pinned to the device, so a task that hangs or
crashes is reported and the rest go on.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from farm import backends, compare, corpus
from farm.backends import DeviceSpec
from farm.corpus import TaskRef
from farm.errors import TaskError
from farm.isolation import run_in_child

WARM_REPS = 5  # warm runs timed on an accelerator (the first run compiles)


def seed_all(seed: int) -> None:
    import torch

    torch.manual_seed(seed)  # also seeds every CUDA/NPU device


def to_device(values: list, device: str) -> list:
    import torch

    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to(device)
        if isinstance(v, (list, tuple)):
            return type(v)(move(x) for x in v)
        return v

    return [move(v) for v in values]


def clone_values(values: list) -> list:
    import torch

    def cp(v):
        if isinstance(v, torch.Tensor):
            return v.clone()
        if isinstance(v, (list, tuple)):
            return type(v)(cp(x) for x in v)
        return v

    return [cp(v) for v in values]


def describe_values(values: list) -> tuple[list, list]:
    """(shapes, dtypes) as the .pt and the tables show them; None for non-tensors."""
    import torch

    shapes, dtypes = [], []
    for v in values:
        if isinstance(v, torch.Tensor):
            shapes.append(list(v.shape))
            dtypes.append(str(v.dtype))
        else:
            shapes.append(None)
            dtypes.append(None)
    return shapes, dtypes


def build_inputs(task: corpus.Task, seed: int, report: Callable[[str], None]) -> tuple[list, list]:
    """Seeded init inputs and forward inputs, checked for the rules of the task format."""
    import torch

    report("get_init_inputs")
    seed_all(seed)
    init_inputs = task.init_inputs()
    corpus.check_init_arity(task, init_inputs)
    report("get_inputs")
    seed_all(seed)
    inputs = task.inputs()
    for i, v in enumerate(inputs):
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            raise TaskError(task.ref.path, "get_inputs() must return CPU tensors", f"input {i} is on {v.device}")
    seed_all(seed)
    again = task.inputs()
    if not _same(inputs, again):
        raise TaskError(task.ref.path, "get_inputs() must be deterministic under torch.manual_seed",
                        "two calls with the same seed gave different values")
    return init_inputs, inputs


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _timed_forward(model, inputs: list, spec: DeviceSpec) -> tuple[Any, float]:
    backends.synchronize(spec)
    start = time.perf_counter()
    out = model(*clone_values(inputs))
    backends.synchronize(spec)
    return out, (time.perf_counter() - start) * 1e3


def check_op_child(report: Callable[[str], None], ref: TaskRef, spec: DeviceSpec, shapes: str, seed: int) -> dict:
    """Runs in the pinned child: Model against Reference (or Model against itself twice)."""
    import torch

    backends.import_device_runtime(spec)
    report("import")
    task = corpus.load_task(ref, shapes)
    init_inputs, inputs = build_inputs(task, seed, report)
    report("init")
    dev = spec.torch_device
    seed_all(seed)
    model = task.model_cls(*init_inputs).to(dev).eval()
    seed_all(seed)
    truth = task.truth_cls(*init_inputs).to(dev).eval()
    dev_inputs = to_device(inputs, dev)
    with torch.no_grad():
        report("forward")
        out, cold_ms = _timed_forward(model, dev_inputs, spec)
        warm = [_timed_forward(model, dev_inputs, spec)[1] for _ in range(0 if spec.backend.interpret else WARM_REPS)]
        report("reference")
        expected, ref_ms = _timed_forward(truth, dev_inputs, spec)
    checks = compare.compare_outputs(compare.as_output_list(_cpu(out)), compare.as_output_list(_cpu(expected)),
                                     task.tolerance)
    shapes_in, dtypes_in = describe_values(inputs)
    summary = compare.summarize(checks)
    return {
        "source": ref.source,
        "op": ref.op,
        "status": "pass" if summary["ok"] else "mismatch",
        "stage": "compare",
        "max_abs": summary["max_abs"],
        "max_rel": summary["max_rel"],
        "error": "; ".join(summary["failures"]),
        "input_shapes": shapes_in,
        "input_dtypes": dtypes_in,
        "outputs": [c.as_dict() for c in checks],
        "model_ms": statistics.median(warm) if warm else cold_ms,
        "first_call_ms": cold_ms,
        "reference_ms": ref_ms,
        "self_reference": task.reference_cls is None,
        "device": backends.device_name(spec),
    }


def _cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(v) for v in value)
    return value


def check_ops(
    refs: list[TaskRef],
    spec: DeviceSpec,
    shapes: str,
    seed: int,
    timeout_s: float,
    on_done: Callable[[dict], None] | None = None,
) -> list[dict]:
    results = []
    for ref in refs:
        outcome = run_in_child(check_op_child, (ref, spec, shapes, seed), timeout_s=timeout_s, env=spec.child_env())
        if outcome.ok:
            record = outcome.value
        else:
            record = {"source": ref.source, "op": ref.op, "status": "error", "stage": outcome.stage,
                      "error": _short_error(outcome.error), "max_abs": None, "max_rel": None,
                      "input_shapes": [], "input_dtypes": [], "model_ms": None}
        record["elapsed_s"] = outcome.elapsed_s
        results.append(record)
        if on_done:
            on_done(record)
    return results


def _short_error(text: str) -> str:
    """The last line of a traceback is what the user needs in a table; TaskErrors say it all."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return text
    last = lines[-1]
    return last.split("TaskError: ", 1)[-1] if "TaskError" in last else last
