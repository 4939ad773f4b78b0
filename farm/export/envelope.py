"""Which inputs an exported kernel may take: its verified envelope (docs/export.md).

The search verified the kernel at its shape set's benchmark case. Before the export widens
dispatch to the task's shape space, it checks the kernel at a spread of cases drawn from that
space (farm.corpus.cases: 1, a prime, one past a power of two, the largest that fits, each
dtype, random ones), forward and, for a training op, backward: the kernel runs in a child
(farm.export.case_runs), the task's PyTorch truth runs here, and the outputs are compared
here at the farm's tolerances. Every case passes: the envelope is the space (the signatures
farm.export.package_envelope.infer finds in the inputs drawn). Any fails, or the kernel
cannot run on this machine, or the task has no PyTorch truth: the envelope is the stored seed
set alone, as before, and op.json says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from farm.corpus import tasks as taskfiles
from farm.corpus.cases import applied, draw_cases
from farm.corpus.inputs import draw_init_inputs, draw_inputs
from farm.errors import FarmError
from farm.export import package_envelope
from farm.runtime import grads
from farm.runtime.tensors import clone_values, describe_values, own_generator, to_cpu, to_device
from farm.runtime.tolerance import all_ok, as_output_list, compare_outputs, through_inputs

DEFAULT_CASES = 8


def exact(data: dict, why: str) -> dict:
    """The envelope of the stored seed set alone."""
    return {"status": "exact", "reason": why, "space": None, "signatures": package_envelope.exact(data["inputs"]),
            "cases": []}


def check(ref: taskfiles.TaskRef, data: dict, kernel_file: Path, target: dict, count: int = DEFAULT_CASES,
          seed: int = 0, timeout_s: float = 900) -> dict:
    """The envelope of one target's kernel; `data` is the op's .pt (shape set, seed, inputs)."""
    if count <= 0:
        return exact(data, "--cases 0: checked at the stored seed set only")
    why = _cannot_run(target)
    if why:
        return exact(data, why)
    task = taskfiles.load_task(ref, data.get("shapes") or "bench", reference=data.get("reference_class"))
    truth = task.reference_cls or (task.model_cls if task.mode == "model" else None)
    if truth is None:
        return exact(data, "no PyTorch truth to check other cases against (reference-data mode)")
    space = task.space
    if not space.dims and len(space.dtypes) < 2:
        return exact(data, f"the task's shape space is fixed ({space.note or 'nothing varies'})")
    device = target["device_type"]
    pt_seed = int(data.get("seed") or 0)
    init_inputs = draw_init_inputs(task, pt_seed)
    cases = draw_cases(space, count, seed, pt_seed)
    runs = [_truth_case(task, space, case, truth, init_inputs, device) for case in cases]
    results = _kernel_runs(kernel_file, init_inputs, runs, device, bool(target.get("interpret")), timeout_s)
    verdicts = [_verdict(run, result, task) for run, result in zip(runs, results)]
    failed = [v for v in verdicts if not v["passed"]]
    if failed:
        doc = exact(data, f"failed at the {failed[0]['case_text']}: {failed[0]['reason']}")
        doc["cases"] = verdicts
        return doc
    checked = [(run["case"].as_dict(), [package_envelope.describe(v) for v in run["inputs"]]) for run in runs]
    return {"status": "checked", "reason": f"{len(cases)} cases of the space passed", "space": space.as_dict(),
            "signatures": package_envelope.infer(space.as_dict(), checked), "cases": verdicts,
            "backward": task.backward}


def _cannot_run(target: dict) -> str:
    import torch

    if target.get("interpret"):
        return ""  # the child runs Triton's interpreter
    module = getattr(torch, target["device_type"], None)
    try:
        if module is not None and module.is_available():
            return ""
    except Exception:  # noqa: BLE001, S110 - a half-installed runtime: no device
        pass
    return f"no {target['device_type']} device here to check cases on: run farm export on one"


def _truth_case(task, space, case, truth: type, init_inputs: list, device: str) -> dict:
    """The inputs of one case and the truth's outputs (and gradients) for them."""
    import torch

    with applied(task, space, case):
        inputs = draw_inputs(task, case.seed)
    with own_generator(0):
        model = truth(*init_inputs).to(device).eval()
    run: dict[str, Any] = {"case": case, "inputs": inputs}
    if task.backward:
        indices = grads.grad_indices(task.grad_inputs, inputs)
        raw, upstream, grad_inputs, grad_params = grads.forward_backward(
            model, to_device(clone_values(inputs), device), indices, None, case.seed, device)
        run.update(outputs=as_output_list(to_cpu(raw)), grad_indices=indices, upstream=upstream,
                   grad_inputs=grad_inputs, grad_params=grad_params)
    else:
        with torch.no_grad():
            run["outputs"] = as_output_list(to_cpu(model(*to_device(clone_values(inputs), device))))
    return run



def _kernel_runs(kernel_file: Path, init_inputs: list, runs: list[dict], device: str, interpret: bool,
                 timeout_s: float) -> list[dict]:
    import torch

    with tempfile.TemporaryDirectory(prefix="kfarm-cases-") as tmp:
        cases = [{"inputs": r["inputs"], "grad_indices": r.get("grad_indices"), "upstream": r.get("upstream")}
                 for r in runs]
        torch.save({"init_inputs": init_inputs, "cases": cases}, Path(tmp) / "in.pt")
        spec = {"kernel_file": str(kernel_file), "inputs_file": str(Path(tmp) / "in.pt"),
                "output_file": str(Path(tmp) / "out.pt"), "device": device}
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)
        if interpret:
            env["TRITON_INTERPRET"] = "1"
        try:
            proc = subprocess.run([sys.executable, "-m", "farm.export.case_runs", str(Path(tmp) / "spec.json")],
                                  env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise FarmError(f"{kernel_file}: running it at {len(runs)} cases took over {timeout_s:.0f} s") from None
        out = Path(tmp) / "out.pt"
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return [{"error": f"the kernel's process failed: {tail}"} for _ in runs]
        results = torch.load(out, weights_only=True).get("results") or []
    return list(results) + [{"error": "no result"}] * (len(runs) - len(results))


def _verdict(run: dict, result: dict, task) -> dict:
    case = run["case"]
    doc = {**case.as_dict(), "case_text": case.describe(), "passed": False, "reason": ""}
    if not isinstance(result, dict) or "error" in result:
        doc["reason"] = (result or {}).get("error", "no result") if isinstance(result, dict) else "no result"
        return doc
    tolerance = through_inputs(task.tolerance, describe_values(run["inputs"])[1], task.tolerance)
    checks = compare_outputs(list(result.get("outputs") or []), run["outputs"], tolerance)
    if not all_ok(checks):
        doc["reason"] = next(c.reason for c in checks if not c.ok)
        return doc
    if task.backward:
        tolerance = grads.grad_tolerance(task.tolerance)
        labelled = [(f"input {i}", g, e) for i, g, e in zip(run["grad_indices"], result.get("grad_inputs") or [],
                                                             run["grad_inputs"])]
        params = result.get("grad_params") or {}
        labelled += [(f"parameter {n}", params.get(n), e) for n, e in sorted(run["grad_params"].items())]
        failure = grads.grad_failures(labelled, tolerance)
        if failure:
            doc["reason"] = failure
            return doc
    doc["passed"] = True
    return doc
