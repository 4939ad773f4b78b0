"""Throughput of a batch search, before and after the pipeline (issue #17), in one run.

The same batch search of the bundled corpus (same ops, budgets, generators, seed) twice in this
process tree: `before` as the farm searched before issue 17's work (compile-ahead off,
compile_workers 0: the sequential path, one candidate at a time on the device; and full_timing:
every candidate's whole per-call pass and every comparison round) and `after` with the defaults. Each phase gets a Triton cache of its
own (empty at its start), so neither reuses the other's compiled kernels; `after` also searches
--ops-per-device ops at once on the device (farm.search.batch). Per phase and per op:
candidates per device-minute (candidates / the op's device-minutes: its wall minutes, shared
out among the ops searching at the same time), the device busy fraction
(seconds inside the candidates' timed kernels over wall time, as bench/results/perf_h100/NOTES-2026-11-21.md
measured it, and the share of wall time the device was held at all, farm.evaluate.lease), the shares in
timing, verification and idle; per candidate (matched across phases by normalised source) the
verdict and the timing median with its spread. Writes throughput_<device>.json and .md to OUT.

usage (repository root):
    python bench/throughput_gpu.py OUT                          # cuda:0, demo and sglang, 8 candidates per op
    python bench/throughput_gpu.py OUT --phase before; python bench/throughput_gpu.py OUT --phase after
    python bench/throughput_gpu.py OUT --sources demo --max-tasks 8 --compile-workers 4
    python bench/throughput_gpu.py OUT --device cpu --quick     # the CPU interpreter, for a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.config import load_settings  # noqa: E402
from farm.corpus import tasks as taskfiles  # noqa: E402
from farm.evaluate import lease as device_lease  # noqa: E402
from farm.evaluate.options import EvalOptions  # noqa: E402
from farm.generators import load_generator  # noqa: E402
from farm.reference.generate import generate_references  # noqa: E402
from farm.search.batch import search_batch  # noqa: E402
from farm.search.context import SearchConfig, SearchContext  # noqa: E402
from farm.search.database import normalized_hash  # noqa: E402
from farm.storage import open_store  # noqa: E402
from farm.targets import resolve_device  # noqa: E402

PHASES = ("before", "after")
CACHE_VARS = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def fresh_caches(root: Path, name: str) -> None:
    """Empty compile caches for what runs next: the runners inherit TRITON_* and TORCH* variables."""
    for var in CACHE_VARS:
        folder = root / name / var.lower()
        folder.mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(folder)


def kernel_seconds(candidates: list[dict]) -> float:
    """Seconds the device spent inside candidates' timed calls (per-call figure x reps, plus
    the compared rounds' calls): the numerator of the busy fraction (bench/results/perf_h100/NOTES-2026-11-21.md)."""
    total = 0.0
    for c in candidates:
        t = c.get("timing") or {}
        if t.get("median_ms"):
            total += t["median_ms"] * (t.get("reps", 0) + 3) / 1e3
    return total


def device_minutes(spans: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each op's share of the device's wall time, in minutes: while k ops search on the device
    at once, each is charged 1/k of it (one op at a time: its own wall time). The shares add up
    to the batch's busy wall time, so candidates per device-minute stay comparable."""
    edges = sorted({t for span in spans.values() for t in span})
    out = {k: 0.0 for k in spans}
    for a, b in zip(edges, edges[1:]):
        active = [k for k, (s, e) in spans.items() if s <= a and e >= b]
        for k in active:
            out[k] += (b - a) / len(active) / 60
    return out


def run_phase(name: str, refs, store, spec, gens, config: SearchConfig, evaluation: EvalOptions, root: Path,
              ops_per_device: int = 1) -> dict:
    fresh_caches(root, name)
    lease = device_lease.for_device(spec.label)
    marks: dict[str, dict] = {}

    def on_op(phase: str, row: dict) -> None:
        key = f"{row['source']}/{row['op']}"
        if phase == "start":
            marks[key] = {"t0": time.monotonic(), "held0": lease.seconds()}
        elif phase == "done" and key in marks:
            m = marks[key]
            m["span"] = (m["t0"], time.monotonic())
            m["wall_s"] = time.monotonic() - m.pop("t0")
            m["held"] = device_lease.shares(m.pop("held0"), lease.seconds(), m["wall_s"])
            print(f"[{name}] {key:48} {row.get('status', ''):9} {row.get('submitted', 0):3d} candidates "
                  f"in {m['wall_s']:6.1f} s" + (f": {row['error'][:300]}" if row.get("error") else ""), flush=True)

    t0 = time.monotonic()
    rows = search_batch(refs, SearchContext(store, name, spec.target.name, [spec], gens, config, evaluation),
                        on_op=on_op, ops_per_device=ops_per_device)
    wall = time.monotonic() - t0
    minutes = device_minutes({k: m["span"] for k, m in marks.items() if "span" in m})
    ops = []
    for row in rows:
        key = f"{row['source']}/{row['op']}"
        prefix = f"runs/{name}/{row['source']}/{row['op']}"
        if key not in marks or not store.exists(f"{prefix}/report.json"):
            ops.append({"op": key, "status": row.get("status"), "error": row.get("error", "")[:300]})
            continue
        report = json.loads(store.get_bytes(f"{prefix}/report.json"))
        cands = report["candidates"]
        wall_s = marks[key]["wall_s"]
        per = {}
        for c in cands:
            source = store.get_bytes(f"{prefix}/candidates/{c['id']}.py").decode()
            per[normalized_hash(source)] = {"verdict": c["verdict"], "time_ms": c.get("time_ms"),
                                            "rse": (c.get("timing") or {}).get("rse"), "id": c["id"],
                                            "generator": c["generator"],
                                            "reason": (c.get("error") or "")[:300]}  # why a verdict changed
        ops.append({"op": key, "status": row.get("status"), "candidates": len(cands), "wall_s": wall_s, "_cands": cands,
                    "device_minutes": minutes[key],
                    "candidates_per_device_minute": len(cands) / minutes[key] if minutes[key] else 0.0,
                    "kernel_busy_fraction": kernel_seconds(cands) / (minutes[key] * 60) if minutes[key] else 0.0,
                    "held_fraction": 1.0 - marks[key]["held"]["idle"], "share": marks[key]["held"],
                    "best_time_ms": row.get("best_time_ms"), "per_candidate": per,
                    "stage_median_s": stage_medians(cands),
                    "confirm_s": (report.get("confirmation") or {}).get("seconds")})
    done = [o for o in ops if "wall_s" in o]
    total = sum(o["candidates"] for o in done)
    stages = stage_medians([c for o in done for c in o.pop("_cands")]) if done else {}
    return {"phase": name, "compile_workers": evaluation.compile_workers, "ops_per_device": ops_per_device,
            "wall_s": wall, "ops": ops,
            "median_candidates_per_device_minute": _median([o["candidates_per_device_minute"] for o in done]),
            "batch_candidates_per_device_minute": total / (wall / 60) if wall else 0.0,
            "median_kernel_busy_fraction": _median([o["kernel_busy_fraction"] for o in done]),
            "median_held_fraction": _median([o["held_fraction"] for o in done]),
            "median_share": {p: _median([o["share"][p] for o in done]) for p in ("timing", "verification", "idle")},
            "stage_median_s": stages}


def stage_medians(cands: list[dict]) -> dict[str, float]:
    """Median seconds per evaluator stage over candidates: where a candidate's device-minute went
    (timing stays as it is, so a pipeline can only take the other stages off the device's path)."""
    stages = sorted({k for c in cands for k in (c.get("stage_s") or {})})
    return {k: _median([c["stage_s"][k] for c in cands if k in (c.get("stage_s") or {})]) for k in stages}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def compare(before: dict, after: dict) -> dict:
    """Per op: the throughput ratio; per candidate seen in both phases: verdicts and timings."""
    b_ops = {o["op"]: o for o in before["ops"] if "wall_s" in o}
    out, ratios, verdicts_same, verdicts_diff, timing_rows = [], [], 0, [], []
    for a in after["ops"]:
        b = b_ops.get(a["op"])
        if b is None or "wall_s" not in a:
            continue
        before_rate = b["candidates_per_device_minute"]
        ratio = a["candidates_per_device_minute"] / before_rate if before_rate else None
        if ratio:
            ratios.append(ratio)
        shared = set(a["per_candidate"]) & set(b["per_candidate"])
        for h in sorted(shared):
            x, y = b["per_candidate"][h], a["per_candidate"][h]
            if x["verdict"] == y["verdict"]:
                verdicts_same += 1
            else:
                verdicts_diff.append({"op": a["op"], "before": x, "after": y})
            if x["time_ms"] and y["time_ms"]:
                spread = max(x["rse"] or 0, y["rse"] or 0)
                rel = y["time_ms"] / x["time_ms"] - 1
                timing_rows.append({"op": a["op"], "before_ms": x["time_ms"], "after_ms": y["time_ms"],
                                    "rel_change": rel, "rse": spread})
        out.append({"op": a["op"], "ratio": ratio, "shared_candidates": len(shared)})
    rel = [abs(r["rel_change"]) for r in timing_rows]
    return {"ops": out, "median_ratio": _median(ratios), "verdicts_same": verdicts_same,
            "verdicts_changed": verdicts_diff, "timings": timing_rows,
            "median_abs_timing_change": _median(rel),
            "timings_outside_3x_rse": sum(1 for r in timing_rows if abs(r["rel_change"]) > max(3 * r["rse"], 0.05))}


def markdown(doc: dict) -> str:
    b, a, c = doc["before"], doc["after"], doc["comparison"]
    fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)  # noqa: E731
    cfg = doc["config"]
    lines = [f"Device: {doc.get('device_name') or doc['device']}; ops: {len(doc['ops'])}; "
             f"budget {cfg['max_tasks']} candidates, generators {','.join(cfg['generators'])}, seed {cfg['seed']}, "
             f"{cfg['max_concurrent']} in flight; before: sequential, full per-call pass and every round for every "
             f"candidate; after: {a['compile_workers']} compile-ahead runners per op, "
             f"{a['ops_per_device']} ops at once on the device, the timing economy on.", "",
             "| | before (sequential) | after (pipeline) |", "|---|---|---|"]
    rows = (("candidates per device-minute, median over ops", "median_candidates_per_device_minute", "{:.1f}"),
            ("candidates per device-minute, whole batch", "batch_candidates_per_device_minute", "{:.1f}"),
            ("device busy (timed kernels), median", "median_kernel_busy_fraction", "{:.4%}"),
            ("device held (lease), median", "median_held_fraction", "{:.1%}"),
            ("batch wall time, s", "wall_s", "{:.0f}"))
    for label, key, f in rows:
        lines.append(f"| {label} | {fmt(b[key], f)} | {fmt(a[key], f)} |")
    for p in ("timing", "verification", "idle"):
        lines.append(f"| share of wall time: {p}, median | {fmt(b['median_share'][p], '{:.1%}')} | "
                     f"{fmt(a['median_share'][p], '{:.1%}')} |")
    for stage in sorted(set(b.get("stage_median_s", {})) | set(a.get("stage_median_s", {}))):
        lines.append(f"| candidate stage {stage}, median s | {fmt(b.get('stage_median_s', {}).get(stage), '{:.3f}')} | "
                     f"{fmt(a.get('stage_median_s', {}).get(stage), '{:.3f}')} |")
    lines += ["", f"Median per-op ratio after/before: **{fmt(c['median_ratio'])}x**. Candidates judged in both "
              f"phases: {c['verdicts_same'] + len(c['verdicts_changed'])}, verdicts changed: "
              f"{len(c['verdicts_changed'])}; timings compared: {len(c['timings'])}, median |change| "
              f"{fmt(c['median_abs_timing_change'], '{:.2%}')}, outside max(3 x rse, 5%): "
              f"{c['timings_outside_3x_rse']}.",
              "", "| op | before cand/min | after cand/min | ratio | shared candidates |", "|---|---|---|---|---|"]
    b_ops = {o["op"]: o for o in b["ops"]}
    for row in c["ops"]:
        x, y = b_ops[row["op"]], next(o for o in a["ops"] if o["op"] == row["op"])
        lines.append(f"| {row['op']} | {x['candidates_per_device_minute']:.1f} "
                     f"| {y['candidates_per_device_minute']:.1f} "
                     f"| {fmt(row['ratio'])} | {row['shared_candidates']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--sources", nargs="+", default=["demo", "sglang"])
    ap.add_argument("--ops", nargs="*", default=None, help="source/op keys (default: every op of --sources)")
    ap.add_argument("--max-tasks", type=int, default=8)
    ap.add_argument("--max-concurrent", type=int, default=6, help="candidates in flight (both phases)")
    ap.add_argument("--compile-workers", type=int, default=-1, help="after: compile-ahead runners (-1: auto)")
    ap.add_argument("--ops-per-device", type=int, default=3, help="after: ops searched at once on the device")
    ap.add_argument("--generators", default="tune,port")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="two demo ops, 3 candidates, small shapes")
    ap.add_argument("--phase", choices=("both", *PHASES), default="both",
                    help="one phase only, merged into OUT's JSON (two device calls instead of one)")
    args = ap.parse_args()
    spec = resolve_device(args.device)
    if args.quick:
        args.sources, args.ops, args.max_tasks = ["demo"], args.ops or ["demo/row_sum", "demo/vector_add_scale"], 3
        args.max_concurrent = min(args.max_concurrent, 3)
    workers = args.compile_workers
    if workers < 0 and spec.target.interpret:
        workers = 1  # the automatic size is 0 on the interpreter: ask for one so that the path runs
    args.out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="farm-throughput-"))
    fresh_caches(root, "reference")
    settings, _ = load_settings(overrides={"corpus.tasks_dir": ""})
    store = open_store(f"file://{root / 'store'}")
    refs = [r for r in taskfiles.find_tasks(settings, args.sources) if not args.ops or r.key in args.ops]
    shapes = "small" if spec.target.interpret else "bench"
    made = generate_references(refs, store, spec, 0, shapes, 600, jobs=1 if spec.target.interpret else 4)
    ok = {(r["source"], r["op_name"]) for r in made if r.get("success")}
    refs = [r for r in refs if (r.source, r.op) in ok]
    gens = [load_generator(g, modes=("default",)) if g == "inductor" else load_generator(g)
            for g in args.generators.split(",")]
    base = SearchConfig(max_tasks=args.max_tasks, max_concurrent=args.max_concurrent, chunk_size=8,
                        generators=tuple(g.name for g in gens), seed=args.seed, early_stop=False)
    doc = {"device": spec.label, "ops": [r.key for r in refs],
           "config": vars(base) | {"generators": list(base.generators)},
           "reference_failures": [f"{r['source']}/{r['op_name']}: {r.get('error', '')[:200]}" for r in made
                                  if not r.get("success")]}
    name = f"throughput_{spec.target.name}"
    path = args.out / f"{name}.json"
    if args.phase != "both" and path.exists():  # the other phase, from an earlier call with the same options
        doc = {**json.loads(path.read_text()), **doc}
    for phase, n, k in zip(PHASES, (0, workers), (1, args.ops_per_device)):
        if args.phase not in ("both", phase):
            continue
        evaluation = EvalOptions(compile_workers=n, full_timing=phase == "before")
        doc[phase] = run_phase(phase, refs, store, spec, gens, base, evaluation, root, k)
        path.write_text(json.dumps(doc, indent=2, default=str))
    if not all(p in doc for p in PHASES):
        print(f"{args.phase} written to {path}; run the other phase with the same options to compare")
        return
    doc["device_name"] = _device_name(spec)
    doc["comparison"] = compare(doc["before"], doc["after"])
    path.write_text(json.dumps(doc, indent=2, default=str))
    (args.out / f"{name}.md").write_text(markdown(doc))
    print(markdown(doc))


def _device_name(spec) -> str:
    from farm.targets import device_name

    try:
        return device_name(spec)
    except Exception:  # noqa: BLE001 - a label is enough for the table
        return spec.label


if __name__ == "__main__":
    main()
