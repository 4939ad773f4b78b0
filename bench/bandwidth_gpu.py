"""Bandwidth ceilings of the large memory-bound tasks, and what tune's knobs do to them (GPU).

For the tasks that miss issue #5's bar (85% of copy bandwidth), three kinds of numbers, all
timed like every candidate (farm.evaluate.timing: flushed, event-timed median):

copy     a device-to-device copy moving the same bytes (read + write) as the task: what the
         bar's "copy bandwidth" (measured on 2 GiB) becomes at the task's size, under the same
         flush-before-each-repetition timing;
knobs    the task's own kernel (or the inductor seed) at points of tune's knob space;
ceiling  a hand-written best-effort kernel per task (one read of each input, one write of
         each output, wide blocks). These are MEASUREMENTS of how close to the bar a kernel
         can get at the task's shape; they are never search results or candidates.

Every variant's output is checked against Reference before it is timed.

usage: python bench/bandwidth_gpu.py OUT [--tasks vllm_triton/log_softmax_kernel ...] [--budget-s 420]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.config import load_settings  # noqa: E402
from farm.corpus import tasks as taskfiles  # noqa: E402
from farm.evaluate import timing
from farm.generators.base import Context, model_as_candidate  # noqa: E402
from farm.generators.tune import apply, find_knobs  # noqa: E402
from farm.targets import resolve_device  # noqa: E402

SPEC = resolve_device("cuda:0")
CEILINGS = Path(__file__).resolve().parent / "ceiling_kernels.py"


def median_ms(fn) -> float:
    return timing.measure(fn, timing.DeviceTimer(SPEC), min_reps=20).median_ms


def copy_fraction(traffic: int, big_bw: float) -> dict:
    """A copy moving `traffic` bytes (half read, half written), as a fraction of the 2 GiB copy."""
    import torch

    src = torch.empty(traffic // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return {"bytes": traffic, "ms": ms, "fraction": traffic / (ms / 1e3) / big_bw}


def copy_clean_fraction(traffic: int, big_bw: float, reps: int = 50) -> float:
    """The same copy, but after the flush a 128 MiB read evicts the flush's dirty lines from L2
    before the copy starts: how much of the copy's loss at small sizes is write-back of the
    flush buffer (the timing method), not the copy itself."""
    import statistics

    import torch

    timer = timing.DeviceTimer(SPEC)
    clean = torch.ones(2**27, dtype=torch.uint8, device="cuda")
    src = torch.empty(traffic // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        timer.flush()
        clean.sum()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return traffic / (statistics.median(times) / 1e3) / big_bw


def load_source(source: str, name: str):
    """A candidate's source as a module (from a real file: triton.jit reads its own source)."""
    path = Path(tempfile.mkdtemp(prefix="farm-bw-")) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def close(got, want) -> bool:
    import torch

    got = got if isinstance(got, (list, tuple)) else [got]
    want = want if isinstance(want, (list, tuple)) else [want]
    return all(torch.allclose(g.float(), w.float(), atol=2e-2, rtol=2e-2, equal_nan=True) for g, w in zip(got, want))


class TaskBench:
    """One task at its benchmark shapes: inputs, Reference outputs, traffic, and a timer."""

    def __init__(self, ref: taskfiles.TaskRef, big_bw: float):
        import torch

        from farm.runtime.tensors import to_device

        self.ref = ref
        self.task = taskfiles.load_task(ref, "bench")
        torch.manual_seed(0)
        self.init = self.task.init_inputs()
        self.inputs = to_device(self.task.inputs(), "cuda")
        with torch.no_grad():
            self.want = self.task.truth_cls(*self.init).cuda()(*self.inputs)
        outs = self.want if isinstance(self.want, (list, tuple)) else [self.want]
        self.traffic = sum(t.numel() * t.element_size() for t in list(self.inputs) + list(outs)
                           if isinstance(t, torch.Tensor))
        self.big_bw = big_bw
        self.rows: list[dict] = []

    def time(self, label: str, forward, traffic: int | None = None, check: bool = True) -> dict:
        """traffic: bytes the variant moves when not the task's (a stream bound); check=False:
        its output is not the task's and is not compared."""
        import torch

        traffic = traffic or self.traffic
        row = {"task": self.ref.key, "variant": label}
        try:
            with torch.no_grad():
                ok = close(forward(*self.inputs), self.want) if check else True
                row["correct"] = ok
                if ok:
                    row["ms"] = median_ms(lambda: forward(*self.inputs))
                    row["fraction"] = traffic / (row["ms"] / 1e3) / self.big_bw
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile is a row, not a crash
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        self.rows.append(row)
        print(f"  {self.ref.key:34} {label:58} {row.get('ms', 0):.4f} ms  {row.get('fraction', 0):.3f}"
              f"{'' if row.get('correct') else '  ' + row.get('error', 'WRONG')}", flush=True)
        return row

    def source_variant(self, label: str, source: str):
        module = load_source(source, f"v_{abs(hash(label))}")
        return self.time(label, module.ModelNew(*self.init).cuda())

    def knob_points(self, source: str, points: list[dict[str, int]], prefix: str = ""):
        """The source at several knob assignments, knobs named as tune names them."""
        knobs = {k.name: k for k in find_knobs(source)}
        for point in points:
            label = prefix + ", ".join(f"{n.split('.')[-1]}={v}" for n, v in point.items())
            self.source_variant(label, apply(source, {knobs[n]: v for n, v in point.items()}))


def with_kwargs(source: str, launch: str, extra: str) -> str:
    """The source with `extra` keyword arguments added to the launch of kernel `launch`
    (exploration only: the tune generator's own insertion is what the search uses)."""
    import ast

    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                and getattr(node.func.value, "id", None) == launch):
            last = (node.keywords or node.args)[-1]
            line = lines[last.end_lineno - 1]
            lines[last.end_lineno - 1] = line[:last.end_col_offset] + ", " + extra + line[last.end_col_offset:]
            return "".join(lines)
    raise ValueError(f"no launch of {launch}")


def inductor_seed(bench: TaskBench, mode: str) -> str | None:
    from farm.generators.inductor.generator import InductorGenerator

    gen = InductorGenerator(modes=(mode,), timeout_s=240)
    ctx = Context(task_code=bench.ref.path.read_text(), op=bench.ref.op, source=bench.ref.source,
                  target="cuda", device={"label": "cuda:0", "shapes": "bench"})
    seeds = gen.initial_candidates(ctx)
    if not seeds:
        print(f"  inductor {mode}: no seed: {gen.reasons}", flush=True)
        return None
    return seeds[0].source


# ------------------------------------------------------------------------------ per task


def log_softmax(bench: TaskBench, ceil) -> None:
    src = model_as_candidate(bench.ref.path.read_text())
    points = [{"_log_softmax_kernel.BLOCK_SIZE": b, "_log_softmax_kernel.num_warps": w}
              for b in (1024, 4096, 8192, 16384, 32768) for w in (4, 8, 16, 32)]
    bench.knob_points(src, points)
    for stages in (1, 2, 4):
        knobs = {k.name: k for k in find_knobs(src)}
        staged = with_kwargs(apply(src, {knobs["_log_softmax_kernel.BLOCK_SIZE"]: 4096,
                                         knobs["_log_softmax_kernel.num_warps"]: 16}),
                             "_log_softmax_kernel", f"num_stages={stages}")
        bench.source_variant(f"BLOCK_SIZE=4096, num_warps=16, num_stages={stages}", staged)
    for warps in (16, 32):
        bench.time(f"ceiling: one pass, row in registers, warps={warps}",
                   lambda x, w=warps: ceil.log_softmax_one_pass(x, w))


def merge_attn_states(bench: TaskBench, ceil) -> None:
    import torch

    src = model_as_candidate(bench.ref.path.read_text())
    for warps in (1, 2, 4, 8):
        bench.source_variant(f"Model num_warps={warps}", with_kwargs(src, "_merge_attn_states_kernel",
                                                                      f"num_warps={warps}"))
    seed = inductor_seed(bench, "default")
    if seed:
        inductor_points(bench, seed)
    out = torch.empty_like(bench.inputs[0])
    bench.time("ceiling: stream bound, torch.add of the two outputs (2 reads, 1 write, no LSE)",
               lambda p, pl, s, sl: torch.add(p, s, out=out), traffic=3 * out.numel() * out.element_size(),
               check=False)
    for tokens, warps in ((1, 4), (1, 8), (2, 8), (4, 8), (4, 16)):
        bench.time(f"ceiling: [H, D] tile per token, {tokens} token(s)/program, warps={warps}",
                   lambda *a, t=tokens, w=warps: ceil.merge_per_token(*a, tokens=t, warps=w))


def rotary_embedding(bench: TaskBench, ceil) -> None:
    seed = inductor_seed(bench, "default")
    if seed:
        inductor_points(bench, seed)
    for bt, warps in ((8, 4), (16, 4), (16, 8), (32, 8)):
        bench.time(f"ceiling: {bt} tokens/program, q and k, warps={warps}",
                   lambda *a, b=bt, w=warps: ceil.rope_neox(*a, block_t=b, warps=w))


def experts_combine(bench: TaskBench, ceil) -> None:
    src = model_as_candidate(bench.ref.path.read_text())
    bench.knob_points(src, [{"experts_combine_kernel.num_warps": w} for w in (4, 8, 16, 32)])


def inductor_points(bench: TaskBench, seed: str) -> None:
    """The inductor seed as captured, then its block size x num_warps (tune's knobs)."""
    bench.source_variant("inductor seed (default mode)", seed)
    knobs = find_knobs(seed)
    blocks = [k for k in knobs if k.kind == "block"]
    warps = [k for k in knobs if k.kind == "warps"]
    print(f"  inductor seed knobs: {[(k.name, k.value) for k in knobs]}", flush=True)
    if len(blocks) != 1 or len(warps) != 1:
        return
    b, w = blocks[0], warps[0]
    for xb in (512, 1024, 2048, 4096, 8192):
        for nw in (2, 4, 8, 16):
            if (xb, nw) != (b.value, w.value):
                bench.source_variant(f"inductor {b.name.split('.')[-1]}={xb}, num_warps={nw}",
                                     apply(seed, {b: xb, w: nw}))


PER_TASK = {
    "vllm_triton/log_softmax_kernel": log_softmax,
    "vllm_triton/merge_attn_states": merge_attn_states,
    "vllm_torch/rotary_embedding": rotary_embedding,
    "sglang/experts_combine_kernel": experts_combine,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--tasks", nargs="*", default=list(PER_TASK))
    args = parser.parse_args()
    import torch

    started = time.time()
    ceil = load_source(CEILINGS.read_text(), "ceiling_kernels")
    big = copy_fraction(2 * 2**30, 1.0)
    big_bw = big["bytes"] / (big["ms"] / 1e3)
    print(f"copy bandwidth (2 GiB moved): {big_bw / 1e12:.3f} TB/s", flush=True)
    settings, _ = load_settings()
    doc = {"device": torch.cuda.get_device_name(), "copy_bw_bytes_s": big_bw, "copies": [], "rows": []}
    for key in args.tasks:
        source, op = key.split("/")
        [ref] = taskfiles.find_tasks(settings, [source], [op])
        bench = TaskBench(ref, big_bw)
        doc["copies"].append({"task": key, **copy_fraction(bench.traffic, big_bw),
                              "clean_l2_fraction": copy_clean_fraction(bench.traffic, big_bw)})
        print(f"{key}: {bench.traffic / 2**20:.1f} MiB moved; a copy of that size reaches "
              f"{doc['copies'][-1]['fraction']:.3f} of the 2 GiB copy "
              f"({doc['copies'][-1]['clean_l2_fraction']:.3f} with the flush's dirty lines evicted first)",
              flush=True)
        PER_TASK[key](bench, ceil)
        doc["rows"] += bench.rows
        del bench
        torch.cuda.empty_cache()
        (args.out / "bandwidth.json").write_text(json.dumps(doc, indent=1))
    print(f"\n{'task':34} {'copy@size':>9} {'clean L2':>8} {'best knob':>9} {'ceiling':>8}  "
          f"({time.time() - started:.0f} s)")
    for c in doc["copies"]:
        rows = [r for r in doc["rows"] if r["task"] == c["task"] and r.get("fraction")]
        knob = max((r["fraction"] for r in rows if not r["variant"].startswith("ceiling")), default=0)
        top = max((r["fraction"] for r in rows if r["variant"].startswith("ceiling")), default=0)
        print(f"{c['task']:34} {c['fraction']:9.3f} {c['clean_l2_fraction']:8.3f} {knob:9.3f} {top:8.3f}")


if __name__ == "__main__":
    main()
