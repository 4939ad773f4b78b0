"""Step one of the flow: run each task's original Model on the source device and keep its
inputs and outputs as a .pt, so the target never needs the CUDA code.

`generate_reference` is the library function (one task, current process, device already
pinned); `reference_child` wraps it for a child process; `generate_references` runs a batch,
one child per op, stores the .pt files and merges the manifest.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from farm import __version__, backends, corpus, manifest
from farm.backends import DeviceSpec
from farm.compare import as_output_list
from farm.corpus import TaskRef
from farm.errors import FarmError
from farm.isolation import run_in_child
from farm.opcheck import draw_init_inputs, draw_inputs
from farm.storage import Store
from farm.storage.base import sha256_file
from farm.tensors import clone_values, describe_values, seed_all, to_cpu, to_device

log = logging.getLogger(__name__)

PT_KEYS = ("op_name", "seed", "save_inputs", "inputs", "input_shapes", "input_dtypes",
           "outputs", "output_shapes", "output_dtypes", "init_inputs")


def _shapes_dtypes(values: list) -> tuple[list, list]:
    import torch

    shapes, dtypes = describe_values(values)
    return [torch.Size(s) if s is not None else None for s in shapes], dtypes


def generate_reference(task: corpus.Task, spec: DeviceSpec, seed: int,
                       report: Callable[[str], None] = lambda stage: None) -> dict[str, Any]:
    """The .pt dict for one task: seed, Model(*get_init_inputs()), get_inputs(), clone, forward."""
    import torch

    dev = spec.torch_device
    report("init")
    init_inputs = draw_init_inputs(task, seed)
    seed_all(seed)
    model = task.model_cls(*init_inputs).to(dev).eval()
    report("get_inputs")
    inputs = draw_inputs(task, seed)
    saved_inputs = clone_values(inputs)  # forward may work in place; the .pt keeps the originals
    report("forward")
    with torch.no_grad():
        dev_inputs = to_device(clone_values(inputs), dev)
        backends.synchronize(spec)
        start = time.perf_counter()
        raw = model(*dev_inputs)
        backends.synchronize(spec)
        elapsed = time.perf_counter() - start
    outputs = as_output_list(to_cpu(raw))
    input_shapes, input_dtypes = _shapes_dtypes(saved_inputs)
    output_shapes, output_dtypes = _shapes_dtypes(outputs)
    return {
        "op_name": task.ref.op,
        "seed": seed,
        "save_inputs": True,
        "inputs": saved_inputs,
        "input_shapes": input_shapes,
        "input_dtypes": input_dtypes,
        "outputs": outputs,
        "output_shapes": output_shapes,
        "output_dtypes": output_dtypes,
        "init_inputs": init_inputs,
        # extras
        "source": task.ref.source,
        "task_sha256": task.ref.sha256(),
        "shapes": task.shapes,
        "device": spec.label,
        "device_name": backends.device_name(spec),
        "torch_version": str(torch.__version__),  # TorchVersion is not weights_only-loadable
        "triton_version": _triton_version(),
        "farm_version": __version__,
        "reference_time_s": elapsed,
    }


def _triton_version() -> str | None:
    try:
        import triton

        return str(triton.__version__)
    except ImportError:
        return None


def reference_child(report: Callable[[str], None], ref: TaskRef, spec: DeviceSpec, seed: int, shapes: str,
                    out_path: str) -> dict[str, Any]:
    """In the pinned child: generate and save; only metadata travels back to the parent."""
    import torch

    backends.import_device_runtime(spec)
    report("import")
    task = corpus.load_task(ref, shapes)
    data = generate_reference(task, spec, seed, report)
    report("save")
    torch.save(data, out_path)
    load_pt(out_path)  # consumers load weights_only: a .pt they cannot read fails here, at "save"
    return {"device_name": data["device_name"], "reference_time_s": data["reference_time_s"],
            "task_sha256": data["task_sha256"]}


def load_pt(path: str | Path) -> dict[str, Any]:
    """Every .pt is untrusted: tensors and plain values only, never arbitrary objects."""
    import pickle

    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FarmError(f"{path}: not a loadable reference .pt (weights_only): {first}") from None
    missing = [k for k in PT_KEYS if k not in data] if isinstance(data, dict) else list(PT_KEYS)
    if missing:
        raise FarmError(f"{path}: reference .pt lacks key(s) {', '.join(missing)}")
    return data


def is_current(entry: dict | None, task_sha: str, seed: int, shapes: str, store: Store) -> bool:
    if not entry or not entry.get("success"):
        return False
    if (entry.get("task_sha256"), entry.get("seed"), entry.get("shapes")) != (task_sha, seed, shapes):
        return False
    info = store.head(entry["key"])
    return info is not None and info.sha256 in (None, entry.get("sha256"))


def _entry(ref: TaskRef, key: str, spec: DeviceSpec, seed: int, shapes: str, task_sha: str) -> dict[str, Any]:
    return {"op_name": ref.op, "source": ref.source, "key": key, "success": False, "sha256": None,
            "size_bytes": None, "elapsed_s": None, "error": None, "stage": None, "device": spec.label,
            "created_at": manifest.now(), "task_sha256": task_sha, "seed": seed, "shapes": shapes}


def generate_one(ref: TaskRef, store: Store, spec: DeviceSpec, seed: int, shapes: str, timeout_s: float,
                 staging: Path) -> dict[str, Any]:
    """One op in its own child; the .pt goes to the store only if the child succeeded."""
    key = manifest.ref_key(ref.source, ref.op)
    entry = _entry(ref, key, spec, seed, shapes, ref.sha256())
    tmp = staging / f"{ref.source}__{ref.op}.pt"
    outcome = run_in_child(reference_child, (ref, spec, seed, shapes, str(tmp)), timeout_s=timeout_s,
                           env=spec.child_env())
    entry["elapsed_s"] = round(outcome.elapsed_s, 3)
    if not outcome.ok:
        entry.update(stage=outcome.stage, error=_last_lines(outcome.error))
        tmp.unlink(missing_ok=True)
        return entry
    sha = sha256_file(tmp)
    info = store.put_file(key, tmp, sha256=sha)
    tmp.unlink(missing_ok=True)
    entry.update(success=True, stage="done", sha256=info.sha256, size_bytes=info.size,
                 device_name=outcome.value["device_name"], reference_time_s=outcome.value["reference_time_s"])
    return entry


def _last_lines(text: str, n: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-n:])


def generate_references(
    refs: list[TaskRef],
    store: Store,
    spec: DeviceSpec,
    seed: int,
    shapes: str,
    timeout_s: float,
    force: bool = False,
    on_done: Callable[[dict], None] | None = None,
) -> list[dict[str, Any]]:
    """Every op is tried; failures are recorded with their stage and the batch goes on."""
    known = manifest.entries(store)
    results = []
    with tempfile.TemporaryDirectory(prefix="farm-ref-") as staging:
        for ref in refs:
            previous = known.get(f"{ref.source}/{ref.op}")
            if not force and is_current(previous, ref.sha256(), seed, shapes, store):
                result = {**previous, "skipped": True}
            else:
                result = generate_one(ref, store, spec, seed, shapes, timeout_s, Path(staging))
                manifest.record(store, [result])
                log.info("reference %s/%s: %s", ref.source, ref.op, "ok" if result["success"] else result["error"])
            results.append(result)
            if on_done:
                on_done(result)
    return results
