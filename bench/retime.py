"""Independent re-timing of every promoted kernel (issue 19): in this fresh process, with
triton.testing's own timers and none of farm.evaluate's code, time each best.py against its
task's Model on the reference data's inputs and print the reported speedup beside the
independent one.

    python bench/retime.py file:///path/to/store --target cuda [--run RUN] [--json OUT.json]

Timing mode per op follows what best.json says the farm used: "graph" figures are checked with
triton.testing.do_bench_cudagraph (no flush, the calls replayed in a CUDA graph), "events"
figures with triton.testing.do_bench (256 MB cache flush before each call, median). Model and
best are timed alternately, PAIRS times each (EVENTS_PAIRS for events-mode ops), and the
independent speedup is the median of the pair ratios. Ops promoted with no ratio to the Model
(the Model does not run there) are listed without one. With more than one op, each op runs in a
process of its own (this script with --ops), so that an op that faults cannot take the device
context of the others with it; --jobs N
starts N of them at once, and they take turns (a lock file) for everything that touches the
device, so that each op is still timed with the device to itself. Events-mode ops (timed per
call, the host's work inside the figure) run one at a time after the rest, so that no other
op's start shares the host with them: their independent figures moved by up to 19% between two
runs with --jobs (2026-11-24, AKG runs b and c), and a shared host is one cause that can be
removed.

--compile also times torch.compile of the task's Reference against the best kernel, kernel
against kernel: compiled with mode="max-autotune-no-cudagraphs" (so it makes no CUDA graph of
its own and copies no inputs per call) and, for graph-mode ops, replayed in a CUDA graph by
do_bench_cudagraph exactly like the best kernel; with --per-call-compile, the per-call figure
of torch.compile(mode="max-autotune") (its own CUDA graphs, guards and input copies on every
call) as a second, labelled column.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAIRS = 7
EVENTS_PAIRS = 21  # per-call (events) ops: their figures moved by up to 19% between runs of 7 pairs
OP_TIMEOUT_S = 300  # one op's process, torch.compile's columns included
AGREE = 0.10  # issue 19: reported and independent speedups within 10%
LOCK_ENV = "FARM_RETIME_LOCK"  # --jobs: the file whose lock makes each op's device work exclusive


@contextlib.contextmanager
def _device_alone():
    """With --jobs, the op processes start, import and load at once, and take turns for everything
    that touches the device (building on it, compiling, timing): nothing else runs on it then."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _bench(fn, mode: str) -> float:
    import triton.testing as tt

    if mode == "graph":
        return tt.do_bench_cudagraph(fn, rep=20, return_mode="median")
    return tt.do_bench(fn, warmup=25, rep=100, return_mode="median")


def retime_op(store, meta: dict, task_path: Path, tmp: Path, compile_modes: tuple[str, ...] = ()) -> dict:
    from farm.reference.generate import load_pt

    src, op = meta["source"], meta["op"]
    pt = tmp / f"{src}_{op}.pt"
    store.get_file(f"refs/{src}/{op}.pt", pt)
    data = load_pt(pt)
    best_path = tmp / f"best_{src}_{op}.py"
    best_path.write_bytes(store.get_bytes(meta["kernel_key"]))
    task = _load_module(task_path, f"retime_task_{src}_{op}")
    best = _load_module(best_path, f"retime_best_{src}_{op}")
    with _device_alone():
        return _retime_loaded(task, best, data, meta, compile_modes)


def _retime_loaded(task, best, data: dict, meta: dict, compile_modes: tuple[str, ...]) -> dict:
    import torch

    from farm.runtime.tensors import to_device

    src, op = meta["source"], meta["op"]
    init = list(data["init_inputs"])
    torch.manual_seed(0)
    model = task.Model(*init).cuda().eval()
    torch.manual_seed(0)
    kernel = best.ModelNew(*init).cuda().eval()
    inputs = to_device(list(data["inputs"]), "cuda")
    mode = meta.get("timing_mode") or "events"
    row = {"op": f"{src}/{op}", "mode": mode, "reported": meta.get("speedup_vs_model"),
           "promoted": meta.get("promoted", True),
           "reported_ms": meta.get("time_ms"), "fraction_of_limit": meta.get("fraction_of_limit")}
    with torch.no_grad():
        model_in = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        best_in = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        m_fn, b_fn = (lambda: model(*model_in)), (lambda: kernel(*best_in))
        m_fn(), b_fn()
        torch.cuda.synchronize()
        pairs = []
        for _ in range(EVENTS_PAIRS if mode == "events" else PAIRS):
            m_ms, b_ms = _bench(m_fn, mode), _bench(b_fn, mode)
            pairs.append((m_ms, b_ms))
        for cmode in compile_modes:
            try:
                row.update(_compiled(task, init, inputs, b_fn, mode, cmode))
            except Exception as exc:  # noqa: BLE001 - torch.compile's failure is its column's, not the op's
                # e.g. a Reference that copies to the host cannot be replayed in a CUDA graph
                row[f"{cmode}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    row["model_ms"] = statistics.median(m for m, _ in pairs)
    row["best_ms"] = statistics.median(b for _, b in pairs)
    row["independent"] = statistics.median(m / b for m, b in pairs)
    if row["reported"]:
        row["diff"] = row["reported"] / row["independent"] - 1
        row["agree"] = abs(row["diff"]) <= AGREE
    return row


def _compiled(task, init: list, inputs: list, best_fn, mode: str, cmode: str) -> dict:
    """torch.compile(Reference) against the best kernel: kernel against kernel in the op's mode
    (max-autotune-no-cudagraphs), or per call as torch.compile is usually called (max-autotune)."""
    import torch

    truth = getattr(task, "Reference", None) or task.Model
    compiled = torch.compile(truth(*init).cuda().eval(), mode=cmode)
    args = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    fn = lambda: compiled(*args)  # noqa: E731
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    timing_mode = mode if cmode == "max-autotune-no-cudagraphs" else "events"
    pairs = [(_bench(fn, timing_mode), _bench(best_fn, timing_mode)) for _ in range(3)]
    label = "compile_kernel" if cmode == "max-autotune-no-cudagraphs" else "compile_per_call"
    return {f"{label}_ms": statistics.median(c for c, _ in pairs), f"{label}_mode": timing_mode,
            f"vs_{label}": statistics.median(c / b for c, b in pairs)}


def promoted_metas(store, target: str, run: str | None) -> list[dict]:
    keys = sorted(info.key for info in store.list(f"kernels/{target}/"))
    metas = [store.read_json(k) for k in keys if k.endswith("/best.json")]
    metas = [m for m in metas if not run or m.get("run") == run]
    for m in metas:
        m["kernel_key"] = f"kernels/{target}/{m['source']}/{m['op']}/best.py"
    return metas


def passing_metas(store, run: str) -> list[dict]:
    """The best passing kernel of every op of the run, promoted or not, with the figures the run
    reported for it (the confirmation's where it was re-timed): issue 19's bar is every op that
    gets a passing kernel, not only those that beat the Model."""
    from farm.search.results import figures_of

    metas = []
    for info in sorted(store.list(f"runs/{run}/"), key=lambda i: i.key):
        if not info.key.endswith("/report.json"):
            continue
        rep = store.read_json(info.key)
        best = rep.get("best")
        if not best or best.get("verdict") != "pass":
            continue
        prefix = info.key.rsplit("/", 1)[0]
        metas.append({"source": rep["source"], "op": rep["op"], **figures_of(rep.get("confirmation"), rep["best"]),
                      "kernel_key": f"{prefix}/candidates/{best['id']}.py",
                      "promoted": bool((rep.get("promotion") or {}).get("allowed"))})
    return metas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--run", default=None, help="only kernels promoted by this run")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--compile", action="store_true", help="torch.compile(Reference), kernel against kernel")
    parser.add_argument("--per-call-compile", action="store_true", help="and torch.compile per call (max-autotune)")
    parser.add_argument("--passing", action="store_true",
                        help="with --run: every op's best passing kernel of the run, promoted or not")
    parser.add_argument("--ops", nargs="+", default=None, help="only these source/op keys")
    parser.add_argument("--jobs", type=int, default=1,
                        help="op processes at once: they start and load together and take turns on the device")
    args = parser.parse_args()

    from farm.config import load_settings
    from farm.corpus import tasks as taskfiles
    from farm.storage import open_store

    settings, _ = load_settings()
    store = open_store(args.store)
    if args.passing and not args.run:
        parser.error("--passing needs --run")
    metas = passing_metas(store, args.run) if args.passing else promoted_metas(store, args.target, args.run)
    metas = [m for m in metas if not args.ops or f"{m['source']}/{m['op']}" in args.ops]
    rows = []
    with tempfile.TemporaryDirectory(prefix="farm-retime-") as tmp:
        for meta, row in _rows(metas, Path(tmp), args):
            if len(metas) == 1:
                try:
                    [ref] = taskfiles.find_tasks(settings, [meta["source"]], [meta["op"]])
                    modes = (("max-autotune-no-cudagraphs",) if args.compile else ()) + (
                        ("max-autotune",) if args.per_call_compile else ())
                    row = retime_op(store, meta, ref.path, Path(tmp), modes)
                except Exception as exc:  # noqa: BLE001 - one op's failure is its row
                    row = {"op": f"{meta['source']}/{meta['op']}", "error": f"{type(exc).__name__}: {exc}"[:300]}
            rows.append(row)
            write_summary(rows, args.json)
            if "error" in row:
                print(f"{row['op']:50} error: {row['error']}", flush=True)
            else:
                rep = f"{row['reported']:.3f}" if row["reported"] else "-"
                diff = f"{row['diff'] * 100:+.1f}%" if "diff" in row else "-"
                print(f"{row['op']:50} {row['mode']:6} reported {rep:>7} independent {row['independent']:.3f} "
                      f"({row['model_ms'] * 1e3:.2f} / {row['best_ms'] * 1e3:.2f} us) {diff}"
                      + (f" vs compile (kernel) {row['vs_compile_kernel']:.2f}" if "vs_compile_kernel" in row else ""),
                      flush=True)
    print(json.dumps(write_summary(rows, args.json)))


def _rows(metas: list[dict], tmp: Path, args):
    """(meta, row or None) in the order the ops finish: None where this process re-times the
    one op itself, else a row from the op's own process (--jobs of them at once)."""
    if len(metas) == 1:
        yield metas[0], None
        return
    from concurrent.futures import ThreadPoolExecutor, as_completed

    os.environ[LOCK_ENV] = str(tmp / "device.lock")
    # an events-mode op is timed per call, host work included: its processes run one at a time,
    # after the others, so that no other op's start (imports, loading) shares the host with it
    graph = [m for m in metas if m.get("timing_mode") == "graph"]
    alone = [m for m in metas if m.get("timing_mode") != "graph"]
    for batch, jobs in ((graph, max(1, args.jobs)), (alone, 1)):
        with ThreadPoolExecutor(jobs) as pool:
            futures = {pool.submit(_isolated, meta, tmp, args): meta for meta in batch}
            for future in as_completed(futures):
                yield futures[future], future.result()


def _isolated(meta: dict, tmp: Path, args) -> dict:
    """One op re-timed in a process of its own (this script with --ops): an op that faults
    leaves CUDA's context unusable, and in one process every later op failed with it (the AKG
    run of 2026-11-24: an illegal address in vllm_triton/append_block_ids_kernel, 28 rows lost)."""
    import subprocess

    key = f"{meta['source']}/{meta['op']}"
    out = tmp / f"{meta['source']}_{meta['op']}.json"
    argv = [args.store, "--target", args.target, "--ops", key, "--json", str(out)]
    argv += ["--run", args.run] if args.run else []
    argv += [flag for flag, on in (("--passing", args.passing), ("--compile", args.compile),
                                   ("--per-call-compile", args.per_call_compile)) if on]
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], capture_output=True, text=True,
                              timeout=OP_TIMEOUT_S)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    except subprocess.TimeoutExpired:
        tail = [f"no answer in {OP_TIMEOUT_S} s"]
    rows = json.loads(out.read_text()).get("rows", []) if out.exists() else []
    return rows[0] if rows else {"op": key, "error": f"re-timing process failed: {tail[0][:300]}"}


def write_summary(rows: list[dict], path: Path | None) -> dict:
    """The bar over the rows so far, written to `path` after every op: a run stopped by its
    time box keeps what it measured."""
    checked = [r for r in rows if "agree" in r]
    agree = sum(r["agree"] for r in checked)
    # the bar is on promoted kernels: a passing kernel slower than the Model is not promoted
    slower = [r["op"] for r in rows if r.get("independent") is not None and r["independent"] < 1.0 and r.get("promoted")]
    summary = {"ops": len(rows), "checked": len(checked), "agree_within_10pct": agree,
               "share": agree / len(checked) if checked else None, "slower_than_model_independent": slower}
    if path:
        path.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))
    return summary


if __name__ == "__main__":
    main()
