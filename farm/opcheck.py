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
from farm.tensors import clone_values, describe_values, same_values, seed_all, to_cpu, to_device

WARM_REPS = 5  # warm runs timed on an accelerator (the first run compiles)


def draw_init_inputs(task: corpus.Task, seed: int) -> list:
    seed_all(seed)
    init_inputs = task.init_inputs()
    corpus.check_init_arity(task, init_inputs)
    return init_inputs


def draw_inputs(task: corpus.Task, seed: int) -> list:
    """Seeded forward inputs, checked: CPU tensors, and the same values for the same seed."""
    import torch

    seed_all(seed)
    inputs = task.inputs()
    for i, v in enumerate(inputs):
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            raise TaskError(task.ref.path, "get_inputs() must return CPU tensors", f"input {i} is on {v.device}")
    seed_all(seed)
    again = task.inputs()
    if not same_values(inputs, again):
        # once more before calling the task nondeterministic: a thread of the process (a
        # compiler's worker) that draws from torch's global generator between the seeding and
        # the draw spoils one pair of draws, not every pair
        seed_all(seed)
        inputs = task.inputs()
        seed_all(seed)
        again = task.inputs()
    if not same_values(inputs, again):
        differ = [i for i, (a, b) in enumerate(zip(inputs, again)) if not same_values(a, b)]
        raise TaskError(task.ref.path, "get_inputs() must be deterministic under torch.manual_seed",
                        f"two calls with the same seed gave different values (inputs {differ}), twice")
    return inputs


def build_inputs(task: corpus.Task, seed: int, report: Callable[[str], None]) -> tuple[list, list]:
    report("get_init_inputs")
    init_inputs = draw_init_inputs(task, seed)
    report("get_inputs")
    return init_inputs, draw_inputs(task, seed)


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
        ref_warm = [_timed_forward(truth, dev_inputs, spec)[1] for _ in range(len(warm))]
    checks = compare.compare_outputs(compare.as_output_list(to_cpu(out)), compare.as_output_list(to_cpu(expected)),
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
        "reference_ms": statistics.median(ref_warm) if ref_warm else ref_ms,
        "self_reference": task.reference_cls is None,
        "device": backends.device_name(spec),
    }


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
