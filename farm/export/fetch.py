"""`farm fetch`: the best verified kernels of the store as importable modules.

    OUT/<target>/<source>/<op>.py   best.py as promoted (header: speedup, device, how verified)
    OUT/**/__init__.py              so that `from cpu.demo.row_sum import ModelNew` works
    OUT/index.json                  one entry per kernel: where it came from, its figures
    OUT/README.md                   the set for a reader: what each is, speedup, verification
    OUT/report/index.html           the run's report page, where the store holds one (runs/<run>/report/)
    OUT/.kfarm-owned.json           what the farm wrote: a re-fetch replaces only those files

A kernel is the one promoted to kernels/<target>/<source>/<op>/ (the fastest verified on its
device so far); a run narrows the set to that run's source, ops and target.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from farm import pyast
from farm.config import Settings
from farm.corpus import tasks as taskfiles
from farm.distributed.runs import is_local, load_run
from farm.errors import FarmError
from farm.evaluate import verified
from farm.reference.manifest import now
from farm.search.results import best_record, best_speedup, fmt_best, kernel_prefix, kernel_source, stored_mode
from farm.storage import Store, owned


def select(store: Store, run: str | None = None, target: str | None = None, source: str | None = None,
           op: str | None = None) -> list[dict[str, Any]]:
    """best.json of every kernel that matches, sorted by target, source, op."""
    if run and is_local(store, run):  # farm run / farm search: the kernels it promoted, still the best
        keys = sorted(info.key for info in store.list("kernels/") if _matches(info.key, target, source, op))
        metas = [m for m in (best_record(store, k) for k in keys) if m.get("run") == run]
        return sorted(metas, key=lambda m: (m["target"], m["source"], m["op"]))
    if run:
        spec, _ = load_run(store, run)
        if source and source != spec.source:
            raise FarmError(f"run {run} is over source {spec.source}, not {source} (--source)")
        keys = [f"{kernel_prefix(target or spec.target, spec.source, o)}/best.json" for o in spec.ops
                if not op or o == op]
    else:
        keys = sorted(info.key for info in store.list("kernels/") if _matches(info.key, target, source, op))
    metas = [best_record(store, k) for k in keys]
    return taskfiles.natural_sorted((m for m in metas if m), key=lambda m: f"{m['target']}/{m['source']}/{m['op']}")


def _matches(key: str, target: str | None, source: str | None, op: str | None) -> bool:
    parts = key.split("/")
    if len(parts) != 5 or parts[4] != "best.json":
        return False
    return all(want in (None, got) for want, got in zip((target, source, op), parts[1:4]))


def module_name(name: str) -> str:
    """An op or source name as a Python identifier."""
    ident = re.sub(r"\W", "_", name)
    return ident if ident.isidentifier() and not ident[0].isdigit() else f"k_{ident}"


def export(store: Store, metas: list[dict], out: Path, settings: Settings | None = None,
           run: str | None = None, force: bool = False) -> dict[str, Any]:
    """Write the modules, index.json and README.md; returns the index. Only the farm's own files
    in `out` are replaced (farm.storage.owned): --force to write into a folder of someone else's."""
    if not metas:
        raise FarmError(f"no kernels to fetch from {store.url} with these filters (a run's ops get kernels "
                        "only where a candidate passed)")
    with owned.writing(out, "--out", force) as stage:
        return _write(store, metas, stage, settings, run)


def _write(store: Store, metas: list[dict], stage: Path, settings: Settings | None, run: str | None) -> dict[str, Any]:
    (stage / "__init__.py").touch()
    entries = []
    for meta in metas:
        folder = stage / meta["target"] / module_name(meta["source"])
        folder.mkdir(parents=True, exist_ok=True)
        for pkg in (folder.parent, folder):
            (pkg / "__init__.py").touch()
        path = folder / f"{module_name(meta['op'])}.py"
        path.write_bytes(kernel_source(store, kernel_prefix(meta["target"], meta["source"], meta["op"])))
        module = ".".join((meta["target"], module_name(meta["source"]), module_name(meta["op"])))
        entries.append({"module": module, "file": str(path.relative_to(stage)),
                        "description": _describe(settings, meta["source"], meta["op"]), **meta,
                        "timing_mode": stored_mode(meta) or meta.get("timing_mode")})
    index = {"fetched_at": now(), "store": store.url, "run": run, "kernels": entries,
             "report": fetch_report(store, run, stage / "report") if run else None}
    (stage / "index.json").write_text(json.dumps(index, indent=2, default=str) + "\n")
    (stage / "README.md").write_text(readme(index))
    return index


def fetch_report(store: Store, run: str, dest: Path) -> str | None:
    """The run's report page as `farm report --publish` or `farm submit --wait` left it in the
    store (runs/<run>/report/...), copied to dest; its index.html relative to dest's parent."""
    prefix = f"runs/{run}/report/"
    keys = [info.key for info in store.list(prefix)]
    for key in keys:
        store.get_file(key, dest / key[len(prefix):])
    return f"{dest.name}/index.html" if f"{prefix}index.html" in keys else None


def _describe(settings: Settings | None, source: str, op: str) -> str:
    """The first line of the task file's docstring, if this machine has the corpus."""
    if settings is None:
        return ""
    try:
        [ref] = taskfiles.find_tasks(settings, [source], [op])
        doc = ast.get_docstring(pyast.parse(ref.path.read_text())) or ""
    except (FarmError, OSError, SyntaxError):
        return ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def readme(index: dict[str, Any]) -> str:
    kernels = index["kernels"]
    first = kernels[0]["module"]
    lines = [
        "# Kernels fetched from Kernel Farm",
        "",
        f"{len(kernels)} kernel(s) from {index['store']}" + (f", run {index['run']}" if index["run"] else "")
        + f", fetched {index['fetched_at']}.",
        "",
        "Each module defines `class ModelNew(nn.Module)`, a drop-in for its task's `Model`: same constructor,",
        "same forward signature, Triton kernels inside. Put this folder on `sys.path` and import:",
        "",
        f"    from {first} import ModelNew",
        "",
        "| module | what it is | speedup vs Model | vs PyTorch Reference | median ms | device | run / candidate |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in kernels:
        ms = "-" if k.get("time_ms") is None else f"{k['time_ms']:.4g}"
        lines.append(f"| `{k['module']}` | {k['description'] or k['source'] + '/' + k['op']} | "
                     f"{fmt_best(best_speedup(k))} | {_x(k.get('speedup_vs_reference'))} | {ms} | "
                     f"{k.get('device_name') or '-'} | {k.get('run')} / {k.get('candidate')} ({k.get('generator')}) |")
    if index.get("report"):
        lines += ["", f"The run's report (plots, lineages, failures): [{index['report']}]({index['report']}), "
                  "a page that opens offline."]
    lines += ["", "## How each kernel was verified", "",
              "Before it was kept, every kernel passed, in an isolated process on the target device:",
              "its outputs against the stored reference data (the .pt made by the original Model on the reference",
              "platform), a second run with bitwise-identical output, inputs left unchanged, Triton launches",
              "observed at run time, and, as listed below, inputs it had never seen. Tolerances:",
              "farm/runtime/tolerance.py. Times are medians of device-event timings behind a cache flush; speedups",
              "compare with the original Model and the PyTorch Reference timed the same way.", ""]
    for k in kernels:
        v = k.get("verified") or {}
        prov, check = k.get("provenance") or {}, k.get("provenance_check") or {}
        lines.append(f"- `{k['module']}`: reference data sha256 {str(v.get('ref_sha256') or '?')[:16]}... "
                     f"made on {v.get('ref_device') or '?'}; unseen inputs: {verified.describe(v)}; task file sha256 "
                     f"{str(prov.get('task_sha256') or '?')[:16]}..., verified by farm {prov.get('farm_version') or '?'}"
                     + (f"; {check['status'].upper()}: {check['why']}" if check.get("status") in ("stale", "unknown")
                        else "") + ".")
    return "\n".join(lines) + "\n"
