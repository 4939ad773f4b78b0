"""Reference data over the cases of a task's shape space.

The `.pt` holds the benchmark case, keys unchanged for the existing tools. The reference worker
also runs the original Model at a spread of cases drawn from the task's space (farm.corpus.cases:
1, a prime, one past a power of two, the largest that fits, each dtype, random ones), each with
its own seed, and keeps them in a companion object beside the `.pt`:

    refs/<source>/<op>.cases    {"op_name", "source", "pt_seed", "task_sha256", "shapes",
                                 "space": {...}, "cases": [{"case": {"values", "dtype", "seed",
                                 "label"}, "inputs", "outputs", ("grad_input_indices",
                                 "grad_outputs", "grad_inputs", "grad_params")}, ...]}

The `.pt` points at it (`"cases": {"key", "sha256", "count"}`) and the manifest entry records it
(`cases_key`, `cases_sha256`, `cases`), so it travels with its `.pt` (a plain --output-dir folder
included: the name does not end in .pt, so tools that glob `*.pt` never see it) and `farm cache
verify/push/pull/repair` treat it with it. A verifier iterates the benchmark case (the `.pt`),
these cases, and the secret input sets (farm.reference.secret_inputs, each with its case), all with
shape, dtype and seed.
"""

from __future__ import annotations

from typing import Any, Callable

from farm.corpus.cases import applied, draw_cases
from farm.corpus.tasks import validate_name
from farm.errors import FarmError, TaskError
from farm.reference.ptfile import load_companion, load_pt_file
from farm.runtime import grads
from farm.runtime.tensors import clone_values, to_device
from farm.storage import Store

POINTER = "cases"  # the extra key of the .pt: {"key", "sha256", "count"}
SUFFIX = ".cases"


def cases_key(source: str, op: str) -> str:
    return f"refs/{validate_name(source, 'source')}/{validate_name(op, 'op')}{SUFFIX}"


def record(task, run_set: Callable[[int], dict], device: str, count: int, seed: int,
           report: Callable[[str], None] = lambda stage: None, model=None) -> dict[str, Any] | None:
    """The companion document: the original Model at `count` cases of the task's space beside the
    benchmark case (which the .pt holds); None where the space is fixed or count is 0.
    `run_set(seed)` draws and runs one set at the applied case (farm.reference.generate.record_set):
    a case over reference.ship_max_mb is kept compact like the .pt (no "inputs", "outputs" empty,
    "input_recipe" and "output_samples"). A case where get_inputs or the Model fails is the
    task's error, naming the case."""
    if count <= 0:
        return None
    space = task.space
    if not space.dims and len(space.dtypes) < 2:
        return None
    drawn = [c for c in draw_cases(space, count + 1, seed ^ 0x5EED, seed) if c.label != "bench"][:count]
    out = []
    for case in drawn:
        report(f"case {case.label}")
        try:
            with applied(task, space, case):
                one = run_set(case.seed)
                extras = _backward(task, model, one["inputs"], case.seed, device) if task.backward else {}
        except TaskError:
            raise
        except Exception as exc:  # noqa: BLE001 - the original's failure at this case is the task's error
            raise TaskError(task.ref.path, f"the original Model fails at the {case.describe()}",
                            f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}") from None
        kept = {k: one[k] for k in ("inputs", "outputs", "input_recipe", "compact", "output_samples") if k in one}
        out.append({"case": case.as_dict(), **kept, **extras})
    return {"op_name": task.ref.op, "source": task.ref.source, "pt_seed": seed, "task_sha256": task.ref.sha256(),
            "shapes": task.shapes, "space": space.as_dict(), "cases": out}


def _backward(task, model, inputs: list, seed: int, device: str) -> dict[str, Any]:
    indices = grads.grad_indices(task.grad_inputs, inputs)
    _, upstream, grad_inputs, grad_params = grads.forward_backward(
        model.train(False), to_device(clone_values(inputs), device), indices, None, seed, device)
    return {"grad_input_indices": indices, "grad_outputs": upstream, "grad_inputs": grad_inputs,
            "grad_params": grad_params}


def load(store: Store, data: dict[str, Any]) -> list[dict[str, Any]]:
    """The cases the .pt points at, checked against its recorded sha256; [] where it records none."""
    pointer = data.get(POINTER)
    if not pointer:
        return []
    key = pointer["key"]
    if store.head(key) is None:
        raise FarmError(f"the reference data of {data.get('source')}/{data.get('op_name')} points at its cases {key}, "
                        f"which {store.url} lacks: run `farm reference --force` for it, or `farm cache pull` again")
    doc = load_companion(store, key, pointer.get("sha256"))
    cases = doc.get("cases") if isinstance(doc, dict) else None
    if not isinstance(cases, list):
        raise FarmError(f"{store.url}/{key}: holds no cases")
    return cases


def attach(store: Store | None, data: dict[str, Any], beside=None) -> dict[str, Any]:
    """The .pt dict with its cases under "_case_sets" (never written anywhere), for the verifier
    (farm.evaluate.space_cases). `beside`: the companion file next to a folder's .pt, read in
    place (its sha256 is checked by farm.reference.folder); else the store's."""
    if not data.get(POINTER):
        return data
    if beside is not None and beside.is_file():
        doc = load_pt_file(beside)
        cases = doc.get("cases") if isinstance(doc, dict) else None
        if not isinstance(cases, list):
            raise FarmError(f"{beside}: holds no cases")
    elif store is not None:
        cases = load(store, data)
    else:
        return data
    data["_case_sets"] = cases
    return data
