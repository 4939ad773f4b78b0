"""`farm search` (one op or a batch, with a resume ledger) and `farm run` (reference then
search for a whole source in one process: the embedded default)."""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from farm.cli import report_cmd
from farm.cli.common import (
    FlushOpt,
    JsonOption,
    OpsOpt,
    TimingModeOpt,
    common_cause,
    err,
    error_line,
    fmt_num,
    handle_errors,
    out,
    print_json,
    progress_bar,
    same_op,
    say,
    settings,
    table,
    use_frontend_setting,
)
from farm.config import SEED_MAX, Settings
from farm.corpus import tasks as taskfiles
from farm.corpus.tasks import validate_name
from farm.errors import EXIT_FAILED, FarmError
from farm.evaluate import profiles
from farm.evaluate.options import EvalOptions
from farm.evaluate.timing import check_flush, check_mode
from farm.generators import DEFAULT_CHAIN, INTERPRETED_CHAIN, load_generator
from farm.reference import folder as refolder
from farm.reference.generate import generate_references, reference_cases, reference_jobs
from farm.search import ledger
from farm.search.batch import cached_ops, load_reference, summarize
from farm.search.budget import search_by_headroom
from farm.search.context import SearchConfig, SearchContext
from farm.search.controller import search_op
from farm.search.results import best_speedup
from farm.storage import locks, open_store
from farm.targets import DeviceSpec, resolve_device, through_mask, usable_device

StoreOpt = Annotated[Optional[str], typer.Option(help="Storage URL, file:///path or s3://bucket/prefix [store].")]
TargetOpt = Annotated[str, typer.Option(help="cuda, ascend, cpu, or auto (the accelerator present, else cpu).")]
GeneratorsOpt = Annotated[str, typer.Option(
    help="Generators (tune, port, inductor, llm): ',' within a tier, '>' before a tier that gives initial "
         "candidates only to ops the earlier tiers gave none; the default is 'tune,port>inductor' on an interpreted target (cpu) and adds "
         "'>llm' when llm.base_url is set.")]
MaxTasksOpt = Annotated[int, typer.Option(min=1, help="Candidates to evaluate per op, initial candidates included.")]
ProfileOpt = Annotated[str, typer.Option(
    "--profile", help="Evaluation rules: farm (default: strict tolerances, secret fresh inputs) or kernelbench (its "
                      "tolerances, 5 trials, 100 timed reps, fast_p in the summary); docs/evaluator.md.")]


def parse_devices(target: str, devices: str | None) -> list[DeviceSpec]:
    """'0,1,2,3' or '0 1 2 3' -> one DeviceSpec per device (cpu: just one)."""
    first = usable_device(target, default_target="cuda", option="--target", notify=stand_in_notice)
    if devices is None:
        return [first]
    parts = devices.replace(",", " ").split()
    if not parts or not all(p.isdigit() for p in parts):
        raise FarmError(f"--devices takes device indices like '0,1,2,3', not {devices!r}")
    if first.target.visible_env is None:
        raise FarmError(f"target {first.target.name} has no devices to number: leave out --devices")
    return [through_mask(resolve_device(f"{first.target.name}:{part}", option="--devices"), "--devices")
            for part in parts]


def stand_in_notice(text: str) -> None:
    say(text, style="yellow")


def make_generators(names: str, s: Settings | None = None, interpreted: bool = False) -> list:
    """--generators: names separated by ',' within a tier and '>' between tiers (a later tier
    seeds only ops that the earlier ones could not). The default chain puts inductor after
    tune and port on an interpreted target, and gets '>llm' when an LLM endpoint is
    configured (llm.base_url of `s`, the command's settings: the llm generator is given them,
    with the command's --config and --set)."""
    if names == DEFAULT_CHAIN:
        names = (INTERPRETED_CHAIN if interpreted else DEFAULT_CHAIN) + (">llm" if s and s.llm.base_url else "")
    out = []
    for tier, group in enumerate(names.split(">")):
        chosen = [n.strip() for n in group.split(",") if n.strip()]
        if not chosen:
            raise FarmError(f"--generators {names!r}: an empty tier (use names separated by ',' and '>')")
        for name in chosen:
            gen = load_generator(name, **_configured(name, s))
            gen.tier = tier
            out.append(gen)
    if len({g.name for g in out}) != len(out):
        raise FarmError(f"--generators {names!r} names a generator twice")
    return out


def _configured(name: str, s: Settings | None) -> dict:
    """A generator's options from the command's settings (the llm one's endpoint and model)."""
    if name != "llm" or s is None:
        return {}
    from farm.generators.llm.generator import OPTIONS

    return {key: getattr(s.llm, key) for key in OPTIONS}


@handle_errors
def search(
    ctx: typer.Context,
    source: Annotated[Optional[list[str]], typer.Option("--source", "-s", help="Source (repeatable in batch mode).")] = None,
    op: Annotated[Optional[str], typer.Option(help="One op; without it, every cached op of the source(s).")] = None,
    ref_pt: Annotated[Optional[Path], typer.Option(
        help="Reference data file, with --task-file, outside any store: e.g. DIR/<source>/<op>.pt of a folder copied "
             "from the reference host (its secret input sets are read from DIR/.secrets/).")] = None,
    task_file: Annotated[Optional[Path], typer.Option(
        "--task-file", "--benchmark-file", help="Task file that goes with --ref-pt (--benchmark-file: the existing "
                                                "tools' name).")] = None,
    ref_dir: Annotated[Optional[Path], typer.Option(
        "--ref-dir", "--cache-dir", help="Batch over every DIR/<source>/<op>.pt of a reference folder copied from the "
                                         "reference host, read in place (no push); task files from the corpus by "
                                         "source name; resumable (--cache-dir: the existing tools' name).")] = None,
    target: TargetOpt = "auto",
    devices: Annotated[Optional[str], typer.Option(help="Device indices, e.g. '0,1,2,3'.")] = None,
    max_concurrent: Annotated[int, typer.Option(min=1, help="Candidates in flight per device.")] = 4,
    max_tasks: MaxTasksOpt = 40,
    chunk: Annotated[int, typer.Option(min=1, help="Candidates between two checkpoints.")] = 8,
    generators: GeneratorsOpt = DEFAULT_CHAIN,
    run: Annotated[Optional[str], typer.Option(help="Run name (runs/<run>/...); reuse it to resume.")] = None,
    store: StoreOpt = None,
    seed: Annotated[int, typer.Option(min=0, max=SEED_MAX, help="Seed of the search's random choices.")] = 0,
    retry_errors: Annotated[bool, typer.Option("--retry-errors", help="Batch: search ops recorded as error again.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Search again from scratch, ignoring ledger and checkpoints.")] = False,
    flush: Annotated[str, FlushOpt] = "write",
    page: bool = report_cmd.ReportOption,
    profile: ProfileOpt = "farm",
    timing_mode: Annotated[str, TimingModeOpt] = "auto",
    compile_workers: Annotated[Optional[int], typer.Option(
        min=-1, help="Compile-ahead runners per search: -1 auto, 0 off (default: evaluator.compile_workers; "
                     "docs/search.md, Pipeline).")] = None,
    ops_per_device: Annotated[int, typer.Option(
        min=1, help="Batch: ops searched at once per device, timings kept exclusive (docs/search.md, Pipeline).")] = 1,
    as_json: bool = JsonOption,
) -> None:
    """Evolutionary search for fast, verified kernels: one op, or every cached op of the sources."""
    s = settings(ctx, {"store": store})
    use_frontend_setting(s)
    specs = parse_devices(target, devices)
    gens = make_generators(generators, s, specs[0].target.interpret)
    config = SearchConfig(max_tasks=max_tasks, max_concurrent=max_concurrent, chunk_size=chunk, seed=seed,
                          generators=tuple(g.name for g in gens))
    evaluation = EvalOptions(flush=check_flush(flush), profile=profiles.get(profile).name,
                             timing_mode=check_mode(timing_mode), compile_workers=compile_workers)
    st = open_store(s.store, s)

    def context(run: str) -> SearchContext:
        return SearchContext(st, run, specs[0].target.name, specs, gens, config, evaluation, s)

    if ref_dir and (ref_pt or task_file or op):
        raise FarmError("--ref-dir searches a whole folder: leave out --ref-pt, --task-file and --op")
    if ref_pt or task_file:
        if not (ref_pt and task_file):
            raise FarmError("--ref-pt and --task-file (--benchmark-file) go together")
        if not ref_pt.is_file():
            raise FarmError(f"reference file {ref_pt} (--ref-pt) does not exist")
        data = refolder.load(ref_pt, st)
        ref = taskfiles.ref_from_file(task_file, _pt_source(source, data, ref_pt), settings=s)
        same_op(ref, data, ref_pt, f"{task_file} (--task-file)")
        run = validate_name(run or folder_run_name(ref_pt.resolve().parent.parent, specs[0]), "run", "--run")
        rows = [_one(ref, data, context(run), force, as_json)]
    elif ref_dir:
        if not ref_dir.is_dir():
            raise FarmError(f"reference folder {ref_dir} (--ref-dir) does not exist or is not a folder")
        run = validate_name(run or folder_run_name(ref_dir.resolve(), specs[0]), "run", "--run")
        rows = _folder_batch(context(run), ref_dir, source, retry_errors, force, as_json, ops_per_device)
    elif op:
        if not source or len(source) != 1:
            raise FarmError("--op needs exactly one --source")
        run = validate_name(run or _default_run_name(), "run", "--run")
        [ref] = taskfiles.find_tasks(s, source, [op], op_option="--op")
        rows = [_one(ref, load_reference(st, ref.source, ref.op), context(run), force, as_json)]
    else:
        run = validate_name(run or _default_run_name(), "run", "--run")
        rows = _batch(context(run), source, retry_errors, force, as_json, ops_per_device)
    _report(rows, run, st, as_json, page, evaluation.profile, redo="--force (or --retry-errors for errors)",
            folder=ref_dir or (ref_pt.resolve().parent.parent if ref_pt else None), s=s,
            interpreted=specs[0].target.interpret)


def _default_run_name() -> str:
    return "search-" + _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")


def folder_run_name(folder: Path, spec: DeviceSpec) -> str:
    """A search from a copied folder resumes by itself: the same command, the same run."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", folder.name).strip("._-") or "refs"
    return f"{name}-{spec.target.name}"


def _pt_source(source: list[str] | None, data: dict, pt: Path) -> str:
    """--source, else the source the .pt records, else its folder's name (DIR/<source>/<op>.pt)."""
    if source:
        return source[0]
    for name in (data.get("source"), pt.resolve().parent.name):
        try:
            return validate_name(str(name), "source")
        except FarmError:
            continue
    return "local"


def _folder_batch(ctx: SearchContext, folder: Path, sources, retry_errors, force, as_json,
                  ops_per_device) -> list[dict]:
    """Every .pt of a copied reference folder, read in place; the task files come from the corpus."""
    found = refolder.ops(folder, sources)
    if not found:
        raise FarmError(f"no reference data (<source>/<op>.pt) in {folder} (--ref-dir)"
                        + (f" for source(s) {', '.join(sources)}" if sources else ""))
    refs, paths, problems = _folder_tasks(ctx.settings, found)
    with progress_bar(not as_json) as progress:
        bar = progress.add_task("batch", total=len(refs))
        rows = search_by_headroom(refs, ctx, ctx.devices[0].target.interpret,
                                  retry_errors=retry_errors, force=force, ops_per_device=ops_per_device,
                                  on_op=op_progress(progress, bar, len(refs), as_json),
                                  load=lambda ref: refolder.load(paths[ref.key], ctx.store),
                                  current_sha=lambda ref: refolder.sha256_of(paths[ref.key]))
    return problems + rows


def _folder_tasks(s, found: list) -> tuple[list, dict[str, Path], list[dict]]:
    """The task of each folder op (by source and op name), and a failed row for each op that
    has none or that the folder lacks."""
    known = taskfiles.discover_sources(s)
    tasks = {r.key: r for src in sorted({f.source for f in found} & set(known)) for r in taskfiles.find_tasks(s, [src])}
    refs, paths, problems = [], {}, []
    for item in found:
        problem = item.problem
        if not problem and item.source not in known:
            problem = (f"no task files for source {item.source!r}: the farm knows no source of that name (configure "
                       f"corpus.akg_root or corpus.sources, docs/corpus.md)")
        elif not problem and item.key not in tasks:
            problem = f"no task file {known[item.source] / (item.op + '.py')} for {item.pt}"
        if problem:
            problems.append({"source": item.source, "op": item.op, "status": "failed", "stop_reason": "folder",
                             "error": problem, "submitted": 0, "passed": 0})
        else:
            refs.append(tasks[item.key])
            paths[item.key] = item.pt
    return refs, paths, problems


def _one(ref, data, ctx: SearchContext, force, as_json) -> dict:
    with progress_bar(not as_json) as progress:
        bar = progress.add_task(f"{ref.key} on {ctx.devices[0].label}", total=ctx.config.max_tasks)
        with locks.held(ctx.store, locks.run_lock_key(ctx.run), f"run {ctx.run}"):
            outcome = search_op(ref, data, replace(ctx, on_event=_bar_updater(progress, bar, ref.key)), force=force)
    return outcome.as_dict()


def _bar_updater(progress, bar, name):
    def update(kind: str, info: dict) -> None:
        if kind == "candidate":
            progress.update(bar, completed=info["submitted"], description=f"{name}: {info['id']} {info['verdict']}")

    return update


def _batch(ctx: SearchContext, sources, retry_errors, force, as_json, ops_per_device=1) -> list[dict]:
    known = {(r.source, r.op): r for r in taskfiles.find_tasks(ctx.settings, sources)}
    pairs = [p for p in cached_ops(ctx.store, sources) if p in known]
    if not pairs:
        raise FarmError(f"no cached reference data for {', '.join(sources or ['any source'])} in {ctx.store.url}: "
                        "run `farm reference` first")
    refs = [known[p] for p in pairs]
    with progress_bar(not as_json) as progress:
        bar = progress.add_task("batch", total=len(refs))
        rows = search_by_headroom(refs, ctx, ctx.devices[0].target.interpret,
                                  retry_errors=retry_errors, force=force, ops_per_device=ops_per_device,
                                  on_op=op_progress(progress, bar, len(refs), as_json))
    return rows


def op_progress(progress, bar, total: int, as_json: bool):
    """A batch's progress per op: the bar on a terminal, and a line on stderr per finished op
    where no bar is drawn (--json, or stderr in a log file), so a long batch run by a script
    shows how far it got, also when a time limit ends it."""
    lines = as_json or not err.is_terminal
    finished = 0

    def update(phase: str, row: dict) -> None:
        nonlocal finished
        name = f"{row['source']}/{row['op']}"
        if phase == "more":  # its share of the budget left (farm.search.budget): counted already
            if lines:
                say(f"[+] {name}: {row.get('status', '')}")
            return
        if phase != "start":
            finished += 1
        progress.update(bar, advance=0 if phase == "start" else 1, description=f"{name}: {row.get('status', 'searching')}")
        if lines and phase != "start":
            say(f"[{finished}/{total}] {name}: {row.get('status', '')}")

    return update


def _report(rows: list[dict], run: str, st, as_json: bool, page: bool, profile: str = "farm",
            redo: str = "--force", folder: Path | None = None, s=None, interpreted: bool = False) -> None:
    totals, url = summarize(rows, profile), st.url
    written = report_cmd.try_write(st, run, s=s) if page else {}
    if as_json:
        print_json({"run": run, "store": st.url, "summary": totals, "ops": rows, "report": written.get("page")})
    else:
        out.print(leaderboard(rows, f"run {run} ({st.url})", interpreted))
        out.print(" ".join(f"{k}: {v}" for k, v in totals.items() if v or k not in ("no_unseen_inputs", "retired")))
        report_cmd.print_line(written)
    if totals["skipped"]:
        say(f"{totals['skipped']} op(s) skipped: already finished in run {run} ({url}/{ledger.key(run)}); "
            f"{redo} searches them again, a higher --max-tasks continues them, --run NAME starts a new run",
            style="yellow")
    retired = [r for r in rows if r.get("retired")]
    if retired:
        say(f"{len(retired)} op(s) searched again, not skipped: their task file or reference data changed since run "
            f"{run} finished them, so those results are retired: "
            + "; ".join(f"{r['source']}/{r['op']}: {r['retired']}" for r in retired[:5])
            + (f" (and {len(retired) - 5} more)" if len(retired) > 5 else ""), style="yellow")
    # an op skipped because its search ended in error before is still in error
    unchecked = [f"{r['source']}/{r['op']}" for r in rows if r.get("unseen_inputs") is False
                 and r["status"] in ("succeeded", "skipped")]
    if unchecked:
        say(f"{len(unchecked)} op(s) verified on the .pt alone, NO unseen inputs checked (their reference data records "
            f"no secret input sets: made by the existing tools' generator; `farm reference --output-dir` records "
            f"them): {', '.join(unchecked)}", style="bold yellow")
    failed = [r for r in rows if r["status"] == "failed" or (r["status"] == "skipped" and r.get("previous") == "error")]
    if failed:
        where = ["the error column above" if not as_json else "each op's \"error\" in the JSON"]
        stops = {r.get("stop_reason") or "" for r in failed}
        if any(stop.startswith("reference") for stop in stops - {"folder"}) and folder is None:
            where.append(f"reference errors in full in {url}/refs/manifest.json (farm cache ls)")
        if any(not stop.startswith(("reference", "folder")) for stop in stops):
            where.append(f"search errors in {url}/{ledger.key(run)}")
        say(f"{len(failed)} of {totals['total']} op(s) ended in error: see {'; '.join(where)}", style="red")
        raise typer.Exit(EXIT_FAILED)


INTERPRETED_NOTE = ("CPU target: the times are the Triton interpreter's, on the host clock. They only rank candidates "
                    "against each other and say nothing of a kernel's speed on a device; vs Reference (PyTorch, not "
                    "interpreted) is left out (-), and promoted means verified, not faster.")


def leaderboard(rows: list[dict], title: str, interpreted: bool = False):
    """The run's table; on an interpreted target (cpu), its times labelled as what they are."""
    ordered = sorted(taskfiles.natural_sorted(rows, key=lambda r: f"{r.get('source', '')}/{r.get('op', '')}"),
                     key=lambda r: (r["status"] != "succeeded", -(r.get("speedup_vs_model") or 0)))
    board = table(title, ["source", "op", "result", "pass", "best ms", "mode", "vs Model", "vs Reference",
                          "of limit", "promoted", "tried", "stop / error"],
                  [[r["source"], r["op"], _result(r), f"{r.get('passed', 0)}", fmt_num(r.get("best_time_ms"), ".4f"),
                    "interpreter" if interpreted else (best_speedup(r) or {}).get("timing_mode") or "-", _vs_model(r),
                    "-" if interpreted else _ratio(r.get("speedup_vs_reference")),
                    fmt_num(r.get("fraction_of_limit"), ".2f"), "yes" if r.get("promoted") else "no",
                    r.get("submitted", 0), _stop_text(r)] for r in ordered])
    if interpreted:
        board.caption = INTERPRETED_NOTE
    return board


def _ratio(value: float | None) -> str:
    """A speedup; one that rounds to 0.00 is shown as under 0.01, not as nothing at all."""
    if value is None:
        return "-"
    return f"{value:.2f}" if value >= 0.005 else "<0.01"


def _result(row: dict) -> str:
    """The status, and where a pass rests on the .pt alone, that it does (farm.evaluate.verified)."""
    if row.get("unseen_inputs") is False and row["status"] in ("succeeded", "skipped"):
        return f"{row['status']} (.pt only: NO unseen inputs)"
    return row["status"]


def _stop_text(row: dict) -> str:
    """Why a failed op failed (its stop reason is only 'error'), why nothing could seed it
    (no_seed), else why its search stopped."""
    stop, error = row.get("stop_reason") or "", row.get("error") or ""
    if row["status"] == "failed" or (row["status"] == "skipped" and row.get("previous") == "error"):
        return f"{stop or 'error'}: {error or 'no reason recorded'}"[:200]
    if stop == "no_seed" and error:
        return f"no_seed: {error.removeprefix('no generator seeds this op: ')[:160]}"
    if row["status"] == "zero_pass" and error:
        return f"{stop}: {error.removeprefix('no passing kernel: ')}"[:200]
    return stop or error[:60]


def reference_failures(made: list[dict]) -> list[dict]:
    """Leaderboard rows for the ops that got no reference data, so they count as failed."""
    return [{"source": r["source"], "op": r["op_name"], "status": "failed", "stop_reason": f"reference ({r.get('stage')})",
             "error": error_line(r.get("error")), "submitted": 0, "passed": 0} for r in made if not r.get("success")]


def _vs_model(row: dict) -> str:
    """The op's best speedup (farm.search.results.best_speedup); a ratio not shown faster with
    confidence is not reported as a speedup."""
    best = best_speedup(row) or {}
    ratio = best.get("speedup_vs_model")
    if ratio is None:
        return "-"
    if not best.get("retimed", True):
        return f"{ratio:.2f} (not re-timed)"
    if row.get("status") == "succeeded" and not row.get("promoted") and "not faster" in row.get("promotion", ""):
        return f"not faster ({_ratio(ratio)})"
    return _ratio(ratio)


def run_sources(source: list[str] | None, ops: list[str] | None) -> list[str]:
    """`farm run`'s sources: those given, else those its --ops name as source/op, else demo."""
    if source:
        return list(dict.fromkeys(source))
    named = [o.split("/", 1)[0] for o in ops or [] if "/" in o]
    return list(dict.fromkeys(named)) or ["demo"]


@handle_errors
def run_local(
    ctx: typer.Context,
    source: Annotated[Optional[list[str]], typer.Option(
        "--source", "-s", help="Source to run end to end (repeatable) [the sources --ops names as source/op, else demo].")] = None,
    ops: OpsOpt = None,
    target: TargetOpt = "auto",
    max_tasks: MaxTasksOpt = 12,
    generators: GeneratorsOpt = DEFAULT_CHAIN,
    run: Annotated[Optional[str], typer.Option(help="Run name [local-<source>[-<source>...]-<target>].")] = None,
    store: StoreOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Search again even where this run already finished.")] = False,
    page: bool = report_cmd.ReportOption,
    profile: ProfileOpt = "farm",
    as_json: bool = JsonOption,
) -> None:
    """Reference data then search for every op of a source (or those --ops names), in this
    process: no Redis, no S3."""
    s = settings(ctx, {"store": store})
    use_frontend_setting(s)
    st = open_store(s.store, s)
    spec = usable_device(target, default_target="cuda", option="--target", notify=stand_in_notice)
    shapes = "small" if spec.target.interpret else "bench"
    # every option is checked before the reference stage: a typo costs no minutes of work
    gens = make_generators(generators, s, spec.target.interpret)
    config = SearchConfig(max_tasks=max_tasks, max_concurrent=1, chunk_size=4, generators=tuple(g.name for g in gens))
    evaluation = EvalOptions(profile=profiles.get(profile).name)
    sources = run_sources(source, ops)
    refs = taskfiles.find_tasks(s, sources, ops)
    name = run or f"local-{'-'.join(sources)}-{spec.target.name}"
    validate_name(name, "run", "--run")
    with progress_bar(not as_json) as progress:
        bar = progress.add_task(f"reference data on {spec.label}", total=len(refs))
        made = generate_references(refs, st, spec, s.reference.seed, shapes, s.reference.timeout_s,
                                   on_done=lambda r: progress.update(bar, advance=1),
                                   seed_sets=s.reference.seed_sets, jobs=reference_jobs(s.reference.jobs, spec),
                                   cases=reference_cases(s.reference.cases, spec), ship_max_mb=s.reference.ship_max_mb)
    failed = reference_failures(made)
    cause = common_cause(failed, len(made))
    if cause:
        say(f"error: {cause}", style="bold red")
    elif failed:
        say(f"no reference data for {', '.join(r['source'] + '/' + r['op'] for r in failed)}: "
            "those ops are not searched", style="yellow")
    ok = {(r["source"], r["op_name"]) for r in made if r.get("success")}
    with progress_bar(not as_json) as progress:
        bar = progress.add_task("search", total=len(ok))
        # errors are searched again each time: what failed may have been the machine (a full disk)
        search = SearchContext(st, name, spec.target.name, [spec], gens, config, evaluation, s)
        rows = search_by_headroom([r for r in refs if (r.source, r.op) in ok], search, spec.target.interpret,
                                  retry_errors=True, force=force, on_op=op_progress(progress, bar, len(ok), as_json))
    _report(failed + rows, name, st, as_json, page, evaluation.profile, s=s, interpreted=spec.target.interpret)
