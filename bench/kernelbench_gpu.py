"""KernelBench level-1 ops at KernelBench's own shapes on a GPU, under the kernelbench profile.

    python bench/kernelbench_gpu.py --level1 DIR --ops 1,6,11,... --out results.json [--budget-s 200]

For each op: the inductor generator's capture on cuda (mode "default": conv and matmul as
Triton reductions, farm.generators.inductor.decompose), assembled into a candidate (phase A,
captures in parallel child processes, beside a torch.compile(Model) per op that warms inductor's
on-disk cache for phase B's compile); then, one op at a time on the GPU (phase B, nothing
else running), the kernelbench profile's rules (farm.evaluate.profiles):
  - correctness: 5 trials, seeds derived from seed 0, Model built under seed 0, outputs
    compared with atol = rtol = 1e-4 (fp32) / 1e-2 (half types) by farm.runtime.tolerance;
  - timing: farm.evaluate.timing.measure with the profile's options (1 warm call, 100 reps,
    256 MB cache flush written before each rep, CUDA events), the mean, for the eager Model,
    torch.compile(Model) (mode default) and the candidate, interleaved per op;
  - fast_p against eager and against torch.compile: correct and more than p times faster.
This is a bench harness, in-process (no sandbox child per candidate): it applies the same
profile rules as `farm eval --profile kernelbench`, without its cheat guards, to seeds the
farm made itself. A rep budget: where one call takes over 20 ms, reps are cut to fit 2 s per
timing (recorded per op as "reps"). Writes results as it goes; stops starting ops after
--budget-s seconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SLOW_CALL_MS = 20.0
SLOW_TIMING_MS = 2000.0


def _capture(path: str) -> dict:
    from farm.generators.inductor.assemble import assemble
    from farm.generators.inductor.capture import capture_child
    from farm.generators.inductor.layers import Unsupported

    t0 = time.time()
    try:
        cap = capture_child(lambda stage: None, path, "kb_level1", "bench", "default", "cuda")
        if not cap.get("ok"):
            return {"path": path, "capture_s": time.time() - t0, "error": f"no seed: {cap.get('reason')}"}
        try:
            source = assemble(cap, "cuda")
        except Unsupported as exc:
            return {"path": path, "capture_s": time.time() - t0, "error": f"no seed: {exc}"}
        return {"path": path, "capture_s": time.time() - t0, "source": source, "launches": len(cap["launches"])}
    except Exception as exc:  # noqa: BLE001 - one op's failure is its row
        return {"path": path, "capture_s": time.time() - t0, "error": f"capture raised {type(exc).__name__}: {exc}"[:400]}


def _warm_compile(path: str) -> dict:
    """torch.compile(Model) once in a pool child, so phase B's compile of the same graph reads
    inductor's on-disk cache (shared by every process of this user) instead of compiling cold
    on the clock of the one-op-at-a-time phase. Where it fails, phase B compiles cold."""
    import torch

    from farm.corpus import tasks as taskfiles
    from farm.runtime.tensors import seed_all

    t0 = time.time()
    try:
        task = taskfiles.load_task(taskfiles.ref_from_file(path, "kb_level1"), "bench")
        seed_all(0)
        model = task.model_cls(*task.init_inputs()).cuda().eval()
        with torch.no_grad():
            torch.compile(model)(*_draw_on_gpu(task))
        return {"path": path, "warm_s": time.time() - t0}
    except Exception as exc:  # noqa: BLE001 - a cold compile later is the fallback
        return {"path": path, "warm_s": time.time() - t0, "warm_error": f"{type(exc).__name__}: {exc}"[:200]}


def _load_candidate(source: str, tmp: Path, name: str):
    path = tmp / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"cand_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ModelNew


def _time(fn, timer, options: dict) -> dict:
    from farm.evaluate.timing import measure

    fn()
    timer.synchronize()
    t0 = time.perf_counter()
    fn()
    timer.synchronize()
    one_ms = (time.perf_counter() - t0) * 1e3
    opts = dict(options)
    if one_ms > SLOW_CALL_MS:
        reps = max(3, int(SLOW_TIMING_MS / one_ms))
        opts.update(min_reps=reps, max_reps=reps)
    stats = measure(fn, timer, **opts)
    return {"mean_ms": stats.mean_ms, "median_ms": stats.median_ms, "reps": stats.reps}


def _draw_on_gpu(task) -> list:
    """get_inputs() with cuda as the default device: KernelBench's shapes draw up to a few GiB
    per input set, which took tens of seconds per trial on the host (the H100 run of
    2026-11-24 got through 4 ops in 430 s); the values still follow the trial's seed."""
    import torch

    from farm.runtime.tensors import to_device

    with torch.device("cuda"):
        return to_device(task.inputs(), "cuda")


def _bench(path: str, source: str | None, verify: bool = True) -> dict:
    """One op: eager and torch.compile timed; with a candidate, its trials (unless `verify` is
    off: bench/kernelbench_table.py verified it at another size) and its timing."""
    import torch

    from farm.corpus import tasks as taskfiles
    from farm.evaluate import profiles
    from farm.evaluate.timing import DeviceTimer
    from farm.runtime import tolerance
    from farm.runtime.tensors import seed_all
    from farm.targets import resolve_device

    kb = profiles.get("kernelbench")
    spec = resolve_device("cuda:0")
    row: dict = {"op": Path(path).stem}
    task = taskfiles.load_task(taskfiles.ref_from_file(path, "kb_level1"), "bench")
    seed_all(0)
    init_inputs = task.init_inputs()
    seed_all(0)
    model = task.model_cls(*init_inputs).cuda().eval()
    timer = DeviceTimer(spec)
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        seed_all(profiles.trial_seed(0, 0))
        inputs = _draw_on_gpu(task)
        row["eager"] = _time(lambda: model(*inputs), timer, kb.timing)
        t0 = time.time()
        compiled = torch.compile(model)
        compiled(*inputs)
        row["compile_s"] = time.time() - t0
        row["compiled"] = _time(lambda: compiled(*inputs), timer, kb.timing)
        if source is None:
            return row
        seed_all(0)
        new = _load_candidate(source, Path(tmp), row["op"].lstrip("0123456789_") or "op")(*init_inputs).cuda().eval()
        for trial in range(kb.fresh_inputs if verify else 0):
            seed_all(profiles.trial_seed(0, trial))
            trial_inputs = _draw_on_gpu(task)
            expected = tolerance.as_output_list(model(*trial_inputs))
            got = tolerance.as_output_list(new(*trial_inputs))
            # compared on the GPU, in chunks (farm.runtime.tolerance): a host copy of a 6 GiB output
            # was most of an op's time on the H100
            checks = tolerance.compare_outputs(got, expected, kb.tolerance)
            if not tolerance.all_ok(checks):
                row["verdict"] = "mismatch"
                row["reason"] = f"trial {trial}: " + "; ".join(c.reason for c in checks if not c.ok)[:300]
                return row
            del trial_inputs, expected, got
        row["verdict"] = "pass"
        row["trials"] = kb.fresh_inputs if verify else 0
        row["candidate"] = _time(lambda: new(*inputs), timer, kb.timing)
        row["speedup_vs_eager"] = row["eager"]["mean_ms"] / row["candidate"]["mean_ms"]
        row["speedup_vs_compile"] = row["compiled"]["mean_ms"] / row["candidate"]["mean_ms"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--level1", required=True)
    ap.add_argument("--ops", required=True, help="comma-separated problem numbers")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    start = time.time()
    wanted = [int(n) for n in args.ops.split(",")]
    files = {int(p.name.split("_", 1)[0]): p for p in Path(args.level1).glob("*.py")}
    paths = [str(files[n]) for n in wanted if n in files]
    out = {"command": " ".join(sys.argv), "profile": "kernelbench", "ops": []}
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.workers) as pool:
        captures = pool.map_async(_capture, paths)
        warms = {w["path"]: w for w in pool.map(_warm_compile, paths)}
        caps = {c["path"]: c for c in captures.get()}
    out["phase_a_s"] = time.time() - start
    import torch

    out["device"] = torch.cuda.get_device_name(0)
    out["torch"], out["triton"] = str(torch.__version__), __import__("triton").__version__
    for path in paths:
        if time.time() - start > args.budget_s:
            out["ops"].append({"op": Path(path).stem, "verdict": "not run (bench time budget)"})
            continue
        cap = caps[path]
        try:
            row = _bench(path, cap.get("source"))
        except Exception:  # noqa: BLE001
            row = {"op": Path(path).stem, "verdict": "error", "reason": traceback.format_exc()[-400:]}
        if "error" in cap:
            row.update(verdict="no seed", reason=cap["error"])
        row["capture_s"] = cap["capture_s"]
        row.update({k: v for k, v in warms[path].items() if k != "path"})
        out["ops"].append(row)
        torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    ran = [r for r in out["ops"] if "eager" in r]
    for base in ("eager", "compile"):
        for p in (0.0, 1.0):
            fast = sum(1 for r in out["ops"] if r.get("verdict") == "pass" and r[f"speedup_vs_{base}"] > p)
            out[f"fast_{p:g}_vs_{base}"] = round(fast / max(len(out["ops"]), 1), 4)
    out["ops_run"] = len(ran)
    out["wall_s"] = time.time() - start
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "ops"}), flush=True)


if __name__ == "__main__":
    main()
