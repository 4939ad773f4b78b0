"""How far apart do two processes time the same Model? (issue 19)

The evaluator times the Model in its trusted runner and a candidate in another process; for
ops whose forward synchronises with the host, the farm's ratios disagreed with a same-process
re-timing by up to 45% while a copy of the Model was the candidate. This starts two worker
processes that each load the task's Model and inputs and time it with triton.testing.do_bench
(events, 256 MB flush) in alternating rounds, and prints the ratio of the two (1.0 = no bias)
with its 95% interval, for each placement:

    free      the scheduler places both processes (as the evaluator's runners are)
    pinned    both pinned to one and the same core while they time (they never time at once)

    python bench/cross_process.py TASK.py [TASK.py ...] [--rounds 21] [--core N]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import sys
from pathlib import Path


def _worker(path: str, conn) -> None:
    import importlib.util

    import torch
    import triton.testing as tt

    spec = importlib.util.spec_from_file_location("xp_task", path)
    task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task)
    torch.manual_seed(0)
    cuda = (lambda x: x.cuda() if isinstance(x, torch.Tensor) else x)  # noqa: E731
    model = task.Model(*[cuda(x) for x in task.get_init_inputs()]).cuda().eval()
    args = [cuda(x) for x in task.get_inputs()]
    torch.set_grad_enabled(False)
    model(*args)
    torch.cuda.synchronize()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if msg[0] == "pin":
            os.sched_setaffinity(0, msg[1])
            conn.send("ok")
        else:
            conn.send(tt.do_bench(lambda: model(*args), warmup=25, rep=100, return_mode="median") * 1e3)


def _ratio_line(ratios: list[float]) -> str:
    logs = [math.log(r) for r in ratios]
    half = 2.086 * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.inf
    centre = statistics.fmean(logs)
    return (f"median {statistics.median(ratios):.3f} CI [{math.exp(centre - half):.3f}, {math.exp(centre + half):.3f}] "
            f"min {min(ratios):.3f} max {max(ratios):.3f}")


def one(path: Path, rounds: int, core: int) -> str:
    ctx = mp.get_context("spawn")
    workers = []
    for _ in range(2):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(str(path), child), daemon=True)
        proc.start()
        workers.append((proc, parent))
    for _, conn in workers:
        assert conn.recv() == "ready"

    def rounds_of() -> tuple[list[float], float]:
        ratios, firsts = [], []
        for _ in range(rounds):
            a = b = None
            for i, (_, conn) in enumerate(workers):
                conn.send(("bench",))
                if i == 0:
                    a = conn.recv()
                else:
                    b = conn.recv()
            ratios.append(a / b)
            firsts.append(a)
        return ratios, statistics.median(firsts)

    free, free_ms = rounds_of()
    for _, conn in workers:
        conn.send(("pin", {core}))
        conn.recv()
    pinned, pinned_ms = rounds_of()
    for proc, conn in workers:
        conn.send(None)
        proc.join(10)
    return (f"{path.stem:36s} free   ({free_ms:7.2f} us) {_ratio_line(free)}\n"
            f"{'':36s} pinned ({pinned_ms:7.2f} us) {_ratio_line(pinned)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)))
    args = parser.parse_args()
    for path in args.tasks:
        try:
            print(one(path, args.rounds, args.core), flush=True)
        except Exception as exc:  # noqa: BLE001 - one task's failure is its line, not the run's
            print(f"{path.stem:36s} error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
