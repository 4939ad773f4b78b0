"""Before and after for issue 19's inflated baselines (run on the device machine, repo root).

For each op: the original Model submitted as a candidate (so the true speedup is 1.00), and
three figures of the same Model:

  before   what the evaluator used to report: the baseline timed once, per call (flushed
           events), in the trusted runner right after it started, divided by the candidate's
           own per-call figure from another runner at another moment (`baseline()` and the
           per-call pass are still computed, so the old ratio can be shown);
  after    the ratio measured in one place: candidate and Model in alternating rounds, same
           runner kind, same mode (CUDA graph under 20 us), with its spread;
  alone    the Model alone in a fresh process with triton.testing.do_bench (flushed) and
           do_bench_cudagraph, as the issue's independent check did.

Also recorded per op: `host_bound` (share of per-call batches in which the device waited for
the host, so the events saw host time) for the baseline and the candidate.

    python bench/baseline_gpu.py OUT.json --ops sglang/fused_rmsnorm_kernel vllm_triton/rms_norm_kernel ...
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
from farm.evaluate.evaluator import Evaluator  # noqa: E402
from farm.generators.base import model_as_candidate  # noqa: E402
from farm.reference.generate import generate_references  # noqa: E402
from farm.runtime.children import run_in_child  # noqa: E402
from farm.search.batch import load_reference  # noqa: E402
from farm.storage import open_store  # noqa: E402
from farm.targets import resolve_device  # noqa: E402

SPEC = resolve_device("cuda:0")


def alone_child(report, task_path: str, source: str, pt_path: str) -> dict:
    """The Model alone, in a fresh process, with triton.testing's timers only."""
    import torch
    import triton.testing as tt

    from farm.reference.generate import load_pt
    from farm.runtime.tensors import to_device

    data = load_pt(pt_path)
    task = taskfiles.load_task(taskfiles.TaskRef(source, Path(task_path).stem, Path(task_path)), data.get("shapes", "bench"))
    model = task.model_cls(*data["init_inputs"]).cuda().eval()
    inputs = to_device(list(data["inputs"]), "cuda")
    with torch.no_grad():
        fn = lambda: model(*inputs)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        events = tt.do_bench(fn, warmup=25, rep=100, return_mode="median")
        try:
            graph = tt.do_bench_cudagraph(fn, rep=20, return_mode="median")
        except Exception as exc:  # noqa: BLE001 - a forward that syncs with the host
            graph = f"{type(exc).__name__}: {str(exc)[:120]}"
    return {"do_bench_ms": events, "do_bench_cudagraph_ms": graph}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--ops", nargs="+", required=True, help="source/op")
    parser.add_argument("--repeats", type=int, default=2, help="fresh evaluators per op (the old figure moved)")
    args = parser.parse_args()
    settings, _ = load_settings()
    store = open_store(f"file://{tempfile.mkdtemp(prefix='farm-baseline-')}")
    refs = [r for r in taskfiles.find_tasks(settings, sorted({o.split('/')[0] for o in args.ops})) if r.key in args.ops]
    made = {(r["source"], r["op_name"]): r for r in generate_references(refs, store, SPEC, 0, "bench", 600)}
    rows = []
    for ref in refs:
        if not made[(ref.source, ref.op)]["success"]:
            rows.append({"op": ref.key, "error": made[(ref.source, ref.op)].get("error")})
            continue
        data = load_reference(store, ref.source, ref.op)
        pt = Path(tempfile.mkdtemp()) / "ref.pt"
        store.get_file(f"refs/{ref.source}/{ref.op}.pt", pt)
        alone = run_in_child(alone_child, (str(ref.path), ref.source, str(pt)), timeout_s=300, env=SPEC.child_env())
        row = {"op": ref.key, "alone": alone.value if alone.ok else alone.error[-300:], "runs": []}
        for _ in range(args.repeats):
            t0 = time.time()
            with Evaluator(ref, data, SPEC) as ev:
                base = ev.baseline()
                result = ev.evaluate(model_as_candidate(ref.path.read_text()), "model_as_candidate")
            run = {"verdict": result.verdict, "reason": result.reason[:300], "seconds": time.time() - t0,
                   "baseline_model_ms": base.get("model_ms"),
                   "baseline_host_bound": (base.get("model_timing") or {}).get("host_bound"),
                   "baseline_host_median_ms": (base.get("model_timing") or {}).get("host_median_ms")}
            if result.passed:
                per_call = result.timing["per_call"]
                run.update(candidate_per_call_ms=per_call["median_ms"], candidate_host_bound=per_call.get("host_bound"),
                           before_speedup=base["model_ms"] / per_call["median_ms"] if base.get("model_ms") else None,
                           after_speedup=result.speedup_vs_model, after=result.comparison.get("model"),
                           mode=result.timing["mode"], mode_reason=result.timing["mode_reason"],
                           candidate_ms=result.timing["median_ms"], limit=result.limit)
            row["runs"].append(run)
        rows.append(row)
        print(json.dumps(row)[:600], flush=True)
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
