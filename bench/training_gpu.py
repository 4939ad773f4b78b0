"""Training-op benchmark on a CUDA GPU (run on the device machine from the repository root).

For every op of the training source (or --ops): reference data at bench shapes, a short
offline farm search (generators tune,inductor by default; SearchConfig as `farm search`), then
the best verified kernel re-evaluated by the Evaluator (forward and backward verified, forward
and forward+backward timed against the task's Model and Reference) and, in one child per op,
four things timed the same way, kernel against kernel:

    eager      the PyTorch truth (Reference, else Model), eager mode
    compiled   torch.compile(truth, mode="max-autotune-no-cudagraphs")
    kernel     the search's best candidate (ModelNew)
each forward, and forward + backward (torch.autograd.grad of every gradient the task
declares, parameters included, for one stored upstream gradient).

Timing mode of the child (labelled in the JSON as `timing_mode`): per call, CUDA events
around each call, the L2 cache flushed before each call (--flush: write as triton's do_bench,
or clean), no CUDA graphs on either side; farm.evaluate.timing.measure's adaptive repetitions.

Then FlashAttention at realistic sequence lengths: the best flash_attention_triton kernel
(the task's own Model when the search found nothing better) against
scaled_dot_product_attention (eager; PyTorch picks its flash backend on an H100) and against
torch.compile of it, batch 4, 16 heads, head dim 64, fp16, causal, seq 1024/2048/4096.

Writes OUT/training_<device>.json and OUT/training_<device>.md (a markdown table); --docs
FILE replaces the block between `<!-- training-bench:begin -->` and `<!-- training-bench:end -->`
in FILE with that table (a dated notes file: docs/results.md keeps only the current figures).

usage: python bench/training_gpu.py bench/results --ops flash_attention_triton silu layer_norm \\
           --max-tasks 8 --generators tune,inductor [--flush write] [--docs bench/results/training_h100/NOTES-<date>.md]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.config import load_settings  # noqa: E402
from farm.corpus import tasks as taskfiles  # noqa: E402
from farm.evaluate import timing  # noqa: E402
from farm.evaluate.options import EvalOptions  # noqa: E402
from farm.generators import load_generator  # noqa: E402
from farm.generators.base import model_as_candidate  # noqa: E402
from farm.reference.generate import generate_references  # noqa: E402
from farm.runtime.children import run_in_child  # noqa: E402
from farm.search.batch import load_reference, search_batch  # noqa: E402
from farm.search.context import SearchConfig, SearchContext  # noqa: E402
from farm.search.database import Database  # noqa: E402
from farm.storage import open_store  # noqa: E402
from farm.targets import resolve_device, synchronize  # noqa: E402

COMPILE_MODE = "max-autotune-no-cudagraphs"  # the default of --compile-mode
SEQS = (1024, 2048, 4096)
BEGIN, END = "<!-- training-bench:begin -->", "<!-- training-bench:end -->"


def timing_mode(flush: str, target: str) -> str:
    clock = "CUDA events" if target == "cuda" else f"the {target} target's timer"
    return (f"per call: {clock} around each call, cache flushed ({flush}) before each call, no CUDA graphs "
            "on either side")


def _load_candidate(source: str):
    """ModelNew from source, imported from a real file (triton.jit reads its source back)."""
    path = Path(tempfile.mkdtemp(prefix="farm-train-")) / "candidate.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("farm_bench_candidate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ModelNew


def _step_fns(module, inputs: list, indices: list[int], seed: int):
    """(forward, forward + backward) closures for one module on cuda inputs."""
    import torch

    from farm.runtime import grads
    from farm.runtime.tensors import to_cpu
    from farm.runtime.tolerance import as_output_list

    leaves = [inputs[i].detach().requires_grad_(True) for i in indices]
    args = list(inputs)
    for i, leaf in zip(indices, leaves):
        args[i] = leaf
    wrt = leaves + list(grads.trainable(module).values())
    with torch.no_grad():
        outs = as_output_list(module(*inputs))
    device = next(t.device for t in inputs if isinstance(t, torch.Tensor))
    upstream = [None if g is None else g.to(device) for g in grads.upstream(to_cpu(outs), seed)]

    def forward():
        with torch.no_grad():
            return module(*inputs)

    def forward_backward():
        outs = as_output_list(module(*args))
        pairs = [(o, g) for o, g in zip(outs, upstream)
                 if g is not None and isinstance(o, torch.Tensor) and o.requires_grad]
        return torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)

    return forward, forward_backward


def _time_module(module, inputs, indices, flush: str, spec) -> dict:
    forward, forward_backward = _step_fns(module, inputs, indices, seed=1)
    started = time.time()
    forward(), forward_backward()  # compiles (torch.compile, triton) outside the timing
    synchronize(spec)
    first_s = time.time() - started
    fwd = timing.measure(forward, timing.DeviceTimer(spec, flush))
    fwd_bwd = timing.measure(forward_backward, timing.DeviceTimer(spec, flush))
    return {"fwd_ms": fwd.median_ms, "fwd_rse": fwd.rse, "fwd_bwd_ms": fwd_bwd.median_ms,
            "fwd_bwd_rse": fwd_bwd.rse, "first_call_s": first_s}


def kernel_vs_compile_child(report, ref: taskfiles.TaskRef, pt_path: str, candidate: str | None, flush: str,
                            compile_mode: str,
                            device: str) -> dict:
    """In a child: eager truth, torch.compile(truth) and the candidate, timed alike."""
    import torch

    from farm.reference.generate import load_pt
    from farm.runtime import grads
    from farm.runtime.tensors import to_device

    spec = resolve_device(device)
    dev = spec.torch_device
    data = load_pt(pt_path)
    task = taskfiles.load_task(ref, data.get("shapes", "bench"))
    inputs = to_device(list(data["inputs"]), dev)
    indices = list(data.get("grad_input_indices") or grads.grad_indices(task.grad_inputs, inputs))
    out = {}
    truth = task.truth_cls(*data["init_inputs"]).to(dev)
    out["eager"] = _time_module(truth, inputs, indices, flush, spec)
    try:
        compiled = torch.compile(task.truth_cls(*data["init_inputs"]).to(dev), mode=compile_mode)
        out["compiled"] = _time_module(compiled, inputs, indices, flush, spec)
    except Exception as exc:  # a compile failure is a result of the benchmark, not its end
        out["compiled"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    if candidate:
        kernel = _load_candidate(candidate)(*data["init_inputs"]).to(dev)
        out["kernel"] = _time_module(kernel, inputs, indices, flush, spec)
    return out


def attention_child(report, candidate: str, seqs: list[int], flush: str, device: str,
                    compile_mode: str = COMPILE_MODE) -> list[dict]:
    """FlashAttention kernel vs SDPA (eager and compiled) over sequence lengths."""
    import torch
    import torch.nn.functional as F

    spec = resolve_device(device)
    kernel = _load_candidate(candidate)(True).to(spec.torch_device)

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    rows = []
    for seq in seqs:
        gen = torch.Generator().manual_seed(seq)
        inputs = [torch.randn(4, 16, seq, 64, generator=gen).half().to(spec.torch_device) for _ in range(3)]
        row = {"seq": seq, "batch": 4, "heads": 16, "head_dim": 64, "dtype": "float16", "causal": True}
        for name, module in (("sdpa", Sdpa()), ("sdpa_compiled", torch.compile(Sdpa(), mode=compile_mode)),
                             ("kernel", kernel)):
            try:
                row[name] = _time_module(module, inputs, [0, 1, 2], flush, spec)
            except Exception as exc:
                row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        # causal attention: half of 4*B*H*L*L*D forward flops, 2.5x that forward + backward
        flops = 4 * 4 * 16 * seq * seq * 64 / 2
        for name in ("sdpa", "sdpa_compiled", "kernel"):
            if "fwd_ms" in row[name]:
                row[name]["fwd_tflops"] = flops / row[name]["fwd_ms"] / 1e9
                row[name]["fwd_bwd_tflops"] = 3.5 * flops / row[name]["fwd_bwd_ms"] / 1e9
        rows.append(row)
        print(f"  attention seq {seq}: " + "  ".join(
            f"{n} {row[n].get('fwd_ms', float('nan')):.3f}/{row[n].get('fwd_bwd_ms', float('nan')):.3f} ms"
            for n in ("sdpa", "sdpa_compiled", "kernel")), flush=True)
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _best_source(store, ref: taskfiles.TaskRef, best_id: str | None) -> tuple[str | None, str]:
    if best_id:
        return store.get_bytes(f"runs/bench/{ref.source}/{ref.op}/candidates/{best_id}.py").decode(), "search"
    return None, "none"


def _verify(ref, data, spec, source: str) -> dict:
    from farm.evaluate.evaluator import Evaluator

    with Evaluator(ref, data, spec) as ev:
        r = ev.evaluate(source, "bench-best")
    return {"verdict": r.verdict, "reason": r.reason, "backward": r.backward, "baseline": ev.baseline(),
            "fwd_ms": r.timing and r.timing["median_ms"], "fwd_bwd_ms": r.timing_backward and r.timing_backward["median_ms"],
            "speedup_vs_model": r.speedup_vs_model, "speedup_vs_reference": r.speedup_vs_reference,
            "speedup_fwd_bwd_vs_model": r.speedup_fwd_bwd_vs_model,
            "speedup_fwd_bwd_vs_reference": r.speedup_fwd_bwd_vs_reference}


def bench_op(ref, store, spec, search: dict, args) -> dict:
    """Phase B for one op, nothing else on the device: its search's best re-evaluated, then
    kernel, eager and compiled timed in one child."""
    data = load_reference(store, ref.source, ref.op)
    row = {"task": ref.key, "search": search, "search_wall_s": search.get("wall_s"),
           "candidates": _candidates(store, ref)}
    source, origin = _best_source(store, ref, search.get("best_id"))
    row["best_origin"] = origin
    if source is None:
        return row
    t0 = time.time()
    row["evaluator"] = _verify(ref, data, spec, source) if args.reverify else _search_verdict(store, ref, search["best_id"])
    row["verify_s"] = time.time() - t0
    pt = Path(tempfile.mkdtemp()) / "ref.pt"
    store.get_file(f"refs/{ref.source}/{ref.op}.pt", pt)
    child = run_in_child(kernel_vs_compile_child, (ref, str(pt), source, args.flush, args.compile_mode, args.device),
                         timeout_s=900,
                         env=spec.child_env())
    if not child.ok:
        row["child_error"] = child.error[-500:]
        return row
    t = row["timed"] = child.value
    row["child_s"] = time.time() - t0 - row["verify_s"]
    k, e, c = t.get("kernel", {}), t["eager"], t["compiled"]
    row["speedup"] = {"fwd_vs_eager": _ratio(e.get("fwd_ms"), k.get("fwd_ms")),
                      "fwd_bwd_vs_eager": _ratio(e.get("fwd_bwd_ms"), k.get("fwd_bwd_ms")),
                      "fwd_vs_compile": _ratio(c.get("fwd_ms"), k.get("fwd_ms")),
                      "fwd_bwd_vs_compile": _ratio(c.get("fwd_bwd_ms"), k.get("fwd_bwd_ms"))}
    return row


def search_all(refs, store, spec, gens, args) -> dict[str, dict]:
    """Phase A: every op's short search, --ops-per-device at once on the device (farm.search.batch:
    the device lease keeps each timing alone), stopped after --budget-s. Returns key -> row."""
    ctx = SearchContext(store, "bench", spec.target.name, [spec], gens,
                        SearchConfig(max_tasks=args.max_tasks, max_concurrent=2, chunk_size=8), EvalOptions(flush=args.flush))
    started: dict[str, float] = {}
    walls: dict[str, float] = {}
    finished: dict[str, dict] = {}  # kept as they come: an interrupted batch returns no rows

    def on_op(phase: str, row: dict) -> None:
        key = f"{row['source']}/{row['op']}"
        if phase == "start":
            started[key] = time.time()
        elif phase == "done":
            walls[key] = time.time() - started.get(key, time.time())
            finished[key] = {**row, "wall_s": walls[key]}
            print(f"search {key:40} {row['status']:9} {walls[key]:.0f} s", flush=True)

    timer = None
    if args.budget_s is not None:
        # SIGINT in budget_s: the batch stops its ops at their next candidate and keeps what they found
        timer = threading.Timer(args.budget_s, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
    try:
        search_batch(refs, ctx, on_op=on_op, ops_per_device=args.ops_per_device)
    except KeyboardInterrupt:
        print(f"search: stopped at the bench budget ({args.budget_s} s)", flush=True)
    finally:
        if timer:
            timer.cancel()
    return {ref.key: finished.get(ref.key) or _checkpointed_best(store, ref) for ref in refs}


def _search_verdict(store, ref, best_id: str) -> dict:
    """--no-reverify: the verdict the search gave the best (forward and backward verified on
    the .pt and the secret input sets), instead of a second Evaluator pass (about a minute per
    op on the H100)."""
    rec = Database.from_dict(store.read_json(f"runs/bench/{ref.source}/{ref.op}/state.json")["db"]).records[best_id]
    return {"verdict": rec.verdict, "reason": rec.reason, "backward": rec.backward, "from": "search record",
            "speedup_vs_model": rec.speedup_vs_model, "speedup_vs_reference": rec.speedup_vs_reference}


def _candidates(store, ref) -> list[dict]:
    """What the search spent its time on: each candidate's generator, verdict and seconds."""
    key = f"runs/bench/{ref.source}/{ref.op}/state.json"
    if not store.exists(key):
        return []
    return [{"id": r.id, "generator": r.generator, "verdict": r.verdict, "eval_s": r.eval_s, "stage_s": r.stage_s,
             "reason": r.reason[:200]}
            for r in Database.from_dict(store.read_json(key)["db"]).records.values()]


def _checkpointed_best(store, ref) -> dict:
    """An op the budget stopped: its best so far, from the search's checkpoint where it has one."""
    row = {"source": ref.source, "op": ref.op, "status": "stopped", "best_id": None}
    key = f"runs/bench/{ref.source}/{ref.op}/state.json"
    if store.exists(key):
        best = Database.from_dict(store.read_json(key)["db"]).best()
        row["best_id"] = best and best.id
    return row


def _cuda_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def _fmt(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "-"


def table(result: dict) -> str:
    lines = [f"Device: {result['device']}; search: generators {result['generators']}, max {result['max_tasks']} "
             f"candidates per op; timing: {result['timing_mode']}; compile: torch.compile mode {result['compile_mode']}.",
             f"Command: `{result['command']}`", "",
             "| op | best from | verified fwd+bwd | kernel fwd ms | kernel fwd+bwd ms | fwd vs eager | fwd+bwd vs eager "
             "| fwd vs compile | fwd+bwd vs compile |", "|---|---|---|---|---|---|---|---|---|"]
    for row in result["ops"]:
        k = row.get("timed", {}).get("kernel", {})
        s = row.get("speedup", {})
        ev = row.get("evaluator", {})
        verified = "yes" if (ev.get("backward") or {}).get("verified") else (
            ev.get("verdict") or (row["error"][:60] if row.get("error") else "no candidate"))
        lines.append(f"| {row['task']} | {row['best_origin']} | {verified} | {_fmt(k.get('fwd_ms'))} | "
                     f"{_fmt(k.get('fwd_bwd_ms'))} | {_fmt(s.get('fwd_vs_eager'))} | {_fmt(s.get('fwd_bwd_vs_eager'))} | "
                     f"{_fmt(s.get('fwd_vs_compile'))} | {_fmt(s.get('fwd_bwd_vs_compile'))} |")
    if result.get("attention"):
        lines += ["", "FlashAttention (Triton, training/flash_attention_triton) vs scaled_dot_product_attention, "
                      "batch 4, 16 heads, head dim 64, fp16, causal (ms, fwd / fwd+bwd):", "",
                  "| seq | SDPA eager | SDPA compiled | Triton kernel | fwd+bwd vs SDPA | fwd+bwd vs compiled |",
                  "|---|---|---|---|---|---|"]
        for row in result["attention"]:
            cell = {n: f"{_fmt(row[n].get('fwd_ms'))} / {_fmt(row[n].get('fwd_bwd_ms'))}"
                    for n in ("sdpa", "sdpa_compiled", "kernel")}
            lines.append(f"| {row['seq']} | {cell['sdpa']} | {cell['sdpa_compiled']} | {cell['kernel']} | "
                         f"{_fmt(_ratio(row['sdpa'].get('fwd_bwd_ms'), row['kernel'].get('fwd_bwd_ms')))} | "
                         f"{_fmt(_ratio(row['sdpa_compiled'].get('fwd_bwd_ms'), row['kernel'].get('fwd_bwd_ms')))} |")
    return "\n".join(lines) + "\n"


def write_docs(path: Path, text: str) -> None:
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"error: {path} has no {BEGIN} ... {END} block to replace")
    path.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{text}{END}", doc,
                           flags=re.DOTALL))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--ops", nargs="*", help="training ops (default: all of the source)")
    parser.add_argument("--max-tasks", type=int, default=8)
    parser.add_argument("--generators", default="tune,inductor")
    parser.add_argument("--flush", choices=timing.FLUSH_MODES, default="write")
    parser.add_argument("--seqs", nargs="*", type=int, default=list(SEQS))
    parser.add_argument("--device", default="cuda:0", help="cuda:N; cpu only to smoke-test this script")
    parser.add_argument("--shapes", default="bench", help="bench (the tasks' shapes) or small (smoke tests)")
    parser.add_argument("--docs", type=Path, help="markdown file whose training-bench block gets the table")
    parser.add_argument("--compile-mode", default=COMPILE_MODE, help="torch.compile mode of the compiled columns")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="the search phase stops after this many seconds; the ops keep their best so far")
    parser.add_argument("--jobs", type=int, default=4, help="ops whose reference data is made at once")
    parser.add_argument("--ops-per-device", type=int, default=4,
                        help="ops searched at once on the device (timings stay exclusive: farm.evaluate.lease)")
    parser.add_argument("--reverify", action=argparse.BooleanOptionalAction, default=True,
                        help="re-evaluate each best in a fresh Evaluator (default) or take the search's verdict")
    parser.add_argument("--store", help="folder of the bench's store (default: a new temporary one)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the ops OUT's JSON already timed; search and time the others (with --store)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="no op is timed after this many seconds of the call (the next --resume call goes on)")
    args = parser.parse_args()

    started = time.time()
    spec = resolve_device(args.device)
    settings, _ = load_settings()
    # a store that outlives the call lets the next call on a warm machine go on (--store, --resume)
    store = open_store(f"file://{args.store or tempfile.mkdtemp(prefix='farm-train-bench-')}")
    refs = taskfiles.find_tasks(settings, ["training"], args.ops or None)
    made = {(r["source"], r["op_name"]): r
            for r in generate_references(refs, store, spec, 0, args.shapes, 600, jobs=args.jobs)}
    # inductor: its default mode only; max-autotune seeds cost minutes per op
    gens = [load_generator(g, modes=("default",)) if g == "inductor" else load_generator(g)
            for g in args.generators.split(",")]
    result = {"device": spec.label if spec.target.name == "cpu" else _cuda_name(),
              "generators": args.generators, "max_tasks": args.max_tasks,
              "timing_mode": timing_mode(args.flush, spec.target.name), "compile_mode": args.compile_mode,
              "command": "python bench/training_gpu.py " + " ".join(sys.argv[1:]), "ops": [], "attention": []}
    name = re.sub(r"\W+", "_", result["device"].lower()).strip("_")
    args.out.mkdir(parents=True, exist_ok=True)
    out_json = args.out / f"training_{name}.json"
    done = {}
    if args.resume and out_json.exists():
        done = {r["task"]: r for r in json.loads(out_json.read_text())["ops"] if r.get("timed") or r.get("evaluator")}
    best_attention = None
    usable = [ref for ref in refs if made[(ref.source, ref.op)]["success"]]
    searched = search_all([r for r in usable if r.key not in done], store, spec, gens, args)
    for ref in refs:
        if not made[(ref.source, ref.op)]["success"]:
            result["ops"].append({"task": ref.key, "best_origin": "-", "error": made[(ref.source, ref.op)]["error"]})
            continue
        if ref.key in done:
            row = done[ref.key]
        elif args.deadline_s is not None and time.time() - started > args.deadline_s:
            row = {"task": ref.key, "best_origin": "-", "error": "not timed (bench deadline)"}
        else:
            row = bench_op(ref, store, spec, searched[ref.key], args)
        result["ops"].append(row)
        if ref.op == "flash_attention_triton" and row.get("evaluator", {}).get("verdict") == "pass":
            best_attention = store.get_bytes(
                f"runs/bench/{ref.source}/{ref.op}/candidates/{row['search']['best_id']}.py").decode()
        if "search" in row:
            print(f"{ref.key:40} {row['search']['status']:9} best {row['best_origin']:6} "
                  f"{json.dumps(row.get('speedup', {}))}", flush=True)
        out_json.write_text(json.dumps(result, indent=2, default=str))
    if args.seqs:
        [fa] = taskfiles.find_tasks(settings, ["training"], ["flash_attention_triton"])
        source = best_attention or model_as_candidate(fa.path.read_text())
        child = run_in_child(attention_child, (source, args.seqs, args.flush, args.device, args.compile_mode),
                             timeout_s=900,
                             env=spec.child_env())
        result["attention"] = child.value if child.ok else []
        result["attention_kernel"] = "search best" if best_attention else "the task's Model"
        if not child.ok:
            result["attention_error"] = child.error[-500:]
    out_json.write_text(json.dumps(result, indent=2, default=str))
    text = table(result)
    (args.out / f"training_{name}.md").write_text(text)
    print(text)
    if args.docs:
        write_docs(args.docs, text)


if __name__ == "__main__":
    main()
