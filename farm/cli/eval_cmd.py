"""`farm eval`: the verdict on one candidate kernel."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from farm.cli.common import (
    FlushOpt,
    JsonOption,
    TimingModeOpt,
    err,
    fmt_num,
    handle_errors,
    out,
    print_json,
    same_op,
    say,
    settings,
    table,
    use_frontend_setting,
)
from farm.corpus import tasks as taskfiles
from farm.errors import EXIT_FAILED, FarmError
from farm.evaluate import verified
from farm.evaluate.evaluator import EvalSettings, Evaluator, describe_timing
from farm.evaluate.timing import check_flush, check_mode
from farm.reference import cases as ref_cases
from farm.reference import folder as refolder
from farm.reference import manifest, secret_inputs
from farm.reference.generate import load_pt
from farm.storage import open_store
from farm.targets import available, resolve_device, usable_device


@handle_errors
def eval_candidate(
    ctx: typer.Context,
    candidate: Annotated[Path, typer.Option(help="Python file defining class ModelNew(nn.Module).")],
    task: Annotated[Optional[Path], typer.Option(
        "--task", "--task-file", "--benchmark-file", help="Task file (instead of --source/--op).")] = None,
    source: Annotated[Optional[str], typer.Option(help="Source of the task in the corpus.")] = None,
    op: Annotated[Optional[str], typer.Option(help="Op name in the corpus.")] = None,
    ref_pt: Annotated[Optional[Path], typer.Option(help="Reference data file (.pt) to verify against.")] = None,
    store: Annotated[Optional[str], typer.Option(help="Store holding refs/<source>/<op>.pt [store].")] = None,
    target: Annotated[str, typer.Option(help="cuda, ascend, cpu, or auto (the accelerator present, else cpu).")] = "auto",
    device: Annotated[Optional[int], typer.Option(min=0, help="Device index on the target.")] = None,
    timing_method: Annotated[str, typer.Option(
        "--timing", help="events (device events, every target) or npu-profiler (Ascend: device time from "
                         "torch_npu's profiler, read in microseconds and reported in ms).")] = "events",
    flush: Annotated[str, FlushOpt] = "write",
    profile: Annotated[str, typer.Option(
        "--profile", help="Evaluation rules: farm (default) or kernelbench (docs/evaluator.md).")] = "farm",
    timing_mode: Annotated[str, TimingModeOpt] = "auto",
    as_json: bool = JsonOption,
) -> None:
    """Verify and time a candidate in an isolated child process; exit 0 only on a pass."""
    s = settings(ctx, {"store": store})
    ref = _task_ref(s, task, source, op)
    if not candidate.is_file():
        raise FarmError(f"candidate file {candidate} (--candidate) does not exist")
    use_frontend_setting(s)
    resolve_device(target, default_target="cuda", option="--target")  # an unknown target names --target
    spec = usable_device(target if device is None else f"{target}:{device}", default_target="cuda",
                         option="--target" if device is None else "--device",
                         notify=lambda text: say(text, style="yellow"))
    settings_ = EvalSettings.for_device(spec, profile)  # every option checked before the .pt is read
    _profiler(timing_method, spec, settings_)
    settings_.mode = check_mode(timing_mode)
    if check_flush(flush) != "write":
        if timing_method != "events":
            raise FarmError(f"--flush clean does not go with --timing {timing_method} (its flush filter expects a "
                            "write)")
        settings_.timing["flush"] = flush
    data = _reference_data(s, ref, ref_pt)
    if ref_pt:
        same_op(ref, data, ref_pt, f"{task} (--task)" if task else f"the task {ref.key} (--source/--op)",
                source_too=task is None)
    with Evaluator(ref, data, spec, settings_, config=s) as ev:
        result = ev.evaluate(candidate.read_text(errors="replace"), name=candidate.name)
    if as_json:
        print_json({"candidate": str(candidate), "task": ref.key, **result.as_dict()})
    else:
        _print(result, candidate, ref)
    if not result.passed:
        raise typer.Exit(EXIT_FAILED)


def _profiler(method: str, spec, settings_: EvalSettings) -> None:
    """--timing: device events, or the device time of a target's profiler (Target.profiler:
    ascend's npu-profiler), which only that target's own device has."""
    owners = {t.profiler: t for t in available().values() if t.profiler}
    if method != "events" and method not in owners:
        raise FarmError(f"unknown timing method '{method}' (--timing): use {' or '.join(['events', *owners])}")
    if method == "events":
        return
    if spec.target.profiler != method:
        owner = owners[method]
        raise FarmError(f"--timing {method} needs --target {owner.name} on a host with {owner.hardware or 'its device'}")
    settings_.timing["method"] = method.replace("-", "_")



def _task_ref(s, task: Path | None, source: str | None, op: str | None) -> taskfiles.TaskRef:
    if task and (source or op):
        raise FarmError("give either --task or --source/--op, not both")
    if task:
        return taskfiles.ref_from_file(task, source or "local", settings=s)
    if not (source and op):
        raise FarmError("name the task: --task FILE, or --source S --op OP")
    return taskfiles.find_tasks(s, [source], [op], op_option="--op")[0]


def _reference_data(s, ref: taskfiles.TaskRef, ref_pt: Path | None) -> dict:
    st = open_store(s.store, s)  # also where secret input sets of reference-data-mode ops live
    if ref_pt:
        if not ref_pt.is_file():
            raise FarmError(f"reference file {ref_pt} (--ref-pt) does not exist")
        return refolder.load(ref_pt, st)  # secret input sets from its folder's .secrets/, else the store
    key = manifest.ref_key(ref.source, ref.op)
    if st.head(key) is None:
        raise FarmError(f"no reference data {key} in {st.url}: run `farm reference --source {ref.source} "
                        f"--ops {ref.op}` first, or pass --ref-pt")
    with tempfile.TemporaryDirectory(prefix="farm-eval-") as tmp:
        st.get_file(key, Path(tmp) / "ref.pt")
        return ref_cases.attach(st, secret_inputs.attach(st, load_pt(Path(tmp) / "ref.pt")))


def _print(result, candidate: Path, ref: taskfiles.TaskRef) -> None:
    colour = "green" if result.passed else "red"
    out.print(f"[bold {colour}]{result.verdict}[/] {candidate} on {result.device.get('name', '?')} ({ref.key})")
    if result.reason:
        out.print(f"  reason: {result.reason}", highlight=False)
    if result.outputs:
        out.print(table("outputs", ["output", "ok", "shape", "dtype", "max abs", "max rel", "reason"],
                        [[o["index"], o["ok"], o["shape"], o["dtype"], fmt_num(o["max_abs"]), fmt_num(o["max_rel"]),
                          o["reason"]] for o in result.outputs]))
    if result.frontend is not None:
        fe = result.frontend
        out.print(f"  frontend check: {'not configured' if not fe['ran'] else ('pass' if fe['ok'] else 'FAIL')}"
                  + (f" (triton-ascend {fe['triton_version']}: frontend, TTIR, Linalg ran; {fe['note']})"
                     if fe["ran"] else ""), highlight=False)
    no_device_timing = result.device.get("device_timing") is False
    out.print(f"  timing: {describe_timing(result.timing)}"
              + (" [yellow](CPU interpreter: no Ascend timing)[/]" if no_device_timing else ""))
    out.print(f"  sandbox: {result.sandbox}" + ("" if result.sandbox != "none" else
              " [yellow](no operating-system boundary: docs/evaluator.md, Sandbox)[/]"))
    if result.passed:
        unseen = verified.describe(result.verified, result.verified.get("checked"))
        out.print(f"  verified on unseen inputs: {unseen}", style=None if verified.unseen_checked(result.verified)
                  else "bold yellow", highlight=False)
        out.print(f"  Triton launches per forward: {result.launches} ({', '.join(result.kernels)})")
        comp = result.comparison
        out.print(f"  compared in {result.timing.get('mode')} mode ({result.timing.get('mode_reason')}); "
                  f"per call (flushed events): {fmt_num(result.timing.get('per_call_ms'), '.4f')} ms; "
                  f"of the physical limit: {fmt_num((result.limit or {}).get('fraction'), '.2f')}")
        for key in ("model", "reference"):
            if comp.get(key):
                c = comp[key]
                out.print(f"  vs {key.title()}: {c['ratio']:.3f}x (min {c['min']:.3f}, max {c['max']:.3f}, "
                          f"95% CI {c['ci_low']:.3f}-{c['ci_high']:.3f}, {c['rounds']} interleaved rounds)")
        _print_cases(result)
        out.print(f"  speedup vs Model: {fmt_num(result.speedup_vs_model, '.2f')}x; "
                  f"vs Reference: {fmt_num(result.speedup_vs_reference, '.2f')}x"
                  + (" [yellow](suspicious: replay on fresh inputs before trusting it)[/]" if result.suspicious else ""))
    elif result.log and result.log.strip() != result.reason:
        err.print(result.log[-2000:], highlight=False, markup=False)


def _print_cases(result) -> None:
    """The serving mix (farm.evaluate.mix_timing): one row per timed case, then its geomean."""
    rows = (result.timing or {}).get("cases") or []
    if len(rows) > 1:
        out.print(table("timed cases", ["case", "shape", "ms", "Model ms", "speedup"],
                        [[r["label"], " ".join(map(str, r["shape"])), fmt_num(r["time_ms"], ".4f"),
                          fmt_num(r["model_ms"], ".4f"), fmt_num(r["speedup"], ".3f")] for r in rows]))
    mix = (result.comparison or {}).get("mix")
    if mix:
        out.print(f"  serving mix: geomean {mix['ratio']:.3f}x over {mix['cases']} cases (95% CI "
                  f"{mix['ci_low']:.3f}-{mix['ci_high']:.3f})"
                  + (f"; slower than the Model at {', '.join(mix['slower'])}" if mix.get("slower") else ""))
