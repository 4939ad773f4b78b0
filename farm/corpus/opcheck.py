"""`farm ops check`: does each task's Model agree with its Reference on a device? For a training
op (BACKWARD) with a Reference, its gradients too.

Each op runs in its own child (farm.runtime.children) pinned to the device, so a task that hangs or
crashes is reported and the rest go on.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from farm import targets
from farm.corpus import modes
from farm.corpus import tasks as taskfiles
from farm.corpus.inputs import draw_init_inputs, draw_inputs
from farm.corpus.tasks import TaskRef
from farm.runtime import grads, tolerance
from farm.runtime.children import run_in_child
from farm.runtime.tensors import clone_values, describe_values, seed_all, to_cpu, to_device
from farm.targets import DeviceSpec

WARM_REPS = 5  # warm runs timed on an accelerator (the first run compiles)


def build_inputs(task: taskfiles.Task, seed: int, report: Callable[[str], None]) -> tuple[list, list]:
    report("size_check")  # the memory guard runs Model's forward on the meta device
    task.guard()
    report("get_init_inputs")
    init_inputs = draw_init_inputs(task, seed)
    report("get_inputs")
    return init_inputs, draw_inputs(task, seed)


def _timed_forward(model, inputs: list, spec: DeviceSpec) -> tuple[Any, float]:
    targets.synchronize(spec)
    start = time.perf_counter()
    out = model(*clone_values(inputs))
    targets.synchronize(spec)
    return out, (time.perf_counter() - start) * 1e3


def _drift(task: taskfiles.Task, out, again, dtypes_in: list) -> str:
    """"" when two runs of Model agree within the task's tolerance, else what differs."""
    checks = tolerance.compare_outputs(tolerance.as_output_list(to_cpu(again)), tolerance.as_output_list(to_cpu(out)),
                                       tolerance.through_inputs(task.tolerance, dtypes_in, task.tolerance))
    summary = tolerance.summarize(checks)
    if summary["ok"]:
        return ""
    return "Model is not deterministic: two runs on the same inputs differ (" + "; ".join(summary["failures"]) + ")"


def backward_failures(task: taskfiles.Task, model, truth, inputs: list, seed: int, device: str) -> str:
    """A training op (BACKWARD) with a Reference: Model's gradients against Reference's for one
    upstream gradient, at the gradient tolerance (farm.runtime.grads); "" when they agree."""
    indices = grads.grad_indices(task.grad_inputs, inputs)
    _, upstream, got, got_params = grads.forward_backward(model, clone_values(inputs), indices, None, seed, device)
    _, _, expected, expected_params = grads.forward_backward(truth, clone_values(inputs), indices, upstream, seed,
                                                             device)
    pairs = [(f"input {i}", g, e) for i, g, e in zip(indices, got, expected)]
    pairs += [(f"parameter {n}", got_params.get(n), e) for n, e in expected_params.items()]
    return grads.grad_failures(pairs, grads.grad_tolerance(task.tolerance))


def check_op_child(report: Callable[[str], None], ref: TaskRef, spec: DeviceSpec, shapes: str, seed: int,
                   reference: str | None = None) -> dict:
    """Runs in the pinned child: Model against Reference (or Model against itself twice). In
    reference-data mode that only shows Model runs on the device and is deterministic."""
    import torch

    targets.import_device_runtime(spec)
    report("import")
    task = taskfiles.load_task(ref, shapes, reference=reference)
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
        warm = [_timed_forward(model, dev_inputs, spec)[1] for _ in range(0 if spec.target.interpret else WARM_REPS)]
        # Model against itself: a Model whose two runs on the same inputs differ has no truth to record
        report("determinism")
        again = _timed_forward(model, dev_inputs, spec)[0] if task.reference_cls is not None else out
        report("reference")
        expected, ref_ms = _timed_forward(truth, dev_inputs, spec)
        ref_warm = [_timed_forward(truth, dev_inputs, spec)[1] for _ in range(len(warm))]
    taskfiles.check_outputs(task, task.model_cls, out)
    taskfiles.check_outputs(task, task.truth_cls, expected)
    shapes_in, dtypes_in = describe_values(inputs)
    checks = tolerance.compare_outputs(tolerance.as_output_list(to_cpu(out)), tolerance.as_output_list(to_cpu(expected)),
                                       tolerance.through_inputs(task.tolerance, dtypes_in, task.tolerance))
    summary = tolerance.summarize(checks)
    drift = _drift(task, out, again, dtypes_in)
    if drift:
        summary = {**summary, "ok": False, "failures": [drift, *summary["failures"]]}
    # a self-referenced Model's gradients agree with themselves: only a Reference checks them
    backward = task.backward and task.reference_cls is not None and summary["ok"]
    failure = ""
    if backward:
        report("backward")
        failure = backward_failures(task, model, truth, dev_inputs, seed, dev)
        if failure:
            summary = {**summary, "ok": False, "failures": [failure]}
    return {
        "source": ref.source,
        "op": ref.op,
        "status": "pass" if summary["ok"] else "nondeterministic" if drift else "mismatch",
        "stage": "backward" if failure else "determinism" if drift else "compare",
        "backward_checked": backward,
        "max_abs": summary["max_abs"],
        "max_rel": summary["max_rel"],
        "error": "; ".join(summary["failures"]),
        "input_shapes": shapes_in,
        "shapes": task.shapes,
        "shape_origin": task.shape_origin or task.shapes,
        "shape_overrides": {k: list(v) if isinstance(v, tuple) else v for k, v in task.shape_overrides.items()},
        "shape_note": task.shape_note,
        "input_dtypes": dtypes_in,
        "outputs": [c.as_dict() for c in checks],
        "model_ms": statistics.median(warm) if warm else cold_ms,
        "first_call_ms": cold_ms,
        "reference_ms": statistics.median(ref_warm) if ref_warm else ref_ms,
        "self_reference": task.reference_cls is None,
        "mode": task.mode,
        "reference_class": task.reference_cls.__name__ if task.reference_cls is not None else None,
        "device": targets.device_name(spec),
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
        decided = modes.resolve_ref(ref, shapes, timeout_s)
        reference = decided.reference if isinstance(decided, modes.Mode) else None  # else the child says why
        outcome = run_in_child(check_op_child, (ref, spec, shapes, seed, reference), timeout_s=timeout_s,
                               env=spec.child_env())
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
