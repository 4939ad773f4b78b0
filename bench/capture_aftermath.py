"""Does a failed CUDA-graph capture change a process's later per-call figures? (issue 19)

The evaluator picks an op's timing mode by trying to capture the original (Model) in a CUDA
graph in the trusted runner; where the forward synchronises with the host the capture fails and
the op is timed per call, the Model in that same runner, the candidates in theirs, which never
tried. This times each given task's Model with triton.testing.do_bench (events, 256 MB flush)
in a fresh process, then lets farm.evaluate.timing.capture_graph fail on it, then times it
again, alternating with a second, untouched copy of the Model whose calls never saw a capture.

    python bench/capture_aftermath.py TASK.py [TASK.py ...] [--rounds 7]

Prints one line per task: before, after (same Model), untouched copy, all in us (medians).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"aftermath_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cuda(x):
    import torch

    return x.cuda() if isinstance(x, torch.Tensor) else x


def one(path: Path, rounds: int) -> str:
    import torch
    import triton.testing as tt

    from farm.evaluate import timing
    from farm.targets import resolve_device

    task = _load(path)
    torch.manual_seed(0)
    init = [_cuda(x) for x in task.get_init_inputs()]
    a = task.Model(*init).cuda().eval()
    b = task.Model(*init).cuda().eval()
    inputs = [_cuda(x) for x in task.get_inputs()]
    args_a = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    args_b = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    fa, fb = (lambda: a(*args_a)), (lambda: b(*args_b))

    def bench(fn):
        return tt.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3

    with torch.no_grad():
        fa(), fb()
        torch.cuda.synchronize()
        before = statistics.median(bench(fa) for _ in range(rounds))
        timer = timing.DeviceTimer(resolve_device(0, "cuda"))
        try:
            timing.capture_graph([fa] * 4, timer)
            captured = "captured"
        except timing.CaptureError as exc:
            captured = f"capture failed ({exc.kind})"
        torch.cuda.synchronize()
        pairs = [(bench(fa), bench(fb)) for _ in range(rounds)]
    after = statistics.median(p[0] for p in pairs)
    other = statistics.median(p[1] for p in pairs)
    return (f"{path.stem:40s} {captured:28s} before {before:8.2f} us  after {after:8.2f} us  "
            f"untouched copy {other:8.2f} us  after/before {after / before:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for path in args.tasks:
        try:
            print(one(path, args.rounds), flush=True)
        except Exception as exc:  # noqa: BLE001 - one task's failure is its line, not the run's
            print(f"{path.stem:40s} error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
