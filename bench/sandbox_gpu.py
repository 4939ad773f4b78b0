"""The sandbox on a GPU: one short search with evaluator.sandbox=auto (bubblewrap) and =off.

The same search (demo/row_sum at benchmark shapes, the tune generator, MAX_TASKS candidates,
one device) runs with the sandbox on, off, and on again; the tune generator proposes the same
candidates each time, so verdicts and median times compare candidate by candidate. The second
"on" run gives the spread between two runs under the same setting.

usage: python bench/sandbox_gpu.py OUT_DIR [MAX_TASKS]   (bwrap on PATH; run from the repository root)
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.config import load_settings  # noqa: E402
from farm.corpus import tasks as taskfiles  # noqa: E402
from farm.evaluate import sandbox  # noqa: E402
from farm.evaluate.evaluator import EvalSettings, Evaluator  # noqa: E402
from farm.evaluate.options import EvalOptions  # noqa: E402
from farm.generators import load_generator  # noqa: E402
from farm.reference.generate import generate_references  # noqa: E402
from farm.search.batch import load_reference  # noqa: E402
from farm.search.context import SearchConfig, SearchContext  # noqa: E402
from farm.search.controller import search_op  # noqa: E402
from farm.storage import open_store  # noqa: E402
from farm.targets import resolve_device  # noqa: E402

SPEC = resolve_device("cuda:0")


def one_search(ref, data, store, mode: str, max_tasks: int) -> dict:
    settings = EvalSettings.for_device(SPEC)
    settings.sandbox = mode
    kinds, rows = set(), []

    def factory(*args, **kwargs):
        ev = Evaluator(*args, **kwargs)
        kinds.add(ev.boundary.kind)
        return ev

    def on_event(kind: str, info: dict) -> None:
        if kind == "candidate":
            rows.append({"id": info["id"], "verdict": info["verdict"], "time_ms": info["time_ms"]})

    t0 = time.time()
    ctx = SearchContext(store, f"sandbox-{mode}-{time.time_ns()}", "cuda", [SPEC], [load_generator("tune")],
                        SearchConfig(max_tasks=max_tasks, max_concurrent=1, chunk_size=max_tasks),
                        EvalOptions(base=settings), on_event=on_event, evaluator_factory=factory)
    outcome = search_op(ref, data, ctx)
    return {"mode": mode, "sandbox": sorted(kinds), "wall_s": round(time.time() - t0, 2), "status": outcome.status,
            "candidates": rows}


def main(out_dir: Path, max_tasks: int) -> None:
    found = sandbox.probe()
    print(f"probe: {found.kind} {found.why}", flush=True)
    settings, _ = load_settings()
    [ref] = taskfiles.find_tasks(settings, ["demo"], ["row_sum"])
    store = open_store(f"file://{tempfile.mkdtemp()}")
    generate_references([ref], store, SPEC, 0, "bench", 300)
    data = load_reference(store, ref.source, ref.op)
    runs = []
    for mode in ("auto", "off", "auto"):
        runs.append(one_search(ref, data, store, mode, max_tasks))
        r = runs[-1]
        print(f"{mode}: sandbox {r['sandbox']} {r['status']} {r['wall_s']} s", flush=True)
        for c in r["candidates"]:
            print(f"   {c['id']} {c['verdict']} {c['time_ms']}", flush=True)
        (out_dir / "sandbox_gpu.json").write_text(json.dumps({"probe": found.kind, "why": found.why, "runs": runs},
                                                             indent=2))
    on, off, on2 = ({c["id"]: c for c in r["candidates"]} for r in runs)
    common = [k for k in on if k in off and k in on2 and on[k]["time_ms"] and off[k]["time_ms"]]
    verdicts_equal = all(on[k]["verdict"] == off[k]["verdict"] == on2[k]["verdict"] for k in common)
    on_off = [100 * (on[k]["time_ms"] / off[k]["time_ms"] - 1) for k in common]
    on_on = [100 * (on2[k]["time_ms"] / on[k]["time_ms"] - 1) for k in common]
    summary = {"candidates_compared": len(common), "verdicts_equal": verdicts_equal,
               "on_vs_off_pct": on_off, "on_vs_on_pct": on_on,
               "median_on_vs_off_pct": statistics.median(on_off) if on_off else None,
               "median_on_vs_on_pct": statistics.median(on_on) if on_on else None}
    print(json.dumps(summary), flush=True)
    (out_dir / "sandbox_gpu.json").write_text(json.dumps({"probe": found.kind, "why": found.why, "runs": runs,
                                                         "summary": summary}, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 4)
