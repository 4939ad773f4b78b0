"""Step one of the flow: run each task's original Model on the reference platform and keep its
inputs and outputs as a .pt, so the target never needs the CUDA code.

`generate_reference` is the library function (one task, current process, device already
pinned); `reference_child` wraps it for a child process; `generate_references` runs a batch,
one child per op, stores the .pt files and merges the manifest.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, TypeGuard

from farm import __version__, targets
from farm.corpus import modes
from farm.corpus import tasks as taskfiles
from farm.corpus.inputs import draw_init_inputs
from farm.corpus.tasks import TaskRef
from farm.errors import FarmError, StorageError
from farm.reference import cases as ref_cases
from farm.reference import drawn, manifest, secret_inputs
from farm.reference.ptfile import load_pt_file
from farm.runtime import children, grads, pointers
from farm.runtime.children import run_in_child
from farm.runtime.tensors import clone_values, describe_values, seed_all, to_cpu, to_device
from farm.runtime.tolerance import as_output_list
from farm.storage import Store
from farm.storage.base import sha256_file
from farm.targets import DeviceSpec

log = logging.getLogger(__name__)

PT_KEYS = ("op_name", "seed", "save_inputs", "inputs", "input_shapes", "input_dtypes",
           "outputs", "output_shapes", "output_dtypes", "init_inputs")


def _shapes_dtypes(values: list) -> tuple[list, list]:
    import torch

    shapes, dtypes = describe_values(values)
    return [torch.Size(s) if s is not None else None for s in shapes], dtypes


def _run(model, inputs: list, sums: list[str], spec: DeviceSpec, check=lambda raw: raw) -> tuple[list, float, list[int]]:
    """One forward on the inputs where they are (moved to the device if drawn on the host, no
    copy kept): the outputs, left where forward put them, after `check` (a Model that returns
    what no .pt can hold is refused there), and which inputs forward changed, by their digest
    against `sums` (the recipe's)."""
    import torch

    with torch.no_grad():
        dev_inputs = to_device(inputs, spec.torch_device)
        targets.synchronize(spec)
        start = time.perf_counter()
        raw = model(*dev_inputs)
        targets.synchronize(spec)
        elapsed = time.perf_counter() - start
    # addresses held as values are compared as the tokens the recipe digested
    after = drawn.digests(pointers.encode(dev_inputs))
    mutated = [i for i, (a, b) in enumerate(zip(after, sums)) if isinstance(inputs[i], torch.Tensor) and a != b]
    return as_output_list(check(raw)), elapsed, mutated


def record_set(task: taskfiles.Task, model, spec: DeviceSpec, seed: int, check=lambda raw: raw,
               ship_max_mb: float = -1, report: Callable[[str], None] = lambda stage: None) -> dict[str, Any]:
    """One input set at the task's current shapes: drawn (on the device where the task allows
    it), run, and kept in the form farm.reference.drawn decides: in full, or compact (inputs as
    the recipe, outputs as digests and samples). Host memory holds at most one copy of each."""
    report("get_inputs")
    inputs, rec = drawn.draw(task, seed, spec)
    report("forward")
    outputs, elapsed, mutated = _run(model, inputs, rec["digests"], spec, check)
    entry: dict[str, Any] = {"input_recipe": rec, "elapsed_s": elapsed, "mutated": mutated}
    reason = drawn.compact_reason(task, drawn.value_bytes(inputs), drawn.value_bytes(outputs), ship_max_mb)
    if reason:
        entry.update(compact=reason, output_samples=drawn.samples(outputs), outputs=[],
                     shapes_dtypes=(_shapes_dtypes(inputs), _shapes_dtypes(outputs)))
        return entry
    if mutated:  # forward worked in place on the drawn tensors: the recipe draws the originals again
        inputs, again = drawn.draw(task, seed, spec)
        if again["digests"] != rec["digests"]:
            raise FarmError(f"{task.ref.path}: get_inputs() drew other values the second time for seed {seed}")
    entry.update(inputs=_on_host(inputs), outputs=to_cpu(outputs))
    entry["shapes_dtypes"] = (_shapes_dtypes(entry["inputs"]), _shapes_dtypes(entry["outputs"]))
    return entry


def _on_host(values: list) -> list:
    """Drawn inputs on the host as the .pt keeps them: address tokens stay tokens, and the
    tensors they name (farm.runtime.pointers) go with them."""
    import torch

    return [pointers.moved(v, "cpu") if isinstance(v, torch.Tensor) else v for v in values]


def generate_reference(task: taskfiles.Task, spec: DeviceSpec, seed: int,
                       report: Callable[[str], None] = lambda stage: None) -> dict[str, Any]:
    """The .pt dict for one task: seed, Model(*get_init_inputs()), get_inputs(), forward."""
    return generate_reference_and_sets(task, spec, seed, report)[0]


def generate_reference_and_sets(task: taskfiles.Task, spec: DeviceSpec, seed: int,
                                report: Callable[[str], None] = lambda stage: None,
                                seed_sets: int = 0, cases: int = 0,
                                ship_max_mb: float = -1) -> tuple[dict[str, Any], dict | None, dict | None]:
    """The .pt dict for one task: seed, Model(*get_init_inputs()), get_inputs(), forward;
    in reference-data mode (`seed_sets` > 0), the secret input sets (farm.reference.secret_inputs);
    and the Model at `cases` cases of the task's shape space (farm.reference.cases). Sets over
    `ship_max_mb` are kept compact where farm.reference.drawn allows it (-1: never)."""
    import torch

    dev = spec.torch_device
    report("size_check")  # the memory guards run Model's forward on the meta device
    task.guard()
    if drawn.on_device(dev):
        drawn.guard_device(task, spec)
    report("init")
    init_inputs = draw_init_inputs(task, seed)
    seed_all(seed)
    model = task.model_cls(*init_inputs).to(dev).eval()
    checked = lambda raw: taskfiles.check_outputs(task, task.model_cls, raw)  # noqa: E731
    main = record_set(task, model, spec, seed, checked, ship_max_mb, report)
    extras = backward_record(task, model, main["inputs"], seed, dev, report) if task.backward else {}
    case_doc = ref_cases.record(task, lambda s: record_set(task, model, spec, s, checked, ship_max_mb), dev, cases,
                                seed, report, model) if cases else None
    secret = None
    if seed_sets:
        report("seed_sets")
        sets = []
        for s in secret_inputs.draw_seeds(seed_sets, seed):
            one = record_set(task, model, spec, s, checked)  # the only truth there is: kept in full
            sets.append({"seed": s, "case": _bench_case(task, s), "inputs": one["inputs"], "outputs": one["outputs"]})
        secret = {"op_name": task.ref.op, "source": task.ref.source, "pt_seed": seed,
                  "task_sha256": task.ref.sha256(), "sets": sets}
    (input_shapes, input_dtypes), (output_shapes, output_dtypes) = main["shapes_dtypes"]
    data = {
        "op_name": task.ref.op,
        "seed": seed,
        "save_inputs": "inputs" in main,  # AKG's flag: False where the inputs are the recipe alone
        **({"inputs": main["inputs"]} if "inputs" in main else {}),
        "input_shapes": input_shapes,
        "input_dtypes": input_dtypes,
        "outputs": main["outputs"],
        "output_shapes": output_shapes,
        "output_dtypes": output_dtypes,
        "init_inputs": init_inputs,
        # extras
        "input_recipe": main["input_recipe"],
        "source": task.ref.source,
        "task_sha256": task.ref.sha256(),
        "shapes": task.shapes,
        "mode": task.mode,
        "reference_class": task.reference_cls.__name__ if task.reference_cls is not None else None,
        "device": spec.label,
        "device_name": targets.device_name(spec),
        "torch_version": str(torch.__version__),  # TorchVersion is not weights_only-loadable
        "triton_version": _triton_version(),
        "farm_version": __version__,
        "reference_time_s": main["elapsed_s"],
        # inputs the original Model changes in place: a candidate may (and is timed as if) too
        "mutated_inputs": main["mutated"],
        **extras,
    }
    if "compact" in main:
        data.update(compact=main["compact"], output_samples=main["output_samples"], ship_max_mb=ship_max_mb)
    return data, secret, case_doc


def _bench_case(task: taskfiles.Task, seed: int) -> dict | None:
    """A secret set's case (the benchmark shapes, its own seed), so a verifier iterates every set alike."""
    from farm.corpus.cases import bench_case

    try:
        return bench_case(task.space, seed).as_dict()
    except FarmError:
        return None


def backward_record(task: taskfiles.Task, model, inputs: list, seed: int, device: str,
                    report: Callable[[str], None]) -> dict[str, Any]:
    """The extra .pt keys of a training op: the upstream gradient and the gradients it gives."""
    report("backward")
    indices = grads.grad_indices(task.grad_inputs, inputs)
    _, upstream, grad_inputs, grad_params = grads.forward_backward(
        model.train(False), to_device(clone_values(inputs), device), indices, None, seed, device)
    return {"grad_input_indices": indices, "grad_outputs": upstream, "grad_inputs": grad_inputs,
            "grad_params": grad_params}


def _triton_version() -> str | None:
    try:
        import triton

        return str(triton.__version__)
    except ImportError:
        return None


def reference_child(report: Callable[[str], None], ref: TaskRef, spec: DeviceSpec, seed: int, shapes: str,
                    out_path: str, reference: str | None = None, seed_sets: int = 0, cases: int = 0,
                    ship_max_mb: float = -1, jobs: int = 1) -> dict[str, Any]:
    """In the pinned child: generate and save; only metadata travels back to the parent. The
    secret input sets and the cases go to files of their own (out_path + ".sets", + ".cases"),
    and the .pt records their sha256, so whoever holds the .pt can find and check them."""
    import torch

    targets.import_device_runtime(spec)
    report("import")
    task = taskfiles.load_task(ref, shapes, reference=reference)
    # the largest case fits this job's share of the device, not half the host's memory (250 GB
    # on a 4-GPU host): four jobs on one H100 sat waiting for device memory the others held
    task.device_budget_bytes = drawn.job_share(spec, jobs)
    data, secret, case_doc = generate_reference_and_sets(task, spec, seed, report,
                                                         seed_sets if task.mode == "reference-data" else 0, cases,
                                                         ship_max_mb)
    report("save")
    if case_doc is not None:
        cases_path = out_path + ref_cases.SUFFIX
        torch.save(case_doc, cases_path)
        load_pt_file(cases_path)
        data[ref_cases.POINTER] = {"key": ref_cases.cases_key(ref.source, ref.op), "sha256": sha256_file(cases_path),
                                   "count": len(case_doc["cases"])}
    if secret is not None:
        sets_path = out_path + ".sets"
        torch.save(secret, sets_path)
        load_pt_file(sets_path)
        data[secret_inputs.POINTER] = {"key": secret_inputs.secret_key(ref.source, ref.op),
                                       "sha256": sha256_file(sets_path), "count": len(secret["sets"])}
    torch.save(data, out_path)
    load_pt(out_path)  # consumers load weights_only: a .pt they cannot read fails here, at "save"
    return {"device_name": data["device_name"], "reference_time_s": data["reference_time_s"],
            "task_sha256": data["task_sha256"], "mode": data["mode"], "reference_class": data["reference_class"],
            "seed_sets": data.get(secret_inputs.POINTER), "cases": data.get(ref_cases.POINTER),
            "inputs_drawn_on": data["input_recipe"]["draw"], "compact": data.get("compact")}


def load_pt(path: str | Path) -> dict[str, Any]:
    """Every .pt is untrusted: tensors and plain values only, never arbitrary objects. A
    compact one (farm.reference.drawn) has no "inputs" but the recipe that draws them."""
    data = load_pt_file(path)
    needed: tuple[str, ...] = PT_KEYS
    if isinstance(data, dict) and data.get("save_inputs") is False:
        needed = tuple(k for k in PT_KEYS if k != "inputs") + ("input_recipe", "output_samples")
    missing = [k for k in needed if k not in data] if isinstance(data, dict) else list(PT_KEYS)
    if missing:
        raise FarmError(f"{path}: reference .pt lacks key(s) {', '.join(missing)}")
    return data


def is_current(entry: dict | None, task_sha: str, seed: int, shapes: str, store: Store, cases: int = 0,
               ship_max_mb: float = -1) -> TypeGuard[dict]:
    if not entry or not entry.get("success"):
        return False
    if entry.get("compact") and (ship_max_mb < 0 or ship_max_mb > entry.get("ship_max_mb", ship_max_mb)):
        return False  # made compact under a lower reference.ship_max_mb: made again in full
    if (entry.get("task_sha256"), entry.get("seed"), entry.get("shapes")) != (task_sha, seed, shapes):
        return False
    if entry.get("seed_sets_key") and store.head(entry["seed_sets_key"]) is None:
        return False  # the .pt alone cannot verify a reference-data task
    if entry.get("cases_key") and store.head(entry["cases_key"]) is None:
        return False  # its cases went missing: made again with it
    if cases and "cases" not in entry:
        return False  # made before reference data had cases
    # The bytes themselves, not just their record: a damaged object must be made again, not
    # reported "current" and then fail every search that reads it.
    try:
        sha = store.verify(entry["key"])
    except StorageError as exc:
        if store.head(entry["key"]) is not None:
            log.warning("stored %s is unreadable, so it is made again: %s", entry["key"], exc)
        return False
    return entry.get("sha256") in (None, sha)


def _entry(ref: TaskRef, key: str, spec: DeviceSpec, seed: int, shapes: str, task_sha: str) -> dict[str, Any]:
    return {"op_name": ref.op, "source": ref.source, "key": key, "success": False, "sha256": None,
            "size_bytes": None, "elapsed_s": None, "error": None, "stage": None, "device": spec.label,
            "created_at": manifest.now(), "task_sha256": task_sha, "seed": seed, "shapes": shapes}


def generate_one(ref: TaskRef, store: Store, spec: DeviceSpec, seed: int, shapes: str, timeout_s: float,
                 staging: Path, seed_sets: int = 4, cases: int = 0, ship_max_mb: float = -1,
                 jobs: int = 1) -> dict[str, Any]:
    """One op in its own child; the .pt goes to the store only if the child succeeded. The
    task's truth is decided here first (farm.corpus.modes: its trial runs in a child of its
    own), and the child records secret input sets if it is in reference-data mode."""
    key = manifest.ref_key(ref.source, ref.op)
    entry = _entry(ref, key, spec, seed, shapes, ref.sha256())
    decided = modes.resolve_ref(ref, shapes, min(timeout_s, modes.TRIAL_TIMEOUT_S))
    if not isinstance(decided, modes.Mode):  # the file cannot be loaded: the child's stage and error
        entry.update(stage=decided.stage, error=_last_lines(decided.error), elapsed_s=round(decided.elapsed_s, 3))
        if decided.status == "interrupted":
            entry.update(stage="interrupted", interrupted=True)
        return entry
    entry.update(mode=decided.mode, reference_class=decided.reference)
    tmp = staging / f"{ref.source}__{ref.op}.pt"
    sets_tmp = Path(str(tmp) + ".sets")
    cases_tmp = Path(str(tmp) + ref_cases.SUFFIX)
    outcome = run_in_child(reference_child, (ref, spec, seed, shapes, str(tmp), decided.reference, seed_sets, cases,
                                             ship_max_mb, jobs),
                           timeout_s=timeout_s, env=spec.child_env())
    entry["elapsed_s"] = round(outcome.elapsed_s, 3)
    try:
        if outcome.status == "interrupted":
            entry.update(stage="interrupted", error=outcome.error, interrupted=True)
            return entry
        if not outcome.ok:
            entry.update(stage=outcome.stage, error=_last_lines(outcome.error))
            return entry
        pointer = outcome.value.get("seed_sets")
        if pointer:  # secrets first: a .pt is never published without the sets it points at
            info = store.put_file(pointer["key"], sets_tmp, sha256=pointer["sha256"])
            entry.update(seed_sets=pointer["count"], seed_sets_key=pointer["key"], seed_sets_bytes=info.size,
                         seed_sets_sha256=info.sha256)
        pointer = outcome.value.get("cases")
        if pointer:  # beside the .pt, wherever it goes (a plain folder included)
            store.put_file(pointer["key"], cases_tmp, sha256=pointer["sha256"])
            entry.update(cases=pointer["count"], cases_key=pointer["key"], cases_sha256=pointer["sha256"])
        else:
            entry["cases"] = 0
        sha = sha256_file(tmp)
        info = store.put_file(key, tmp, sha256=sha)
        entry.update(success=True, stage="done", sha256=info.sha256, size_bytes=info.size,
                     device_name=outcome.value["device_name"], reference_time_s=outcome.value["reference_time_s"],
                     inputs_drawn_on=outcome.value["inputs_drawn_on"], compact=outcome.value["compact"],
                     ship_max_mb=ship_max_mb)
        return entry
    finally:
        tmp.unlink(missing_ok=True)
        sets_tmp.unlink(missing_ok=True)
        cases_tmp.unlink(missing_ok=True)


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
    seed_sets: int = 4,
    jobs: int = 1,
    cases: int = 0,
    ship_max_mb: float = -1,
) -> list[dict[str, Any]]:
    """Every op is tried; failures are recorded with their stage and the batch goes on.
    The secret input sets go where the .pt goes: a store's secrets/, a folder's .secrets/.
    `jobs` ops run at once, each in its own child on the same device: a reference run is
    mostly interpreter start, imports and input drawing on the host, not device time, and
    nothing in it is timed against another op (reference_time_s is informative only)."""
    known = manifest.entries(store)
    record_lock = threading.Lock()  # the file store's lock is per process, not per thread

    def one(ref: TaskRef, staging: Path) -> dict[str, Any]:
        previous = known.get(f"{ref.source}/{ref.op}")
        if not force and is_current(previous, ref.sha256(), seed, shapes, store, cases, ship_max_mb):
            return {**previous, "skipped": True}
        result = generate_one(ref, store, spec, seed, shapes, timeout_s, staging, seed_sets, cases, ship_max_mb, jobs)
        if result.get("interrupted") and (previous or {}).get("success"):
            return result  # stopped while remaking it: the stored .pt and its entry stay as they were
        with record_lock:  # interrupted: recorded as such, never as the op's failure; made on the next run
            manifest.record(store, [result])
        log.info("reference %s/%s: %s", ref.source, ref.op, "ok" if result["success"] else result["error"])
        return result

    with tempfile.TemporaryDirectory(prefix="farm-ref-") as staging:
        pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="reference")
        futures = [pool.submit(one, ref, Path(staging)) for ref in refs]
        try:
            for future in as_completed(futures):
                if on_done:
                    on_done(future.result())
        except BaseException:  # Ctrl-C, SIGTERM: no op starts, the ones in flight end now
            _stop(pool)
            raise
        pool.shutdown()
        return [f.result() for f in futures]  # in the order asked for, whatever order they finished in


def _stop(pool: ThreadPoolExecutor) -> None:
    """The ops not started are dropped and the children in flight ended (their ops recorded as
    interrupted); children are allowed again after, unless a signal handler stopped them for good."""
    already = children.stopping()
    children.stop_children()
    pool.shutdown(wait=True, cancel_futures=True)
    if not already:
        children.allow_children()


def reference_cases(setting: int, spec: DeviceSpec) -> int:
    """reference.cases, where -1 means: 6 on a device, 2 where Triton interprets (each case of a
    Triton Model costs the interpreter a second or more on the CPU)."""
    if setting >= 0:
        return setting
    return 2 if spec.target.interpret else 6


def reference_jobs(setting: int, spec: DeviceSpec) -> int:
    """reference.jobs, where 0 means: one on an interpreting target (its ops fill the host's
    cores themselves), else a quarter of the host's cores, at most 4."""
    if setting > 0:
        return setting
    if spec.target.interpret:
        return 1
    return max(1, min(4, (os.cpu_count() or 1) // 4))
