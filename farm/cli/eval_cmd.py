"""`farm eval`: the verdict on one candidate kernel."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from farm import corpus, manifest
from farm.backends import resolve_device
from farm.cli.common import FlushOpt, JsonOption, err, fmt_num, handle_errors, out, print_json, settings, table
from farm.errors import EXIT_FAILED, FarmError
from farm.evaluator import EvalSettings, Evaluator, describe_timing
from farm.reference import load_pt
from farm.storage import open_store
from farm.timing import check_flush


@handle_errors
def eval_candidate(
    ctx: typer.Context,
    candidate: Annotated[Path, typer.Option(help="Python file defining class ModelNew(nn.Module).")],
    task: Annotated[Optional[Path], typer.Option(help="Task file (instead of --source/--op).")] = None,
    source: Annotated[Optional[str], typer.Option(help="Source of the task in the corpus.")] = None,
    op: Annotated[Optional[str], typer.Option(help="Op name in the corpus.")] = None,
    ref_pt: Annotated[Optional[Path], typer.Option(help="Reference data file (.pt) to verify against.")] = None,
    store: Annotated[Optional[str], typer.Option(help="Store holding refs/<source>/<op>.pt [store].")] = None,
    target: Annotated[str, typer.Option(help="cuda, ascend, cpu, or auto (the accelerator present, else cpu).")] = "auto",
    device: Annotated[Optional[int], typer.Option(help="Device index on the target.")] = None,
    timing_method: Annotated[str, typer.Option(
        "--timing", help="events (device events, every target) or npu-profiler (Ascend: device time from "
                         "torch_npu's profiler, read in microseconds and reported in ms).")] = "events",
    flush: Annotated[str, FlushOpt] = "write",
    as_json: bool = JsonOption,
) -> None:
    """Verify and time a candidate in an isolated child process; exit 0 only on a pass."""
    s = settings(ctx, {"store": store})
    ref = _task_ref(s, task, source, op)
    if not candidate.is_file():
        raise FarmError(f"candidate file {candidate} (--candidate) does not exist")
    spec = resolve_device(target if device is None else f"{target}:{device}", default_target="cuda")
    data = _reference_data(s, ref, ref_pt)
    settings_ = EvalSettings.for_device(spec)
    if timing_method not in ("events", "npu-profiler"):
        raise FarmError(f"unknown timing method '{timing_method}' (--timing): use events or npu-profiler")
    if timing_method == "npu-profiler":
        if spec.backend.name != "ascend":
            raise FarmError("--timing npu-profiler needs --target ascend")
        settings_.timing["method"] = "npu_profiler"
    if check_flush(flush) != "write":
        if timing_method == "npu-profiler":
            raise FarmError("--flush clean does not go with --timing npu-profiler (its flush filter expects a write)")
        settings_.timing["flush"] = flush
    with Evaluator(ref, data, spec, settings_) as ev:
        result = ev.evaluate(candidate.read_text(errors="replace"), name=candidate.name)
    if as_json:
        print_json({"candidate": str(candidate), "task": ref.key, **result.as_dict()})
    else:
        _print(result, candidate, ref)
    if not result.passed:
        raise typer.Exit(EXIT_FAILED)


def _task_ref(s, task: Path | None, source: str | None, op: str | None) -> corpus.TaskRef:
    if task and (source or op):
        raise FarmError("give either --task or --source/--op, not both")
    if task:
        return corpus.ref_from_file(task, source or "local")
    if not (source and op):
        raise FarmError("name the task: --task FILE, or --source S --op OP")
    return corpus.find_tasks(s, [source], [op])[0]


def _reference_data(s, ref: corpus.TaskRef, ref_pt: Path | None) -> dict:
    if ref_pt:
        if not ref_pt.is_file():
            raise FarmError(f"reference file {ref_pt} (--ref-pt) does not exist")
        return load_pt(ref_pt)
    st = open_store(s.store, s)
    key = manifest.ref_key(ref.source, ref.op)
    if st.head(key) is None:
        raise FarmError(f"no reference data {key} in {st.url}: run `farm reference --source {ref.source} "
                        f"--ops {ref.op}` first, or pass --ref-pt")
    with tempfile.TemporaryDirectory(prefix="farm-eval-") as tmp:
        st.get_file(key, Path(tmp) / "ref.pt")
        return load_pt(Path(tmp) / "ref.pt")


def _print(result, candidate: Path, ref: corpus.TaskRef) -> None:
    colour = "green" if result.passed else "red"
    out.print(f"[bold {colour}]{result.verdict}[/] {candidate} on {result.device.get('name', '?')} ({ref.key})")
    if result.reason:
        out.print(f"  reason: {result.reason}", highlight=False)
    if result.outputs:
        out.print(table("outputs", ["output", "ok", "shape", "dtype", "max abs", "max rel", "reason"],
                        [[o["index"], o["ok"], o["shape"], o["dtype"], fmt_num(o["max_abs"]), fmt_num(o["max_rel"]),
                          o["reason"]] for o in result.outputs]))
    out.print(f"  timing: {describe_timing(result.timing)}")
    if result.passed:
        out.print(f"  fresh seeds checked: {result.seeds_checked}; Triton launches per forward: {result.launches} "
                  f"({', '.join(result.kernels)})")
        out.print(f"  speedup vs Model: {fmt_num(result.speedup_vs_model, '.2f')}x; "
                  f"vs Reference: {fmt_num(result.speedup_vs_reference, '.2f')}x"
                  + (" [yellow](suspicious: replay on fresh inputs before trusting it)[/]" if result.suspicious else ""))
    elif result.log and result.log.strip() != result.reason:
        err.print(result.log[-2000:], highlight=False, markup=False)
