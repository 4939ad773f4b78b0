"""`farm export`: promoted kernels as an installable Python package, with fallback, tests and docs.

    OUT/pyproject.toml                     pip install OUT
    OUT/<pkg>/__init__.py                  OPS, force_fallback, FallbackWarning, NoFallbackError
    OUT/<pkg>/_runtime.py                  the dispatch rule (farm/export/package_runtime.py, copied)
    OUT/<pkg>/<source>/<op>/__init__.py    <op>(*inputs) and the nn.Module class <Op>(*init_inputs)
    OUT/<pkg>/<source>/<op>/task.py        the task file as it is (Reference, Model, get_inputs)
    OUT/<pkg>/<source>/<op>/kernel_<target>.py   best.py of each target
    OUT/<pkg>/<source>/<op>/op.json        what each kernel was verified on, figures, tolerances
    OUT/tests/test_<source>__<op>.py       generated pytest tests; tests/data/<source>__<op>.pt
    OUT/docs/<source>/<op>.md              verification, timing, reproducing command, what never ran
    OUT/aot/<source>/<op>/                 CUDA kernels: Triton AOT C (farm/export/aot.py)
    OUT/export.json                        the index of the export

The dispatch rule is in farm/export/package_runtime.py; docs/export.md describes all of it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from farm.config import Settings
from farm.corpus import tasks as taskfiles
from farm.errors import FarmError
from farm.export import aot, envelope, naming
from farm.export.envelope import DEFAULT_CASES
from farm.export.fetch import module_name
from farm.export.package_envelope import describe
from farm.export.package_layers import recognise
from farm.export.package_text import CONFTEST, op_doc, op_init, op_tests, package_init, pyproject, readme
from farm.reference.manifest import now
from farm.runtime.tensors import own_generator
from farm.runtime.tolerance import DEFAULT_TOLERANCE, through_inputs
from farm.search.results import best_record, best_speedup, kernel_prefix, kernel_source, op_prefix
from farm.storage import Store, owned

HERE = Path(__file__).parent
# farm files copied into every package, and the name each gets there; their imports of one
# another are rewritten to relative ones (they import nothing else of the farm)
COPIED = {HERE / "package_runtime.py": "_runtime", HERE / "package_envelope.py": "_envelope",
          HERE / "package_library.py": "_library", HERE / "package_layers.py": "_layers",
          HERE / "package_checks.py": "_checks", HERE / "package_aot.py": "_aot",
          HERE.parent / "corpus" / "case_locals.py": "_locals"}
MAX_DATA_BYTES = 64 << 20  # a seed set bigger than this stays out of the package's tests


# ---------------------------------------------------------------- which kernels


def select(store: Store, run: str | None = None, target: str | None = None, source: str | None = None,
           op: str | None = None) -> list[dict[str, Any]]:
    """best.json of the promoted kernels to export: every one, or the ops a run searched."""
    metas = []
    for info in store.list("kernels/"):
        parts = info.key.split("/")
        if len(parts) != 5 or parts[4] != "best.json":
            continue
        if not all(want in (None, got) for want, got in zip((target, source, op), parts[1:4])):
            continue
        if run and not store.exists(f"{op_prefix(run, parts[2], parts[3])}/report.json"):
            continue
        metas.append(best_record(store, info.key))
    if run and not metas and not any(True for _ in store.list(f"runs/{run}/")):
        raise FarmError(f"no run {run!r} in {store.url} (--run)")
    return sorted(metas, key=lambda m: (m["source"], m["op"], m["target"]))


def latest(store: Store) -> str:
    """--latest: the run started last, local or distributed, as every command takes it."""
    from farm.search import catalog

    return catalog.latest(store)


# ---------------------------------------------------------------- the package


def copy_runtime(pkg: Path) -> None:
    for path, module in COPIED.items():
        text = path.read_text()
        for other, target in COPIED.items():
            dotted = ".".join(other.with_suffix("").parts[-3:])
            text = text.replace(f"from {dotted} import", f"from .{target} import")
        (pkg / f"{module}.py").write_text(text)


def export(store: Store, metas: list[dict], out: Path, settings: Settings, name: str, run: str | None = None,
           aot_mode: str = "auto", aot_arch: int | None = None, progress=None, cases: int = DEFAULT_CASES,
           force: bool = False) -> dict:
    """Write the package to `out`; returns the index (also OUT/export.json). The package is built
    in a staging folder and replaces only the farm's earlier export there (farm.storage.owned):
    files the user added stay; a folder of someone else's needs --force."""
    if not metas:
        raise FarmError(f"no promoted kernels in {store.url} with these filters (a kernel is promoted only where a "
                        "candidate passed)")
    if aot_mode not in ("auto", "on", "off"):
        raise FarmError(f"--aot {aot_mode!r}: use auto, on or off")
    with owned.writing(out, "--out", force) as stage:
        version = naming.next_version(store, name, out)
        index = _write(store, metas, stage, settings, name, run, version, (aot_mode, aot_arch), progress, cases)
    naming.record_version(store, name, version, run, [f"{e['source']}/{e['op']}" for e in index["ops"]])
    return index


def _write(store: Store, metas: list[dict], out: Path, settings: Settings, name: str, run: str | None,
           version: str, aot: tuple[str, int | None], progress, cases: int) -> dict:
    aot_mode, aot_arch = aot
    pkg = out / name
    pkg.mkdir(parents=True)
    copy_runtime(pkg)
    (out / "tests" / "data").mkdir(parents=True)
    groups: dict[tuple[str, str], list[dict]] = {}
    for meta in metas:
        groups.setdefault((meta["source"], meta["op"]), []).append(meta)
    from concurrent.futures import ThreadPoolExecutor

    done = []

    def one(item):
        (source, op), group = item
        entry = _export_op(store, settings, out, name, source, op, group, aot_mode, aot_arch, cases)
        done.append(entry)
        if progress:
            progress(len(done) - 1, len(groups), f"{source}/{op}")
        return entry

    # Ops are independent and their slow parts (recording launches, Triton's AOT compiler) are
    # child processes, so they overlap.
    with ThreadPoolExecutor(max_workers=max(1, min(len(groups), os.cpu_count() or 1, 4))) as pool:
        entries = list(pool.map(one, sorted(groups.items())))
    for src in sorted({s for s, _ in groups}):
        (pkg / module_name(src) / "__init__.py").write_text(f'"""Kernels of source {src}."""\n')
    index = {"exported_at": now(), "store": store.url, "run": run, "package": name, "version": version,
             "ops": entries}
    (pkg / "__init__.py").write_text(package_init(name, entries, version))
    (out / "pyproject.toml").write_text(pyproject(name, run, version, entries))
    (out / "README.md").write_text(readme(index))
    (out / "tests" / "conftest.py").write_text(CONFTEST)
    (out / "export.json").write_text(json.dumps(index, indent=2, default=str) + "\n")
    return index


def _export_op(store: Store, settings: Settings, out: Path, pkg: str, source: str, op: str, metas: list[dict],
               aot_mode: str, aot_arch: int | None, cases: int) -> dict[str, Any]:
    import torch

    ref = _task_ref(settings, source, op)
    pt_key = f"refs/{source}/{op}.pt"
    if not store.exists(pt_key):
        raise FarmError(f"{source}/{op}: no reference data {pt_key} in {store.url}; the tests need its seed set")
    pt_bytes = store.get_bytes(pt_key)
    pt_sha = hashlib.sha256(pt_bytes).hexdigest()
    data = torch.load(io.BytesIO(pt_bytes), weights_only=True)
    info = task_info(ref, data)
    op_mod = module_name(op)
    folder = out / pkg / module_name(source) / op_mod
    folder.mkdir(parents=True)
    shutil.copyfile(ref.path, folder / "task.py")
    torch.save({"init_inputs": list(data.get("init_inputs", []))}, folder / "init.pt")
    data_name = f"{module_name(source)}__{op_mod}.pt"
    data_file = out / "tests" / "data" / data_name
    if len(pt_bytes) <= MAX_DATA_BYTES:
        data_file.write_bytes(pt_bytes)
    kernels = {}
    for meta in metas:
        target = meta["target"]
        best = kernel_source(store, kernel_prefix(target, source, op))
        (folder / f"kernel_{target}.py").write_bytes(best)
        report = _report(store, meta)
        device = _device_of(target)
        figure = best_speedup(meta) or {}  # the op's best speedup with its timing mode, as every surface shows it
        kernels[target] = {
            "module": f"kernel_{target}", **device, "verified_inputs": [describe(v) for v in data["inputs"]],
            "envelope": {**envelope.check(ref, data, folder / f"kernel_{target}.py", device, cases),
                         "slower": slower_rule(meta, device)},
            "ref_sha256": pt_sha, "ref_matches": (meta.get("verified") or {}).get("ref_sha256") in (None, pt_sha),
            "config": report.get("config", {}), "command": reproduce_command(meta, report),
            **{k: meta.get(k) for k in ("run", "candidate", "generator", "device_name", "time_ms",
                                        "speedup_vs_reference", "timing", "verified", "baseline", "provenance",
                                        "provenance_check")},
            "speedup_vs_model": figure.get("speedup_vs_model"), "timing_mode": figure.get("timing_mode"),
            "retimed": figure.get("retimed"),
        }
        if _aot_c(target) and aot_mode != "off":
            kernels[target]["aot"] = _export_aot(out, source, op, best, data_file, pt_bytes, aot_mode, aot_arch)
    text = ref.path.read_text(errors="replace")
    doc = {"source": source, "op": op, "package_env": f"{pkg.upper()}_FORCE_FALLBACK",
           "shapes": data.get("shapes"), "seed": data.get("seed"), "ref_device": data.get("device_name"),
           "task_sha256": hashlib.sha256(ref.path.read_bytes()).hexdigest(), **info,
           "inputs": [describe(v) for v in data["inputs"]], "mutated_inputs": list(data.get("mutated_inputs") or []),
           "library_name": f"{module_name(source)}__{op_mod}".lstrip("_") or "op",
           "kernels": kernels, "data_file": data_name if data_file.exists() else None,
           "doc": (text.split('"""')[1].strip().splitlines() or [""])[0] if text.lstrip().startswith('"""') else ""}
    (folder / "op.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    fn = op_mod if not op_mod.startswith("_") else op_mod.lstrip("_") or op_mod
    cls = "".join(p.capitalize() for p in op_mod.split("_") if p) or "Op"
    if cls[0].isdigit():
        cls = "Op" + cls
    (folder / "__init__.py").write_text(op_init(pkg, source, op, fn, cls, doc))
    (out / "tests" / f"test_{module_name(source)}__{op_mod}.py").write_text(op_tests(pkg, source, op, doc, cls))
    docs = out / "docs" / source
    docs.mkdir(parents=True, exist_ok=True)
    (docs / f"{op}.md").write_text(op_doc(pkg, source, op, fn, cls, doc))
    return {"source": source, "op": op, "module": f"{pkg}.{module_name(source)}.{op_mod}", "function": fn,
            "class": cls, "targets": sorted(kernels), "truth": info["truth"], "layers": info["layers"],
            "backward": info["backward"],
            "interpret": any(k["interpret"] for k in kernels.values()),
            "envelope": {t: k["envelope"]["status"] for t, k in kernels.items()},
            "aot": {t: k["aot"]["status"] for t, k in kernels.items() if "aot" in k},
            "speedup_vs_model": {t: k["speedup_vs_model"] for t, k in kernels.items()},
            "timing_mode": {t: k["timing_mode"] for t, k in kernels.items()},
            "retimed": {t: k["retimed"] for t, k in kernels.items()}}


def slower_rule(meta: dict, device: dict) -> list[dict]:
    """The sizes where the kernel was timed slower than the original, which dispatch sends to the
    original. None on an interpreted target: its figures are the interpreter's host clock, which
    only ranks candidates (a CPU kernel timed 0.92x there went to PyTorch at its own bench size)."""
    if device.get("interpret"):
        return []
    return [{k: r.get(k) for k in ("label", "shape", "speedup")} for r in meta.get("slower_cases") or []]


def _aot_c(target: str) -> bool:
    """Whether Triton's AOT compiler makes C for the target's kernels (Target.aot_c: cuda)."""
    from farm.targets import get_target

    return get_target(target).aot_c


def _device_of(target: str) -> dict:
    """The torch device type of a target's tensors, and whether its Triton runs in the interpreter."""
    from farm.targets import get_target

    t = get_target(target)
    return {"device_type": t.torch_device, "interpret": bool(t.interpret)}


def _task_ref(settings: Settings, source: str, op: str) -> taskfiles.TaskRef:
    try:
        [ref] = taskfiles.find_tasks(settings, [source], [op])
    except FarmError as exc:
        raise FarmError(f"{source}/{op}: the task file is needed to export the op ({exc})") from None
    return ref


def task_info(ref: taskfiles.TaskRef, data: dict) -> dict:
    """What op.json needs from the task at the reference data's shape set: which class is the
    fallback, tolerances, backward, the shape set's constants, the space, how the outputs are
    structured, and which catalogue layers the op behaves as (package_layers.recognise)."""
    task = taskfiles.load_task(ref, data.get("shapes") or "bench", reference=data.get("reference_class"))
    truth_cls = task.reference_cls or (task.model_cls if task.mode == "model" else None)
    widened = through_inputs({**DEFAULT_TOLERANCE, **task.tolerance}, data.get("input_dtypes"), task.tolerance)
    tolerance = {k: list(v) for k, v in widened.items()}
    try:
        space = task.space.as_dict()
    except FarmError as exc:
        space = {"dims": [], "origin": "none", "note": str(exc)}
    layers = recognise(list(data["inputs"]), list(data.get("init_inputs") or []), list(data["outputs"]),
                       {k: tuple(v) for k, v in tolerance.items()})
    return {"truth": truth_cls.__name__ if truth_cls is not None else None, "tolerance": tolerance,
            "backward": task.backward, "space": space, "layers": layers,
            "shape_overrides": {k: list(v) if isinstance(v, tuple) else v for k, v in task.shape_overrides.items()},
            "outputs": _output_structure(truth_cls, data)}


def _output_structure(truth_cls: type | None, data: dict) -> dict | None:
    """Whether the truth returns one tensor or a sequence of tensors (the custom op's schema):
    one forward on the meta device, nothing allocated."""
    import torch

    if truth_cls is None:
        return None
    try:
        with own_generator(0), torch.no_grad():
            model = truth_cls(*data.get("init_inputs", [])).to("meta")
            raw = model(*[v.to("meta") if isinstance(v, torch.Tensor) else v for v in data["inputs"]])
    except Exception:  # noqa: BLE001 - the truth cannot run on meta: no custom op for it
        return None
    values = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    return {"single": not isinstance(raw, (list, tuple)), "tensors": all(isinstance(v, torch.Tensor) for v in values)}


def _report(store: Store, meta: dict) -> dict:
    key = f"{op_prefix(meta['run'], meta['source'], meta['op'])}/report.json"
    return store.read_json(key) if meta.get("run") and store.exists(key) else {}


def reproduce_command(meta: dict, report: dict) -> str:
    cfg = report.get("config") or {}
    parts = ["farm search", f"--source {meta['source']}", f"--op {meta['op']}", f"--target {meta['target']}",
             f"--run {meta['run']}"]
    if cfg.get("max_tasks"):
        parts.append(f"--max-tasks {cfg['max_tasks']}")
    if cfg.get("generators"):
        parts.append(f"--generators {','.join(cfg['generators'])}")
    if cfg.get("flush"):
        parts.append(f"--flush {cfg['flush']}")
    if cfg.get("seed") is not None:
        parts.append(f"--seed {cfg['seed']}")
    return " ".join(parts)


# ---------------------------------------------------------------- AOT


def _export_aot(out: Path, source: str, op: str, best: bytes, data_file: Path, pt_bytes: bytes, mode: str,
                arch: int | None) -> dict:
    """Record the launches, write the plan and scripts, and generate the C where possible."""
    folder = out / "aot" / source / op
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.py").write_bytes(best)
    cuda = _cuda_available()
    if not cuda and arch is None:
        if mode == "on":
            raise FarmError(f"{source}/{op}: --aot on needs a CUDA GPU here, or --aot-arch to record the launches in "
                            "Triton's interpreter and generate for that architecture")
        return {"status": "skipped", "reason": "no CUDA GPU here and no --aot-arch: rerun farm export on a CUDA machine"}
    try:
        recorded = record_launches(folder / "kernel.py", pt_bytes, "cuda" if cuda else "cpu")
        op_c = aot.c_name(op)
        doc = aot.plan(op_c, recorded)
        doc["data_file"] = os.path.relpath(data_file, folder)
        aot.write(folder, best, doc, op_c)
        aot.generate(folder, doc, arch=None if cuda else arch)
    except FarmError as exc:
        if mode == "on":
            raise
        return {"status": "failed", "reason": str(exc)}
    return {"status": "generated", "arch": arch, "recorded_on": "cuda" if cuda else "cpu (Triton interpreter)",
            "testable": doc["testable"], "not_testable": doc["not_testable"],
            "kernels": [{"kernel": k["kernel"], "out_name": k["out_name"],
                         "variants": [v["signature"] for v in k["variants"]]} for k in doc["kernels"]]}


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def record_launches(kernel_file: Path, pt_bytes: bytes, device: str, timeout_s: float = 600) -> dict:
    """farm.export.launches in a child process (the kernel is untrusted code; a fault costs the child)."""
    with tempfile.TemporaryDirectory(prefix="kfarm-launch-") as tmp:
        pt = Path(tmp) / "case.pt"
        pt.write_bytes(pt_bytes)
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"kernel_file": str(kernel_file), "pt_file": str(pt), "device": device}))
        result = Path(tmp) / "launches.json"
        env = dict(os.environ)
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        try:
            proc = subprocess.run([sys.executable, "-m", "farm.export.launches", str(spec), str(result)], env=env,
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise FarmError(f"{kernel_file}: recording its launches took over {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise FarmError(f"{kernel_file}: recording its launches failed: {tail}")
        doc = json.loads(result.read_text())
    doc["kernel_file"] = str(kernel_file)
    for launch in doc["launches"]:
        if Path(launch["file"]).name == Path(kernel_file).name and Path(launch["file"]).parent.name == "":
            launch["file"] = str(kernel_file)
    return doc
