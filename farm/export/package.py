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
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from farm.config import Settings
from farm.corpus import tasks as corpus
from farm.errors import FarmError
from farm.export import aot
from farm.export.fetch import module_name
from farm.export.package_text import CONFTEST, RUNTIME_FILE, op_doc, op_init, op_tests, package_init, pyproject, readme
from farm.reference.manifest import now
from farm.runtime.compare import DEFAULT_TOLERANCE
from farm.search.results import kernel_prefix, op_prefix
from farm.storage import Store

AOT_RUNTIME_FILE = Path(__file__).with_name("package_aot.py")
PKG_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
MAX_DATA_BYTES = 64 << 20  # a seed set bigger than this stays out of the package's tests


def package_name(name: str | None, run: str | None) -> str:
    if name is None:
        name = "kfarm_" + re.sub(r"\W", "_", run.lower()) if run else "kfarm_kernels"
    if not PKG_NAME.match(name):
        raise FarmError(f"--name {name!r}: a package name is lower-case letters, digits and '_', not starting with a digit")
    return name


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
        metas.append(store.read_json(info.key))
    if run and not metas and not any(True for _ in store.list(f"runs/{run}/")):
        raise FarmError(f"no run {run!r} in {store.url} (--run)")
    return sorted(metas, key=lambda m: (m["source"], m["op"], m["target"]))


def latest(store: Store) -> str:
    """--latest: the run started last, local or distributed, as every command takes it."""
    from farm.search import catalog

    return catalog.latest(store)


# ---------------------------------------------------------------- the package


def export(store: Store, metas: list[dict], out: Path, settings: Settings, name: str, run: str | None = None,
           aot_mode: str = "auto", aot_arch: int | None = None, progress=None) -> dict[str, Any]:
    """Write the package to `out`; returns the index (also OUT/export.json)."""
    if not metas:
        raise FarmError(f"no promoted kernels in {store.url} with these filters (a kernel is promoted only where a "
                        "candidate passed)")
    if aot_mode not in ("auto", "on", "off"):
        raise FarmError(f"--aot {aot_mode!r}: use auto, on or off")
    if out.exists() and any(out.iterdir()) and not (out / "export.json").exists():
        raise FarmError(f"--out {out}: folder exists and is not an earlier export; choose an empty folder")
    if out.exists():
        shutil.rmtree(out)
    pkg = out / name
    pkg.mkdir(parents=True)
    shutil.copyfile(RUNTIME_FILE, pkg / "_runtime.py")
    shutil.copyfile(AOT_RUNTIME_FILE, pkg / "_aot.py")
    (out / "tests" / "data").mkdir(parents=True)
    groups: dict[tuple[str, str], list[dict]] = {}
    for meta in metas:
        groups.setdefault((meta["source"], meta["op"]), []).append(meta)
    from concurrent.futures import ThreadPoolExecutor

    done = []

    def one(item):
        (source, op), group = item
        entry = _export_op(store, settings, out, name, source, op, group, aot_mode, aot_arch)
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
    index = {"exported_at": now(), "store": store.url, "run": run, "package": name, "ops": entries}
    (pkg / "__init__.py").write_text(package_init(name, entries))
    (out / "pyproject.toml").write_text(pyproject(name, run))
    (out / "README.md").write_text(readme(index))
    (out / "tests" / "conftest.py").write_text(CONFTEST)
    (out / "export.json").write_text(json.dumps(index, indent=2, default=str) + "\n")
    return index


def _export_op(store: Store, settings: Settings, out: Path, pkg: str, source: str, op: str, metas: list[dict],
               aot_mode: str, aot_arch: int | None) -> dict[str, Any]:
    import torch

    from farm.export.package_runtime import describe

    ref = _task_ref(settings, source, op)
    truth, tolerance = _truth_and_tolerance(ref)
    pt_key = f"refs/{source}/{op}.pt"
    if not store.exists(pt_key):
        raise FarmError(f"{source}/{op}: no reference data {pt_key} in {store.url}; the tests need its seed set")
    pt_bytes = store.get_bytes(pt_key)
    pt_sha = hashlib.sha256(pt_bytes).hexdigest()
    data = torch.load(io.BytesIO(pt_bytes), weights_only=True)
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
        best = store.get_bytes(f"{kernel_prefix(target, source, op)}/best.py")
        (folder / f"kernel_{target}.py").write_bytes(best)
        report = _report(store, meta)
        kernels[target] = {
            "module": f"kernel_{target}", **_device_of(target), "verified_inputs": [describe(v) for v in data["inputs"]],
            "ref_sha256": pt_sha, "ref_matches": (meta.get("verified") or {}).get("ref_sha256") in (None, pt_sha),
            "config": report.get("config", {}), "command": reproduce_command(meta, report),
            **{k: meta.get(k) for k in ("run", "candidate", "generator", "device_name", "time_ms", "speedup_vs_model",
                                        "speedup_vs_reference", "timing", "verified", "baseline")},
        }
        if target == "cuda" and aot_mode != "off":
            kernels[target]["aot"] = _export_aot(out, source, op, best, data_file, pt_bytes, aot_mode, aot_arch)
    doc = {"source": source, "op": op, "truth": truth, "package_env": f"{pkg.upper()}_FORCE_FALLBACK",
           "shapes": data.get("shapes"), "seed": data.get("seed"), "ref_device": data.get("device_name"),
           "task_sha256": hashlib.sha256(ref.path.read_bytes()).hexdigest(), "tolerance": tolerance,
           "kernels": kernels, "data_file": data_name if data_file.exists() else None,
           "doc": (ref.path.read_text(errors="replace").split('"""')[1].strip().splitlines() or [""])[0]
           if ref.path.read_text(errors="replace").lstrip().startswith('"""') else ""}
    (folder / "op.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    fn = op_mod if not op_mod.startswith("_") else op_mod.lstrip("_") or op_mod
    cls = "".join(p.capitalize() for p in op_mod.split("_") if p) or "Op"
    if cls[0].isdigit():
        cls = "Op" + cls
    (folder / "__init__.py").write_text(op_init(pkg, source, op, fn, cls, doc))
    (out / "tests" / f"test_{module_name(source)}__{op_mod}.py").write_text(op_tests(pkg, source, op, doc))
    docs = out / "docs" / source
    docs.mkdir(parents=True, exist_ok=True)
    (docs / f"{op}.md").write_text(op_doc(pkg, source, op, fn, cls, doc))
    return {"source": source, "op": op, "module": f"{pkg}.{module_name(source)}.{op_mod}", "function": fn,
            "class": cls, "targets": sorted(kernels), "truth": truth,
            "aot": {t: k["aot"]["status"] for t, k in kernels.items() if "aot" in k},
            "speedup_vs_model": {t: k["speedup_vs_model"] for t, k in kernels.items()}}


def _device_of(target: str) -> dict:
    """The torch device type of a target's tensors, and whether its Triton runs in the interpreter."""
    from farm.targets import get_target

    t = get_target(target)
    return {"device_type": t.torch_device, "interpret": bool(t.interpret)}


def _task_ref(settings: Settings, source: str, op: str) -> corpus.TaskRef:
    try:
        [ref] = corpus.find_tasks(settings, [source], [op])
    except FarmError as exc:
        raise FarmError(f"{source}/{op}: the task file is needed to export the op ({exc})") from None
    return ref


def _truth_and_tolerance(ref: corpus.TaskRef) -> tuple[str | None, dict]:
    """Which class is the fallback, and the tolerance per dtype the tests use (the farm's, with the task's overrides)."""
    try:
        task = corpus.load_task(ref)
        truth = "Reference" if task.reference_cls is not None else "Model"
        overrides = task.tolerance
    except FarmError as exc:
        if "must define class Reference" not in str(exc):
            raise
        truth, overrides = None, {}  # reference-data mode: the original Model is Triton; no PyTorch fallback
    tolerance = {k: list(v) for k, v in DEFAULT_TOLERANCE.items()}
    tolerance.update({k: list(v) for k, v in overrides.items()})
    return truth, tolerance


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
