"""`farm reference`: generate reference data (.pt) for the selected tasks on the reference platform."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from farm.cli.common import (
    JsonOption,
    OpsOpt,
    SourceOpt,
    common_cause,
    error_line,
    fmt_size,
    handle_errors,
    out,
    print_json,
    progress_bar,
    say,
    settings,
    table,
)
from farm.corpus import tasks as taskfiles
from farm.errors import EXIT_FAILED, FarmError
from farm.reference.generate import generate_references, reference_cases, reference_jobs
from farm.reference.manifest import MANIFEST_KEY
from farm.storage import open_folder, open_store
from farm.targets import usable_device


@handle_errors
def reference(
    ctx: typer.Context,
    source: SourceOpt = None,
    ops: OpsOpt = None,
    output_dir: Annotated[Optional[str], typer.Option(
        "--output-dir", "-o", help="Write <dir>/<source>/<op>.pt and <dir>/manifest.json (the existing tools' layout), and "
                                   "the secret input sets of reference-data-mode ops in <dir>/.secrets/.")] = None,
    store: Annotated[Optional[str], typer.Option(help="Storage URL, file:///path or s3://bucket/prefix [store]; not with "
                                                   "--output-dir (the folder holds everything the target needs).")] = None,
    device: Annotated[str, typer.Option(help="The reference platform's device: N (CUDA index), cuda:N, cpu, npu:N, or auto.")] = "auto",
    seed: Annotated[Optional[int], typer.Option(help="Seed [reference.seed].")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="Seconds per op [reference.timeout_s].")] = None,
    shapes: Annotated[str, typer.Option(help="bench, small, or auto (small on cpu, bench on an accelerator).")] = "auto",
    force: Annotated[bool, typer.Option("--force", help="Regenerate ops whose stored .pt is current; with --output-dir, "
                                        "also write into a non-empty folder farm did not write (your files there are kept).")] = False,
    jobs: Annotated[Optional[int], typer.Option(
        help="Ops at once, each in its own child on the device; 0: automatic [reference.jobs, default 1].")] = None,
    as_json: bool = JsonOption,
) -> None:
    """Run each task's original Model and store its inputs and outputs; exit 1 if any op failed."""
    if output_dir and store:
        raise FarmError("give either --output-dir (a folder to copy to the target host) or --store, not both")
    s = settings(ctx, {"reference.seed": seed, "reference.timeout_s": timeout, "store": store, "reference.jobs": jobs})
    # a folder holds the .pt files in the existing tools' layout and the secret input sets in a
    # hidden folder those tools never read: copied whole, it is all the target host needs
    target = open_folder(output_dir, "--output-dir", force) if output_dir else open_store(s.store, s)
    spec = usable_device(device, default_target="cuda")
    if shapes == "auto":
        shapes = "small" if spec.target.interpret else "bench"
    if shapes not in taskfiles.SHAPE_SETS:
        raise FarmError(f"unknown shape set '{shapes}' (--shapes): use bench, small or auto")
    refs = taskfiles.find_tasks(s, source, ops)
    with progress_bar(not as_json) as progress:
        bar = progress.add_task(f"reference on {spec.label}", total=len(refs))
        results = generate_references(
            refs, target, spec, s.reference.seed, shapes, s.reference.timeout_s, force,
            on_done=lambda r: progress.update(bar, advance=1, description=f"{r['source']}/{r['op_name']}"),
            seed_sets=s.reference.seed_sets, jobs=reference_jobs(s.reference.jobs, spec),
            cases=reference_cases(s.reference.cases, spec), ship_max_mb=s.reference.ship_max_mb)
    if as_json:
        print_json({"store": target.url, "device": spec.label, "shapes": shapes, "results": results})
    else:
        out.print(_summary(results, target.url))
    failed = [r for r in results if not r.get("success")]
    cause = common_cause([{"error": error_line(r.get("error"))} for r in failed], len(results))
    if cause:
        say(f"error: {cause}", style="bold red")
    if failed:
        listed = "" if output_dir else " (farm cache ls)"
        say(f"{len(failed)} of {len(results)} ops failed: see the error column; full errors in "
            f"{target.describe(MANIFEST_KEY)}{listed}", style="red")
        raise typer.Exit(EXIT_FAILED)


def _summary(results: list[dict], url: str):
    rows = []
    for r in results:
        if r.get("skipped"):
            status = "skipped (current)"
        elif r.get("success"):
            status = "ok"
        else:
            status = f"failed ({r.get('stage')})"
        error = (r.get("error") or "").splitlines()[-1:] or [""]
        rows.append([r["source"], r["op_name"], status, _truth(r), fmt_size(r.get("size_bytes")),
                     f"{r['elapsed_s']:.2f}" if r.get("elapsed_s") is not None else "-", error[0]])
    ok = sum(1 for r in results if r.get("success"))
    return table(f"reference data -> {url}: {ok}/{len(results)} ok",
                 ["source", "op", "result", "truth", "size", "seconds", "error"], rows)


def _truth(r: dict) -> str:
    cases = f" +{r['cases']} cases" if r.get("cases") else ""
    if r.get("mode") == "reference-data":
        return (f"recorded, {r.get('seed_sets') or 0} secret input sets" if r.get("success") else "recorded") + cases
    return (r.get("reference_class") or ("Model" if r.get("mode") == "model" else "-")) + cases
