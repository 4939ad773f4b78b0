"""The farm against torch.compile over AKG's three original folders (docs/benchmarks.md; figures on docs/results.md).

Per op: reference data, the farm's search with its defaults (generators `tune,port,inductor`,
the default budget spent by headroom: farm.search.budget), then, in a fresh child on the device,
the original Model, torch.compile of the op's PyTorch truth (Reference, AKG's comparison class
where it runs here, or the PyTorch Model) and the farm's kernels, each in a CUDA graph
(do_bench_cudagraph: kernel against kernel), and the op's physical limit (farm.evaluate.limits).
A row per op is appended to OUT/rows.jsonl as soon as the op is timed (a cut-off run keeps
what it did; `--summarize` reads it), then OUT/summary.json and OUT/table.md:

    final = the promoted kernel where the search promoted one, else the original
    goals: final >= 0.97x compile on >= 95% of the ops with a PyTorch truth, >= 1.05x on a
           quarter of them; no zero_pass where compile compiles; median best/limit <= 1.5

usage (repository root, one H100, within ~9 minutes):
    python bench/compile_parity.py OUT --akg-root .ext/akg --deadline-s 500 [--ops vllm_torch/rms_norm ...]
        [--sources sglang vllm_triton vllm_torch] [--max-ops N] [--max-tasks 40] [--op-time-s 60]
    python bench/compile_parity.py OUT --summarize          # the table and goals of what OUT holds
On the CPU (`--device cpu`) everything runs but the timing (the interpreter times nothing real).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.cli.search import make_generators  # noqa: E402
from farm.config import load_settings  # noqa: E402
from farm.corpus import tasks as taskfiles  # noqa: E402
from farm.generators import DEFAULT_CHAIN  # noqa: E402
from farm.reference.generate import generate_references  # noqa: E402
from farm.runtime.children import run_in_child  # noqa: E402
from farm.search.budget import search_by_headroom  # noqa: E402
from farm.search.context import SearchConfig, SearchContext  # noqa: E402
from farm.search.results import op_prefix  # noqa: E402
from farm.storage import open_store  # noqa: E402
from farm.targets import resolve_device  # noqa: E402

SOURCES = ("sglang", "vllm_triton", "vllm_torch")  # the three original folders (docs/corpus.md)
RUN = "parity"


class Deadline(KeyboardInterrupt):
    """The run's deadline: the farm stops as on Ctrl-C (checkpoints kept, children ended)."""


def time_child(report, task_path: str, source: str, shapes: str, reference: str | None, best: str | None,
               promoted: str | None, device: str) -> dict:
    """In a child on the device: original, compile of the truth, best and promoted kernels, each
    in a CUDA graph, and the limit. Figures in ms; an error in place of a figure says why."""
    import importlib.util

    import torch

    from farm.corpus.inputs import draw_init_inputs, draw_inputs
    from farm.evaluate import limits
    from farm.runtime.tensors import seed_all, to_device

    report("load")
    ref = taskfiles.ref_from_file(task_path, source=source)
    task = taskfiles.load_task(ref, shapes, reference=reference)
    init = draw_init_inputs(task, 0)
    dev = "cpu" if device == "cpu" else "cuda"
    inputs = to_device(draw_inputs(task, 0), dev)
    out: dict = {"mode": task.mode, "truth": task.truth_cls.__name__ if task.mode != "reference-data" else None}

    def build(cls):
        seed_all(0)
        return cls(*init).to(dev).eval()

    def timed(name: str, make) -> None:
        report(name)
        try:
            model = make()
            with torch.no_grad():
                fn = lambda: model(*inputs)  # noqa: E731
                fn(), fn()  # compiles (torch.compile, Triton) before the graph is captured
                if dev == "cpu":
                    out[f"{name}_ms"], out[f"{name}_error"] = None, "cpu: the interpreter is not timed"
                    return
                import triton.testing as tt

                out[f"{name}_ms"] = tt.do_bench_cudagraph(fn, rep=50, return_mode="median")
        except Exception as exc:  # noqa: BLE001 - a figure that cannot be had says why
            out[f"{name}_ms"], out[f"{name}_error"] = None, f"{type(exc).__name__}: {str(exc)[:300]}"

    def candidate(path: str):
        spec = importlib.util.spec_from_file_location(f"farm_parity_{Path(path).stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return build(module.ModelNew)

    timed("original", lambda: build(task.model_cls))
    if out["truth"]:
        timed("compile", lambda: torch.compile(build(task.truth_cls)) if dev != "cpu" else build(task.truth_cls))
    else:
        out["compile_ms"], out["compile_error"] = None, "no PyTorch truth (reference-data mode)"
    if best:
        timed("best", lambda: candidate(best))
    if promoted:
        timed("promoted", lambda: candidate(promoted))
    with torch.no_grad():
        outputs = build(task.model_cls)(*inputs)
    nbytes = sum(t.numel() * t.element_size() for t in _tensors(inputs) + _tensors(outputs))
    flops, dtype = limits.op_work(task)
    floor = None if dev == "cpu" else _floor(device)
    lim = limits.physical_limit(nbytes, floor, "graph", None, flops, dtype)
    out["limit_ms"], out["limit_bound"] = (lim or {}).get("limit_ms"), (lim or {}).get("bound")
    if lim is None:
        out["limit_error"] = limits.NOT_MEANINGFUL if dev == "cpu" else "the device floor could not be measured"
    return out


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _floor(device: str) -> dict | None:
    """The evaluator's figures for this device kind (cached on disk by the search), else measured here."""
    from farm.evaluate import floor, limits, timing
    from farm.targets import device_name

    spec = resolve_device(device)
    return limits.cached_floor(device_name(spec), lambda: floor.device_floor(timing.DeviceTimer(spec)))


# ---------------------------------------------------------------- one op's row


def op_row(store_root: Path, ref, row: dict, shapes: str, device: str) -> dict:
    """What the search found (its report) and the child's timings, as one row."""
    prefix = store_root / op_prefix(RUN, ref.source, ref.op)
    report = json.loads((prefix / "report.json").read_text()) if (prefix / "report.json").is_file() else {}
    best = report.get("best") or {}
    best_path = prefix / "candidates" / f"{best['id']}.py" if best.get("id") else None
    promoted = best_path if (report.get("promotion") or {}).get("allowed") else None
    out = {"op": ref.key, "status": row.get("status") if row.get("status") != "skipped" else report.get("status"),
           "stop_reason": row.get("stop_reason") or report.get("stop_reason"), "error": row.get("error", ""),
           "submitted": row.get("submitted"), "budget": row.get("budget"), "found_by": _found_by(report, best),
           "promoted": bool(promoted), "promotion": ((report.get("promotion") or {}).get("reason") or "")[:300],
           "search_best_ms": best.get("time_ms"),
           "search_timing_mode": (best.get("timing") or {}).get("mode")}
    reference = _reference_class(open_store(f"file://{store_root}"), ref)
    outcome = run_in_child(time_child, (str(ref.path), ref.source, shapes, reference,
                                        str(best_path) if best_path else None, str(promoted) if promoted else None,
                                        device), timeout_s=240, env=resolve_device(device).child_env())
    if outcome.ok:
        out.update(outcome.value)
    else:
        out["timing_error"] = f"{outcome.status} in {outcome.stage}: {outcome.error.strip().splitlines()[-1:]}"
    final = out.get("promoted_ms") or out.get("original_ms")
    out["final_ms"] = final
    out["final_vs_compile"] = out["compile_ms"] / final if final and out.get("compile_ms") else None
    best_ms = out.get("best_ms") or out.get("original_ms")
    out["best_vs_limit"] = best_ms / out["limit_ms"] if best_ms and out.get("limit_ms") else None
    return out


def _found_by(report: dict, best: dict) -> str | None:
    """The best's generator, and the generator that seeded its lineage where that differs."""
    if not best:
        return None
    seeds = {c["lineage"]: c["generator"] for c in report.get("candidates", []) if c.get("generation") == 0}
    root = seeds.get(best.get("lineage"))
    return best["generator"] if root in (None, best["generator"]) else f"{best['generator']} on a {root} seed"


def _reference_class(store, ref) -> str | None:
    """The truth the reference data was made with (AKG's comparison class where it runs here)."""
    from farm.reference import manifest

    for entry in manifest.entries(store).values():
        if entry["source"] == ref.source and entry["op_name"] == ref.op:
            return entry.get("reference_class")
    return None


# ---------------------------------------------------------------- summary


def summarize(rows: list[dict]) -> dict:
    last = {r["op"]: r for r in rows}  # a later row of an op (its second pass) replaces the first
    rows = list(last.values())
    truth = [r for r in rows if r.get("truth") and r.get("final_vs_compile") is not None]
    ratios = [r["final_vs_compile"] for r in truth]
    compiled = [r for r in rows if r.get("truth") and r.get("compile_ms") is not None]
    zero = [r["op"] for r in compiled if r.get("status") == "zero_pass"]
    limits_ = [r["best_vs_limit"] for r in rows if r.get("best_vs_limit")]
    at_least = sum(1 for x in ratios if x >= 0.97)
    faster = sum(1 for x in ratios if x >= 1.05)
    median_limit = statistics.median(limits_) if limits_ else None
    goals = {"ge_0.97x_compile": f"{at_least}/{len(truth)}", "ge_1.05x_compile": f"{faster}/{len(truth)}",
             "zero_pass_where_compile_compiles": zero, "median_best_over_limit": median_limit,
             "met": bool(truth) and at_least >= 0.95 * len(truth) and faster >= 0.25 * len(truth) and not zero
             and median_limit is not None and median_limit <= 1.5}
    line = (f"{len(rows)} ops, {len(truth)} with a PyTorch truth timed: final >= 0.97x compile on {at_least}/"
            f"{len(truth)}, >= 1.05x on {faster}/{len(truth)}; zero_pass where compile compiles: {len(zero)}; "
            f"median best/limit {median_limit:.2f}" if median_limit else
            f"{len(rows)} ops, {len(truth)} with a PyTorch truth timed: final >= 0.97x compile on {at_least}/"
            f"{len(truth)}, >= 1.05x on {faster}/{len(truth)}; zero_pass where compile compiles: {len(zero)}; "
            "median best/limit: no limit measured")
    return {"ops": len(rows), "goals": goals, "line": line + ("; goals met" if goals["met"] else "; goals not met")}


def table(rows: list[dict]) -> str:
    def ms(v):
        return f"{v * 1e3:.2f}" if isinstance(v, (int, float)) else "-"

    def x(v):
        return f"{v:.2f}x" if isinstance(v, (int, float)) else "-"

    last = {r["op"]: r for r in rows}
    out = ["| op | status | original µs | compile µs | best µs | final µs | final/compile | limit µs | best/limit "
           "| found by |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in last.values():
        out.append(f"| {r['op']} | {r.get('status')} ({r.get('stop_reason')}) | {ms(r.get('original_ms'))} | "
                   f"{ms(r.get('compile_ms'))} | {ms(r.get('best_ms'))} | {ms(r.get('final_ms'))} | "
                   f"{x(r.get('final_vs_compile'))} | {ms(r.get('limit_ms'))} | {x(r.get('best_vs_limit'))} | "
                   f"{r.get('found_by') or '-'} |")
    return "\n".join(out)


def finish(out: Path) -> dict:
    path = out / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    summary = summarize(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "table.md").write_text(table(rows) + "\n\n" + summary["line"] + "\n")
    print(table(rows))
    print(summary["line"])
    return summary


# ---------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--akg-root", help="AKG checkout, its akg_agents/ or thirdparty/ (corpus.akg_root)")
    ap.add_argument("--sources", nargs="+", default=list(SOURCES))
    ap.add_argument("--ops", nargs="+", help="source/op names (a subset)")
    ap.add_argument("--max-ops", type=int, help="the first N ops (in folder order) of what is selected")
    ap.add_argument("--max-tasks", type=int, default=SearchConfig.max_tasks, help="candidates per op (default: the farm's)")
    ap.add_argument("--op-time-s", type=float, default=60.0, help="search time per op and pass (checked between chunks)")
    ap.add_argument("--deadline-s", type=float, default=500.0, help="no new work after this; the summary is written")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--summarize", action="store_true", help="only the table and goals of OUT/rows.jsonl")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        finish(args.out)
        return
    started = time.monotonic()

    def alarm(signum, frame):
        raise Deadline()

    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, args.deadline_s)
    try:
        run(args)
    except (Deadline, KeyboardInterrupt):
        print(f"deadline after {time.monotonic() - started:.0f} s: the rows so far are in {args.out / 'rows.jsonl'}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    finish(args.out)


def run(args) -> None:
    overrides = {"corpus.akg_root": args.akg_root} if args.akg_root else {}
    settings, _ = load_settings(overrides=overrides)
    refs = taskfiles.find_tasks(settings, args.sources)
    if args.ops:
        refs = [r for r in refs if r.key in set(args.ops)]
    refs = refs[:args.max_ops] if args.max_ops else refs
    spec = resolve_device(args.device)
    shapes = "small" if spec.target.interpret else "bench"
    store_root = args.out / "store"
    store = open_store(f"file://{store_root}")
    print(f"{len(refs)} ops on {spec.label} at {shapes} shapes")
    made = generate_references(refs, store, spec, 0, shapes, 240.0, seed_sets=2,
                               jobs=1 if spec.target.interpret else 4)
    ok = {(m["source"], m["op_name"]) for m in made if m.get("success")}
    rows_path = args.out / "rows.jsonl"
    for m in made:
        if not m.get("success"):
            _append(rows_path, {"op": f"{m['source']}/{m['op_name']}", "status": "failed",
                                "error": f"reference: {str(m.get('error'))[-300:]}"})
    todo = [r for r in refs if (r.source, r.op) in ok]
    by_key = {r.key: r for r in todo}
    gens = make_generators(DEFAULT_CHAIN, None, spec.target.interpret)
    config = SearchConfig(max_tasks=args.max_tasks, max_concurrent=1, generators=tuple(g.name for g in gens),
                          time_budget_s=args.op_time_s)

    def on_op(phase: str, row: dict) -> None:
        if phase in ("done", "more", "skipped"):
            ref = by_key[f"{row['source']}/{row['op']}"]
            _append(rows_path, op_row(store_root, ref, row, shapes, args.device))
            print(f"{ref.key}: {row.get('status')}", flush=True)

    search_by_headroom(todo, SearchContext(store, RUN, spec.target.name, [spec], gens, config), spec.target.interpret,
                       retry_errors=True, on_op=on_op)


def _append(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")


if __name__ == "__main__":
    main()
