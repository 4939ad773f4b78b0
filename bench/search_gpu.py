"""Search benchmarks on a GPU (run on the device machine from the repository root).

perf: for every task of the given sources, target cuda: reference data, a farm search, and the
      best kernel against the original Model, Reference in eager mode and
      torch.compile(Reference, mode="max-autotune"), all timed the same way (farm.evaluate.timing); for
      memory-bound tasks the achieved bandwidth (input + output bytes over the best time) as a
      fraction of the device's measured copy bandwidth; device busy fraction and candidates
      per device-minute of each search.
grid: every point of tune's knob space for some tasks, measured by the evaluator: the table
      that bench/search_replay.py replays to compare farm search with random search.

usage: python bench/search_gpu.py perf OUT --sources demo sglang --max-tasks 24 --generators tune,port [--flush clean]
       python bench/search_gpu.py grid OUT --ops demo/row_sum sglang/triton_tanh
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.config import load_settings  # noqa: E402
from farm.corpus import tasks as taskfiles  # noqa: E402
from farm.evaluate import timing
from farm.evaluate.options import EvalOptions  # noqa: E402
from farm.generators import load_generator  # noqa: E402
from farm.generators.base import model_as_candidate  # noqa: E402
from farm.generators.tune import grid as tune_grid  # noqa: E402
from farm.reference.generate import generate_references  # noqa: E402
from farm.runtime.children import run_in_child  # noqa: E402
from farm.search.batch import load_reference  # noqa: E402
from farm.search.context import SearchConfig, SearchContext  # noqa: E402
from farm.search.controller import search_op  # noqa: E402
from farm.storage import open_store  # noqa: E402
from farm.targets import resolve_device  # noqa: E402

SPEC = resolve_device("cuda:0")
LARGE_BYTES = 64 * 2**20  # "large" memory-bound task: at least this much traffic


def copy_bandwidth(flush: str = "write") -> float:
    """Bytes read + written per second by a large device-to-device copy."""
    import torch

    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    stats = timing.measure(lambda: dst.copy_(src), timing.DeviceTimer(SPEC, flush), min_reps=20)
    return 2 * src.numel() / (stats.median_ms / 1e3)


def _nbytes(values) -> int:
    import torch

    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
        elif isinstance(v, (list, tuple)):
            total += _nbytes(v)
    return total


def compiled_reference_child(report, ref: taskfiles.TaskRef, pt_path: str, flush: str = "write") -> dict:
    """In a child: torch.compile(Reference, mode="max-autotune") timed like every candidate."""
    import torch

    from farm.reference.generate import load_pt
    from farm.runtime.tensors import to_device

    data = load_pt(pt_path)
    task = taskfiles.load_task(ref, data.get("shapes", "bench"))
    module = task.truth_cls(*data["init_inputs"]).cuda().eval()
    compiled = torch.compile(module, mode="max-autotune")
    inputs = to_device(list(data["inputs"]), "cuda")
    started = time.time()
    with torch.no_grad():
        compiled(*inputs)
        torch.cuda.synchronize()
        compile_s = time.time() - started
        stats = timing.measure(lambda: compiled(*inputs), timing.DeviceTimer(SPEC, flush))
    return {"compile_ms": stats.median_ms, "compile_time_s": compile_s}


def busy(report: dict, wall_s: float) -> dict:
    kernel_ms = sum((c["timing"]["median_ms"] * (c["timing"]["reps"] + 3)) for c in report["candidates"] if c.get("timing"))
    return {"wall_s": wall_s, "kernel_s": kernel_ms / 1e3, "busy_fraction": kernel_ms / 1e3 / wall_s if wall_s else 0,
            "candidates_per_device_minute": len(report["candidates"]) / (wall_s / 60) if wall_s else 0}


def perf(out: Path, sources: list[str], max_tasks: int, generators: str, only: list[str] | None = None,
         flush: str = "write") -> None:
    settings, _ = load_settings()
    store = open_store(f"file://{tempfile.mkdtemp(prefix='farm-bench-')}")
    refs = [r for r in taskfiles.find_tasks(settings, sources) if not only or r.key in only]
    made = {(r["source"], r["op_name"]): r for r in generate_references(refs, store, SPEC, 0, "bench", 600)}
    copy_bw = copy_bandwidth(flush)
    rows = []
    # inductor: the default mode only here; max-autotune seeds cost minutes per op
    gens = [load_generator(g, modes=("default",)) if g == "inductor" else load_generator(g)
            for g in generators.split(",")]
    for ref in refs:
        if not made[(ref.source, ref.op)]["success"]:
            rows.append({"task": ref.key, "error": made[(ref.source, ref.op)]["error"]})
            continue
        data = load_reference(store, ref.source, ref.op)
        t0 = time.time()
        outcome = search_op(ref, data, SearchContext(store, "bench", "cuda", [SPEC], gens,
                                                     SearchConfig(max_tasks=max_tasks, max_concurrent=2, chunk_size=8),
                                                     EvalOptions(flush=flush), settings))
        wall = time.time() - t0
        report = json.loads(store.get_bytes(f"runs/bench/{ref.source}/{ref.op}/report.json"))
        pt = Path(tempfile.mkdtemp()) / "ref.pt"
        store.get_file(f"refs/{ref.source}/{ref.op}.pt", pt)
        comp = run_in_child(compiled_reference_child, (ref, str(pt), flush), timeout_s=600, env=SPEC.child_env())
        traffic = _nbytes(data["inputs"]) + _nbytes(data["outputs"])
        task = taskfiles.load_task(ref)
        failures = [f"{c['id']} {c['generator']} {c['verdict']}: {(c['error'] or '')[:300]}"
                    for c in report["candidates"] if c["verdict"] != "pass"]
        row = {"task": ref.key, **outcome.as_dict(), "search": busy(report, wall), "failures": failures[:5],
               "compile_ms": comp.value["compile_ms"] if comp.ok else None,
               "compile_error": "" if comp.ok else comp.error[-300:],
               "bytes": traffic, "memory_bound": "memory-bound" in task.tags, "copy_bw_bytes_s": copy_bw,
               "flush": flush}
        best = outcome.best_time_ms
        if best:
            row["bandwidth_fraction"] = traffic / (best / 1e3) / copy_bw
            row["speedup_vs_compile"] = row["compile_ms"] / best if row["compile_ms"] else None
        rows.append(row)
        (out / f"perf_{'_'.join(sources)}.json").write_text(json.dumps({"copy_bw_bytes_s": copy_bw, "rows": rows}, indent=2))
        print(f"{ref.key:48} {outcome.status:9} best {best or 0:.4f} ms  model {outcome.baseline.get('model_ms', 0):.4f}  "
              f"ref {outcome.baseline.get('reference_ms', 0):.4f}  compile {row['compile_ms'] or 0:.4f}  "
              f"bw {row.get('bandwidth_fraction', 0):.2f}  busy {row['search']['busy_fraction']:.2f}", flush=True)


def grid(out: Path, ops: list[str]) -> None:
    from farm.evaluate.evaluator import Evaluator
    from farm.search.database import normalized_hash

    settings, _ = load_settings()
    store = open_store(f"file://{tempfile.mkdtemp(prefix='farm-grid-')}")
    tables = {}
    for name in ops:
        source, op = name.split("/")
        [ref] = taskfiles.find_tasks(settings, [source], [op])
        generate_references([ref], store, SPEC, 0, "bench", 600)
        data = load_reference(store, source, op)
        points = tune_grid(model_as_candidate(ref.path.read_text()), "cuda")
        table = {}
        with Evaluator(ref, data, SPEC) as ev:
            base = ev.baseline()
            for i, src in enumerate(points):
                r = ev.evaluate(src)
                print(f"  {name} point {i + 1}/{len(points)}: {r.verdict} {r.stage_s.get('total', 0):.2f}s", flush=True)
                table[normalized_hash(src)] = {"verdict": r.verdict, "time_ms": r.timing and r.timing["median_ms"],
                                               "speedup_vs_model": r.speedup_vs_model,
                                               "speedup_vs_reference": r.speedup_vs_reference}
        tables[name] = {"points": len(points), "baseline": {k: v for k, v in base.items() if k.endswith("_ms")},
                        "table": table}
        times = [v["time_ms"] for v in table.values() if v["time_ms"]]
        print(f"{name}: {len(points)} points, {len(times)} pass, best {min(times):.4f} ms, worst {max(times):.4f} ms",
              flush=True)
        (out / "grid.json").write_text(json.dumps(tables))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["perf", "grid"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sources", nargs="*", default=["demo", "sglang", "vllm_triton", "vllm_torch"])
    parser.add_argument("--ops", nargs="*", default=["demo/row_sum", "sglang/triton_tanh", "vllm_triton/log_softmax_kernel"])
    parser.add_argument("--max-tasks", type=int, default=24)
    parser.add_argument("--only", nargs="*", help="perf: only these source/op names")
    parser.add_argument("--generators", default="tune,port")
    parser.add_argument("--flush", choices=timing.FLUSH_MODES, default="write",
                        help="the timer's cache flush for every figure (farm.evaluate.timing)")
    args = parser.parse_args()
    if args.mode == "perf":
        perf(args.out, args.sources, args.max_tasks, args.generators, args.only, args.flush)
    else:
        grid(args.out, args.ops)


if __name__ == "__main__":
    main()
