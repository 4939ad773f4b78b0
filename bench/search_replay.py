"""Search efficiency: farm search against random search at equal budgets, replayed on the
exhaustive grids of tune's space measured on a GPU (bench/search_gpu.py grid).

Every point of a task's knob space was timed once by the evaluator on the H100. The real
search controller (farm.search.controller, tune generator) runs here with an evaluator that
answers from that table, so both strategies see the same timings and can be repeated over
many seeds. Metric: evaluations until a candidate within 3% of the grid optimum is found.

usage: python bench/search_replay.py bench/results/grid_h100_part1.json bench/results/grid_h100_part2.json
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.config import load_settings  # noqa: E402
from farm.corpus import tasks as taskfiles  # noqa: E402
from farm.evaluate.evaluator import EvalResult, EvalSettings  # noqa: E402
from farm.generators import load_generator  # noqa: E402
from farm.generators.base import model_as_candidate  # noqa: E402
from farm.generators.tune import grid  # noqa: E402
from farm.search.context import SearchConfig, SearchContext  # noqa: E402
from farm.search.controller import search_op  # noqa: E402
from farm.search.database import normalized_hash  # noqa: E402
from farm.storage import open_store  # noqa: E402
from farm.targets import resolve_device  # noqa: E402

SEEDS = 20
WITHIN = 0.03


class ReplayEvaluator:
    """Answers what a search asks of an evaluator (farm.search.context.SearchEvaluator), from a
    table measured on the GPU: no runners, nothing verified or re-timed here."""

    def __init__(self, table: dict, baseline: dict, spec):
        self.table, self.base, self.spec = table, baseline, spec
        self.settings = EvalSettings()

    def fixed_costs(self) -> dict:
        return {"cases": None, "baseline": self.base}

    def adopt(self, fixed: dict) -> None:
        pass

    def verification(self) -> dict:
        return {"by": "replay"}

    def device_info(self) -> dict:
        return {}

    def compile_ahead(self, specs, size: int, target: str):
        raise SystemExit("a replay compiles nothing: run it with evaluator.compile_workers 0 (the default)")

    def retime(self, candidate_code: str, name: str = "") -> dict:
        return {"error": "a replay of recorded timings is not re-timed"}  # not promoted

    def model_runs(self) -> bool:
        return True

    def evaluate(self, candidate_code: str, name: str = "", best_so_far: float | None = None,
                 runner=None) -> EvalResult:
        row = self.table.get(normalized_hash(candidate_code))
        if row is None:
            return EvalResult(verdict="crash", reason="not in the measured grid")
        if row["verdict"] != "pass":
            return EvalResult(verdict=row["verdict"], reason="from the grid")
        t = row["time_ms"]
        return EvalResult(verdict="pass", timing={"median_ms": t, "min_ms": t, "rse": 0.0, "reps": 1,
                                                  "stop_reason": "replay"},
                          speedup_vs_model=row["speedup_vs_model"], speedup_vs_reference=row["speedup_vs_reference"])

    def close(self) -> None:
        pass


def evals_to_target(times: list[float | None], target: float) -> int | None:
    for i, t in enumerate(times, 1):
        if t is not None and t <= target:
            return i
    return None


def farm_order(ref, entry: dict, seed: int, budget: int) -> list[float | None]:
    store = open_store(f"file://{tempfile.mkdtemp(prefix='replay-')}")
    spec = resolve_device("cuda:0")
    factory = lambda r, d, s, e, c: ReplayEvaluator(entry["table"], entry["baseline"], spec)  # noqa: E731
    config = SearchConfig(max_tasks=budget, max_concurrent=1, chunk_size=budget, seed=seed, early_stop=False)
    search_op(ref, {"inputs": [], "outputs": [], "init_inputs": []},
              SearchContext(store, "replay", "cuda", [spec], [load_generator("tune")], config, evaluator_factory=factory))
    state = store.read_json("runs/replay/%s/%s/state.json" % (ref.source, ref.op))
    return [r["time_ms"] if r["verdict"] == "pass" else None for r in state["db"]["records"]]


def random_order(points: list[str], table: dict, seed: int, budget: int) -> list[float | None]:
    order = random.Random(seed).sample(points, k=min(budget, len(points)))
    rows = [table[normalized_hash(p)] for p in order]
    return [r["time_ms"] if r["verdict"] == "pass" else None for r in rows]


def summarize(found: list[int | None], budget: int) -> dict:
    hits = [f for f in found if f is not None]
    return {"found": f"{len(hits)}/{len(found)}", "median_evals": statistics.median(hits) if hits else None,
            "mean_evals": round(statistics.fmean(hits), 1) if hits else None, "budget": budget}


def main(paths: list[str]) -> None:
    settings, _ = load_settings()
    tables = {}
    for p in paths:
        tables.update(json.loads(Path(p).read_text()))
    report = {}
    for name, entry in tables.items():
        source, op = name.split("/")
        [ref] = taskfiles.find_tasks(settings, [source], [op])
        points = grid(model_as_candidate(ref.path.read_text()), "cuda")
        # the grid was enumerated in this same order on the GPU machine: key rows by this
        # machine's hashes (ast details differ between Python versions)
        entry["table"] = dict(zip((normalized_hash(p) for p in points), entry["table"].values()))
        best = min(v["time_ms"] for v in entry["table"].values() if v["time_ms"])
        target = best * (1 + WITHIN)
        good = sum(1 for v in entry["table"].values() if v["time_ms"] and v["time_ms"] <= target)
        for budget in (10, 20):
            farm = [evals_to_target(farm_order(ref, entry, s, budget), target) for s in range(SEEDS)]
            rnd = [evals_to_target(random_order(points, entry["table"], s, budget), target) for s in range(SEEDS)]
            report[f"{name}@{budget}"] = {"grid_points": len(points), "grid_best_ms": best, "points_within_3pct": good,
                                          "farm": summarize(farm, budget), "random": summarize(rnd, budget)}
            r = report[f"{name}@{budget}"]
            print(f"{name:32} budget {budget:2}: grid {len(points)} pts ({good} within 3%), "
                  f"farm found {r['farm']['found']} median {r['farm']['median_evals']} evals; "
                  f"random found {r['random']['found']} median {r['random']['median_evals']} evals", flush=True)
    out = Path(__file__).resolve().parent / "results" / "search_efficiency.json"
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
