"""`farm search` (one op or a batch, with a resume ledger) and `farm run` (reference then
search for a whole source in one process: the embedded default)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Annotated, Optional

import typer

from farm import corpus
from farm.backends import DeviceSpec, resolve_device
from farm.cli.common import (FlushOpt, JsonOption, err, fmt_num, handle_errors, out, print_json, progress_bar,
                             settings, table)
from farm.errors import EXIT_FAILED, FarmError
from farm.generators import OFFLINE_DEFAULT, load_generator
from farm.reference import generate_references, load_pt
from farm.search.batch import cached_ops, load_reference, search_batch, summarize
from farm.search.controller import SearchConfig, search_op
from farm.storage import open_store
from farm.timing import check_flush

StoreOpt = Annotated[Optional[str], typer.Option(help="Storage URL, file:///path or s3://bucket/prefix [store].")]
TargetOpt = Annotated[str, typer.Option(help="cuda, ascend, cpu, or auto (the accelerator present, else cpu).")]
GeneratorsOpt = Annotated[str, typer.Option(help="Comma-separated generators: tune, port, inductor, llm.")]
MaxTasksOpt = Annotated[int, typer.Option(help="Candidates to evaluate per op, seeds included.")]


def parse_devices(target: str, devices: str | None) -> list[DeviceSpec]:
    """'0,1,2,3' or '0 1 2 3' -> one DeviceSpec per device (cpu: just one)."""
    first = resolve_device(target, default_target="cuda")
    if first.backend.name == "cpu" or not devices:
        return [first]
    specs = []
    for part in devices.replace(",", " ").split():
        if not part.isdigit():
            raise FarmError(f"--devices takes device indices like '0,1,2,3', not {devices!r}")
        specs.append(resolve_device(f"{first.backend.name}:{part}"))
    return specs


def make_generators(names: str) -> list:
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    if not chosen:
        raise FarmError("--generators names none")
    return [load_generator(n) for n in chosen]


@handle_errors
def search(
    ctx: typer.Context,
    source: Annotated[Optional[list[str]], typer.Option("--source", "-s", help="Source (repeatable in batch mode).")] = None,
    op: Annotated[Optional[str], typer.Option(help="One op; without it, every cached op of the source(s).")] = None,
    ref_pt: Annotated[Optional[Path], typer.Option(help="Reference data file, with --task-file, outside any store.")] = None,
    task_file: Annotated[Optional[Path], typer.Option(help="Task file that goes with --ref-pt.")] = None,
    target: TargetOpt = "auto",
    devices: Annotated[Optional[str], typer.Option(help="Device indices, e.g. '0,1,2,3'.")] = None,
    max_concurrent: Annotated[int, typer.Option(help="Candidates in flight per device.")] = 4,
    max_tasks: MaxTasksOpt = 40,
    chunk: Annotated[int, typer.Option(help="Candidates between two checkpoints.")] = 8,
    generators: GeneratorsOpt = ",".join(OFFLINE_DEFAULT),
    run: Annotated[Optional[str], typer.Option(help="Run name (runs/<run>/...); reuse it to resume.")] = None,
    store: StoreOpt = None,
    seed: Annotated[int, typer.Option(help="Seed of the search's random choices.")] = 0,
    retry_errors: Annotated[bool, typer.Option("--retry-errors", help="Batch: search ops recorded as error again.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Search again from scratch, ignoring ledger and checkpoints.")] = False,
    flush: Annotated[str, FlushOpt] = "write",
    as_json: bool = JsonOption,
) -> None:
    """Evolutionary search for fast, verified kernels: one op, or every cached op of the sources."""
    s = settings(ctx, {"store": store})
    st = open_store(s.store, s)
    specs = parse_devices(target, devices)
    config = SearchConfig(max_tasks=max_tasks, max_concurrent=max_concurrent, chunk_size=chunk, seed=seed,
                          generators=tuple(g.strip() for g in generators.split(",")), flush=check_flush(flush))
    gens = make_generators(generators)
    run = run or _default_run_name()
    if ref_pt or task_file:
        if not (ref_pt and task_file):
            raise FarmError("--ref-pt and --task-file go together")
        ref = corpus.ref_from_file(task_file, (source or ["local"])[0])
        if not ref_pt.is_file():
            raise FarmError(f"reference file {ref_pt} (--ref-pt) does not exist")
        rows = [_one(ref, load_pt(ref_pt), st, run, specs, gens, config, force, as_json)]
    elif op:
        if not source or len(source) != 1:
            raise FarmError("--op needs exactly one --source")
        [ref] = corpus.find_tasks(s, source, [op])
        rows = [_one(ref, load_reference(st, ref.source, ref.op), st, run, specs, gens, config, force, as_json)]
    else:
        rows = _batch(s, st, source, run, specs, gens, config, retry_errors, force, as_json)
    _report(rows, run, st.url, as_json)


def _default_run_name() -> str:
    return "search-" + _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")


def _one(ref, data, st, run, specs, gens, config, force, as_json) -> dict:
    with progress_bar(not as_json) as progress:
        bar = progress.add_task(f"{ref.key} on {specs[0].label}", total=config.max_tasks)
        outcome = search_op(ref, data, st, run, specs[0].backend.name, specs, gens, config, force=force,
                            on_event=_bar_updater(progress, bar, ref.key))
    return outcome.as_dict()


def _bar_updater(progress, bar, name):
    def update(kind: str, info: dict) -> None:
        if kind == "candidate":
            progress.update(bar, completed=info["submitted"], description=f"{name}: {info['id']} {info['verdict']}")

    return update


def _batch(s, st, sources, run, specs, gens, config, retry_errors, force, as_json) -> list[dict]:
    known = {(r.source, r.op): r for r in corpus.find_tasks(s, sources)}
    pairs = [p for p in cached_ops(st, sources) if p in known]
    if not pairs:
        raise FarmError(f"no cached reference data for {', '.join(sources or ['any source'])} in {st.url}: "
                        "run `farm reference` first")
    refs = [known[p] for p in pairs]
    with progress_bar(not as_json) as progress:
        bar = progress.add_task("batch", total=len(refs))
        rows = search_batch(refs, st, run, specs[0].backend.name, specs, gens, config, retry_errors, force,
                            on_op=lambda phase, row: progress.update(
                                bar, advance=0 if phase == "start" else 1,
                                description=f"{row['source']}/{row['op']}: {row.get('status', 'searching')}"))
    return rows


def _report(rows: list[dict], run: str, url: str, as_json: bool) -> None:
    totals = summarize(rows)
    if as_json:
        print_json({"run": run, "store": url, "summary": totals, "ops": rows})
    else:
        out.print(leaderboard(rows, f"run {run} ({url})"))
        out.print(" ".join(f"{k}: {v}" for k, v in totals.items()))
    if totals["failed"]:
        raise typer.Exit(EXIT_FAILED)


def leaderboard(rows: list[dict], title: str):
    ordered = sorted(rows, key=lambda r: (r["status"] != "succeeded", -(r.get("speedup_vs_model") or 0)))
    return table(title, ["source", "op", "result", "pass", "best ms", "vs Model", "vs Reference", "tried", "stop"],
                 [[r["source"], r["op"], r["status"], f"{r.get('passed', 0)}", fmt_num(r.get("best_time_ms"), ".4f"),
                   fmt_num(r.get("speedup_vs_model"), ".2f"), fmt_num(r.get("speedup_vs_reference"), ".2f"),
                   r.get("submitted", 0), r.get("stop_reason") or r.get("error", "")[:60]] for r in ordered])


@handle_errors
def run_local(
    ctx: typer.Context,
    source: Annotated[str, typer.Option("--source", "-s", help="Source to run end to end.")] = "demo",
    target: TargetOpt = "auto",
    max_tasks: MaxTasksOpt = 12,
    generators: GeneratorsOpt = ",".join(OFFLINE_DEFAULT),
    run: Annotated[Optional[str], typer.Option(help="Run name [local-<source>-<target>].")] = None,
    store: StoreOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Search again even where this run already finished.")] = False,
    as_json: bool = JsonOption,
) -> None:
    """Reference data then search for every op of a source, in this process: no Redis, no S3."""
    s = settings(ctx, {"store": store})
    st = open_store(s.store, s)
    spec = resolve_device(target, default_target="cuda")
    shapes = "small" if spec.backend.name == "cpu" else "bench"
    refs = corpus.find_tasks(s, [source])
    with progress_bar(not as_json) as progress:
        bar = progress.add_task(f"reference data on {spec.label}", total=len(refs))
        made = generate_references(refs, st, spec, s.reference.seed, shapes, s.reference.timeout_s,
                                   on_done=lambda r: progress.update(bar, advance=1))
    failed = [f"{r['source']}/{r['op_name']} ({r.get('stage')})" for r in made if not r.get("success")]
    if failed:
        err.print(f"[yellow]no reference data for {', '.join(failed)}: those ops are not searched[/]")
    ok = {(r["source"], r["op_name"]) for r in made if r.get("success")}
    config = SearchConfig(max_tasks=max_tasks, max_concurrent=1, chunk_size=4,
                          generators=tuple(g.strip() for g in generators.split(",")))
    with progress_bar(not as_json) as progress:
        bar = progress.add_task("search", total=len(ok))
        rows = search_batch([r for r in refs if (r.source, r.op) in ok], st, run or f"local-{source}-{spec.backend.name}",
                            spec.backend.name, [spec], make_generators(generators), config, force=force,
                            on_op=lambda phase, row: progress.update(
                                bar, advance=0 if phase == "start" else 1, description=f"search {row['op']}"))
    _report(rows, run or f"local-{source}-{spec.backend.name}", st.url, as_json)
