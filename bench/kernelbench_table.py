"""A KernelBench level's table on one GPU: per op correct or not, speedup against eager and
against torch.compile, the physical limit beside it, and the level's fast_0 / fast_1.

    python bench/kernelbench_table.py --level .kb/level1 --out bench/results/kb_table_h100/level1 \
        --workers 6 --budget-s 540 [--ops 1,2,19] [--verify fitted]

Per op, the offline generators' seed (the inductor generator's capture at the task's own shapes,
farm.generators.inductor; tune and port rework it in a search, which this bench does not run:
see docs/corpus.md) is judged under the kernelbench profile (farm.evaluate.profiles): 5 trials
with seeds derived from seed 0, atol = rtol = 1e-4 (fp32) / 1e-2 (half types), then eager,
torch.compile and the candidate timed (1 warm call, 100 reps, 256 MB flush, CUDA events, the
mean). Inputs are drawn on the GPU and compared there (bench/kernelbench_gpu.py's harness, in
process: no sandbox, so only for the farm's own seeds).

Large ops: the trials run at the task's own shapes where they fit the device (KernelBench's
level-1 shapes all do on an H100); `--verify fitted` runs them instead at the largest derived
shapes within reference.ship_max_mb (farm.reference.fitted), with a second capture there, and
times at the task's own shapes. The limit beside each figure is the farm's one definition
(farm.evaluate.limits.physical_limit: bytes in + out over the measured copy bandwidth, FLOPs over
the measured peak for the op's dtype, an empty kernel; the device's figures measured once and
cached by farm.evaluate.floor), with the candidate's mean as the time.

Resumable: every finished op is appended to <out>/ops.jsonl at once and skipped by the next call,
except ops that ended in an error, which are tried again. A call waits for ops until --budget-s (and
a minute), keeps every op finished by then and stops the rest. <out>/table.md is rewritten each call.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import benchinfo


def _ops(level: Path, wanted: str | None) -> list[Path]:
    files = sorted((p for p in level.glob("*.py") if p.name.split("_")[0].isdigit()),
                   key=lambda p: int(p.name.split("_")[0]))
    if not wanted:
        return files
    keep = {w.strip() for w in wanted.split(",")}
    return [p for p in files if p.name.split("_")[0] in keep or p.stem in keep]


def _footprint(path: str) -> dict:
    from farm.corpus import tasks as taskfiles
    from farm.corpus.shapes import measure
    from farm.evaluate.limits import op_work

    task = taskfiles.load_task(taskfiles.ref_from_file(path, "kb"), "bench")
    fp = measure(task.module, task.model_cls)
    flops, dtype = op_work(task)
    return {"bytes": fp.input_bytes + fp.output_bytes, "flops": flops, "dtype": dtype}


def _limit(row: dict) -> dict | None:
    """The farm's physical limit of this op on this GPU at the candidate's mean (farm.evaluate.limits)."""
    from farm.evaluate import floor, limits
    from farm.evaluate.timing import DeviceTimer
    from farm.targets import resolve_device

    spec = resolve_device("cuda:0")
    figures = limits.cached_floor(row["device"], lambda: floor.device_floor(DeviceTimer(spec), ("events",)))
    cand = (row.get("candidate") or {}).get("mean_ms")
    return limits.physical_limit(row["bytes"], figures, "events", cand, row.get("flops", 0), row.get("dtype"))


def _capture_at(path: str, shapes: str, budget_mb: float | None) -> dict:
    """The inductor seed at the task's own shapes, or at the fitted ones (a task file whose
    module constants are set to the fitted values: a copy next to nothing, in a temp folder)."""
    from bench.kernelbench_gpu import _capture

    if shapes == "bench":
        return _capture(path)
    return _capture(_fitted_copy(path, budget_mb))


def _fitted_copy(path: str, budget_mb: float) -> str:
    """The task file with its size constants at the fitted shapes, so that every tool that reads
    the file (the capture, this bench) runs there."""
    import tempfile

    from farm.corpus import tasks as taskfiles
    from farm.reference.fitted import fit_ref

    ref = fit_ref(taskfiles.ref_from_file(path, "kb"), budget_mb)
    task = taskfiles.load_task(ref, "small")
    folder = Path(tempfile.mkdtemp(prefix="kb-fit-"))
    text = Path(path).read_text() + "\n\n# fitted shapes (bench/kernelbench_table.py)\n" + "".join(
        f"{k} = {v!r}\n" for k, v in task.shape_overrides.items())
    (folder / Path(path).name).write_text(text)
    return str(folder / Path(path).name)


def _one(job: tuple[str, str, float]) -> dict:
    path, verify, budget_mb = job
    from bench.kernelbench_gpu import _bench

    t0 = time.time()
    row: dict = {"op": Path(path).stem, "device": _device()}
    try:
        row.update(_footprint(path))
        cap = _capture_at(path, "bench", None)
        row["capture_s"] = round(cap["capture_s"], 1)
        if verify == "fitted":
            fit_path = _fitted_copy(path, budget_mb)
            small = _capture_at(fit_path, "bench", None)
            checked = _bench(fit_path, small.get("source")) if small.get("source") else {"verdict": "no seed",
                                                                                       "reason": small.get("error")}
            row["verified_at"] = "fitted"
            if checked.get("verdict") != "pass":
                row.update(verdict=checked.get("verdict"), reason=checked.get("reason"))
        timed = _bench(path, cap.get("source"), verify=(verify == "own")) if cap.get("source") else _bench(path, None)
        for k in ("eager", "compiled", "compile_s", "candidate", "speedup_vs_eager", "speedup_vs_compile"):
            if k in timed:
                row[k] = timed[k]
        if "verdict" not in row:
            row["verdict"] = timed.get("verdict") if cap.get("source") else "no seed"
            row["reason"] = timed.get("reason") if cap.get("source") else cap.get("error")
        row["verified_at"] = row.get("verified_at", "own")
        row["limit"] = _limit(row)
    except Exception:  # noqa: BLE001 - one op's failure is its row
        row.update(verdict="error", reason=traceback.format_exc()[-600:])
    row["wall_s"] = round(time.time() - t0, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--level", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ops", default=None, help="problem numbers or file stems, comma-separated; default: all")
    ap.add_argument("--workers", type=int, default=4, help="ops at once on the GPU (each in its own process)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no op after this many seconds")
    ap.add_argument("--verify", choices=("own", "fitted"), default="own")
    ap.add_argument("--ship-max-mb", type=float, default=256.0, help="the fitted size's budget (--verify fitted)")
    args = ap.parse_args()
    start = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done_path = out / "ops.jsonl"
    # an op that ended in an error (out of memory beside other ops, a crash) is tried again
    done = {row["op"] for row in _rows(out) if row.get("verdict") != "error"}
    todo = [p for p in _ops(Path(args.level), args.ops) if p.stem not in done]
    if todo:  # the device's figures, measured with nothing else on it, before the workers read them
        _limit({"device": _device(), "bytes": 0})
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.workers, maxtasksperchild=1) as pool:
        pending = [pool.apply_async(_one, ((str(p), args.verify, args.ship_max_mb),)) for p in todo]
        left = dict(zip((p.stem for p in todo), pending))
        while left and time.time() - start < args.budget_s + 60:
            for name in [n for n, job in left.items() if job.ready()]:
                row = left.pop(name).get()
                with done_path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(json.dumps({k: row.get(k) for k in ("op", "verdict", "speedup_vs_eager", "speedup_vs_compile",
                                                          "wall_s")}), flush=True)
            time.sleep(1.0)
        if left:
            print(json.dumps({"stopped": "budget", "not_finished": sorted(left)}), flush=True)
            pool.terminate()
    write_table(out, " ".join(["python"] + sys.argv))


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _rows(out: Path) -> list[dict]:
    path = out / "ops.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def write_table(out: Path, command: str) -> None:
    rows = list({row["op"]: row for row in _rows(out)}.values())  # an op tried again: its last row
    rows.sort(key=lambda r: int(r["op"].split("_")[0]) if r["op"].split("_")[0].isdigit() else 0)
    n = len(rows)

    def fast(base: str, p: float) -> int:
        return sum(1 for r in rows if r.get("verdict") == "pass" and (r.get(f"speedup_vs_{base}") or 0) > p)

    commit = benchinfo.commit()
    lines = [f"Command: `{command}` (commit {commit}; device {rows[0].get('device') if rows else '-'}).", "",
             "| | count | of ops |", "|---|---|---|",
             f"| fast_0 (correct) | {fast('eager', 0.0)}/{n} | {fast('eager', 0.0) / max(n, 1):.2f} |",
             f"| fast_1 vs eager | {fast('eager', 1.0)}/{n} | {fast('eager', 1.0) / max(n, 1):.2f} |",
             f"| fast_1 vs torch.compile | {fast('compile', 1.0)}/{n} | {fast('compile', 1.0) / max(n, 1):.2f} |", "",
             "| op | correct | verified at | eager ms | compile ms | candidate ms | vs eager | vs compile | limit ms "
             "(bound) | of limit | why not |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cand = (r.get("candidate") or {}).get("mean_ms")
        lim = r.get("limit")
        limit = f"{lim['limit_ms']:.3f} ({lim['bound']})" if lim else "-"
        frac = f"{lim['limit_ms'] / cand:.2f}" if lim and cand else "-"
        ms = {k: f"{r[k]['mean_ms']:.3f}" if isinstance(r.get(k), dict) else "-" for k in ("eager", "compiled", "candidate")}
        sp = {k: f"{r[k]:.2f}" if r.get(k) is not None else "-" for k in ("speedup_vs_eager", "speedup_vs_compile")}
        why = "" if r.get("verdict") == "pass" else f"{r.get('verdict')}: {str(r.get('reason') or '')[:90]}"
        lines.append(f"| {r['op'][:48]} | {'yes' if r.get('verdict') == 'pass' else 'no'} | {r.get('verified_at', '-')} | "
                     f"{ms['eager']} | {ms['compiled']} | {ms['candidate']} | {sp['speedup_vs_eager']} | "
                     f"{sp['speedup_vs_compile']} | {limit} | {frac} | {why.replace('|', '/')} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
