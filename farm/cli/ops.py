"""`farm ops`: the task corpus. List the tasks, and check each Model against its Reference."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from farm.cli.common import (
    JsonOption,
    OpsOpt,
    SourceOpt,
    fmt_num,
    handle_errors,
    out,
    print_json,
    progress_bar,
    say,
    settings,
    table,
)
from farm.corpus import listing, modes, opcheck
from farm.corpus import tasks as taskfiles
from farm.errors import EXIT_FAILED, FarmError, TaskError
from farm.targets import usable_device

app = typer.Typer(help="List and check the kernel tasks of the corpus.", no_args_is_help=True)



@app.command("list")
@handle_errors
def list_ops(ctx: typer.Context, source: SourceOpt = None, as_json: bool = JsonOption) -> None:
    """List the tasks of each source with their mode, origin and metadata; invalid files are shown with the rule
    they break."""
    refs = taskfiles.find_tasks(settings(ctx), source)
    with progress_bar(not as_json) as progress:
        bar = progress.add_task("loading tasks", total=len(refs))
        # every file is loaded in a child (farm.corpus.listing): a crash, hang, exit or print at
        # import is that file's error, and the others list as they would without it
        loaded = listing.load_rows(refs, on_row=lambda row: progress.update(
            bar, advance=1, description=f"{row['source']}/{row['op']}: {row.get('mode') or row['status']}"))
    rows = [_list_row(ref, loaded[ref.key]) for ref in refs]
    listed = {row.get("path") for row in rows}
    for name, folder in taskfiles.discover_sources(settings(ctx)).items():
        if source and name not in source:
            continue
        for path in taskfiles.misnamed_files(folder):
            if str(path) in listed:
                continue
            rows.append({"status": "invalid", "source": name, "op": path.stem, "path": str(path),
                         "error": f"{path}: the file name must be an op name: letters, digits, '_', '-', '.', "
                                  "starting with a letter or digit (rename it to use it)"})
    if as_json:
        print_json(rows)
    else:
        ok = sum(r["status"] == "ok" for r in rows)
        out.print(table(f"{len(rows)} tasks, {ok} usable", ["source", "op", "origin", "status", "mode", "truth",
                                                            "space", "tags", "summary"],
                        [[r["source"], r["op"], r["origin"], r["status"], r.get("mode", "-"), _truth(r), _space(r),
                          ",".join(r.get("tags", [])), r.get("summary") or r.get("error", "")] for r in rows]))
    if any(r["status"] != "ok" for r in rows):
        raise typer.Exit(EXIT_FAILED)


def _list_row(ref: taskfiles.TaskRef, row: dict) -> dict:
    """A loaded file's row with its truth decided here (a trial of its comparison class runs in a
    child of its own: farm.corpus.modes)."""
    static = row.pop("_static", None)
    if row["status"] != "ok" or static is None:
        return row
    try:
        decided = modes.decide(ref, static["mode"], static["comparison"], static["reference"], static["reason"])
    except TaskError as exc:
        return listing.invalid(ref, str(exc))
    row.update(decided.as_dict())
    row["reference"] = row["reference_class"] is not None
    return row


def _space(row: dict) -> str:
    """Which dimensions vary (docs/task-format.md, "Shape spaces") and where that came from."""
    if "space_text" not in row:
        return "-"
    return f"{row['space_text']} ({row['space_origin']})"


def _truth(row: dict) -> str:
    if row.get("mode") == "reference":
        return row["reference_class"]
    if row.get("mode") == "reference-data":
        return "recorded Model outputs"
    return "Model" if row.get("mode") == "model" else "-"


@app.command("check")
@handle_errors
def check(
    ctx: typer.Context,
    source: SourceOpt = None,
    ops: OpsOpt = None,
    device: Annotated[str, typer.Option(help="cpu (Triton interpreter), cuda[:N], npu[:N], N, or auto.")] = "auto",
    shapes: Annotated[str, typer.Option(help="bench (the original's shapes), small, or auto (small on cpu).")] = "auto",
    seed: Annotated[Optional[int], typer.Option(help="Seed for get_init_inputs/get_inputs [reference.seed].")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="Seconds per op [check.timeout_s].")] = None,
    as_json: bool = JsonOption,
) -> None:
    """Run every selected Model against its Reference on one device; exit 1 if any op fails."""
    s = settings(ctx, {"reference.seed": seed, "check.timeout_s": timeout})
    spec = usable_device(device, default_target="cuda")
    if shapes == "auto":
        shapes = "small" if spec.target.interpret else "bench"
    if shapes not in taskfiles.SHAPE_SETS:
        raise FarmError(f"unknown shape set '{shapes}' (--shapes): use bench, small or auto")
    refs = taskfiles.find_tasks(s, source, ops)
    with progress_bar(not as_json) as progress:
        bar = progress.add_task(f"checking on {spec.label}", total=len(refs))
        results = opcheck.check_ops(refs, spec, shapes, s.reference.seed, s.check.timeout_s,
                                    on_done=lambda r: progress.update(bar, advance=1, description=f"{r['source']}/{r['op']}: {r['status']}"))
    if as_json:
        print_json({"device": spec.label, "shapes": shapes, "results": results})
    else:
        out.print(_check_table(results, spec.label, shapes))
    failed = [r for r in results if r["status"] != "pass"]
    if failed:
        say(f"{len(failed)} of {len(results)} ops failed: see the table (--json for each op's full error)", style="red")
        raise typer.Exit(EXIT_FAILED)


def _shapes_text(shapes: list, dtypes: list) -> str:
    parts = []
    for shp, dt in zip(shapes, dtypes):
        if shp is None:
            continue
        parts.append(f"{dt.removeprefix('torch.')}{shp}")
    return " ".join(parts)


def _check_table(results: list[dict], device: str, shapes: str):
    rows = []
    for r in results:
        status = r["status"] + (f" ({r['stage']})" if r["status"] == "error" else "")
        rows.append([r["source"], r["op"], status, r.get("shape_origin") or "-", fmt_num(r.get("max_abs")),
                     fmt_num(r.get("max_rel")), _shapes_text(r.get("input_shapes", []), r.get("input_dtypes", [])),
                     fmt_num(r.get("model_ms"), ".3f"), r.get("error", "")])
    # "shapes" says where each op's small shapes come from: file (SMALL_SHAPES), config,
    # derived (farm.corpus.shapes), full (its own shapes fit the small budget)
    return table(f"ops check on {device} ({shapes} shapes)",
                 ["source", "op", "result", "shapes", "max abs", "max rel", "inputs", "ms", "error"], rows)
