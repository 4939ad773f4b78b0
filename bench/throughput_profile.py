"""Where a search's device-minute goes (issue #17): the same batch search as
bench/throughput_gpu.py, one phase, with the evaluator's steps and the device lease's holds
timed from outside (wrappers installed by this script; the product code is unchanged).

Per wrapped function: calls, inclusive seconds. Per lease hold: phase, the evaluator method
that took it, seconds held and seconds waited for it. Per kind of comparison round (runner,
mode, whether it captured its graph): seconds against the device's own in it. The holds are what the device-minute
buys; the waits are other ops' turns.

usage (repository root):
    python bench/throughput_profile.py OUT --ops demo/row_sum sglang/merge_state_triton --max-tasks 4
    python bench/throughput_profile.py OUT --device cpu --quick
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from farm.evaluate import ahead, evaluator, lease, runner  # noqa: E402
from farm.evaluate.rounds import Comparison  # noqa: E402

CALLS: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
HOLDS: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
ROUNDS: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # kind -> calls, seconds, device seconds
_lock = threading.Lock()
_depth = threading.local()

WRAPPED = {
    evaluator.Evaluator: ("evaluate", "_compile", "_verify", "_put_probes", "_time", "_static", "_frontend",
                          "_start_runners", "baseline", "_time_baseline", "_all_cases", "_fwd_bwd_speedups"),
    Comparison: ("_compare_all", "_interleave", "op_timing", "_baseline_slots", "floor",
                 "_put_time_cases", "null_check", "_retime", "_check_timed_outputs", "_limit"),
    runner.Runner: ("start", "pin", "kill", "call", "with_inputs", "pause", "resume"),
    ahead.CompileAhead: ("prepare",),
}


def _timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        label = name
        if name.startswith("Runner.") and name.endswith(("call", "with_inputs")):
            label = f"{name}:{a[1]}"  # the runner command
        t0 = time.perf_counter()
        reply = None
        try:
            reply = fn(*a, **k)
            return reply
        finally:
            spent = time.perf_counter() - t0
            with _lock:
                row = CALLS[label]
                row[0] += 1
                row[1] += spent
                if label == "Runner.call:time_round" and isinstance(reply, dict) and reply.get("samples"):
                    _round_row(a[0], k, reply, spent)
    return wrapper


def _round_row(box, args: dict, reply: dict, spent: float) -> None:
    """A comparison round: its seconds against the device's (the replays', or the timed calls')."""
    graph = args.get("mode") == "graph"
    device_s = sum(reply["samples"]) * (args.get("calls") or 1 if graph else 1) / 1e3
    who = "trusted" if args.get("slot") else "candidate"
    key = f"{who} {args.get('mode')}{' captured' if reply.get('captured') else ''}"
    row = ROUNDS[key]
    row[0] += 1
    row[1] += spent
    row[2] += device_s


def _caller() -> str:
    frame = sys._getframe(2)
    skip = {"hold", "_device", "__enter__", "helper", "_timed_hold"}
    while frame is not None and (frame.f_code.co_name in skip or "contextlib" in frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "?"
    stage = frame.f_locals.get("stage") if frame.f_code.co_name == "evaluate" else None
    return f"evaluate:{stage}" if isinstance(stage, str) else frame.f_code.co_name


def install() -> None:
    for cls, names in WRAPPED.items():
        for n in names:
            if hasattr(cls, n):
                setattr(cls, n, _timed(f"{cls.__name__}.{n}", getattr(cls, n)))
    original = lease.DeviceLease.hold

    @contextmanager
    def hold(self, phase):
        who = _caller()
        t0 = time.perf_counter()
        with original(self, phase):
            t1 = time.perf_counter()
            try:
                yield
            finally:
                with _lock:
                    row = HOLDS[(phase, who)]
                    row[0] += 1
                    row[1] += time.perf_counter() - t1
                    row[2] += t1 - t0

    lease.DeviceLease.hold = hold


def main() -> None:
    import throughput_gpu as tg  # noqa: E402 - the same search, phase and options

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--phase", choices=tg.PHASES, default="before")
    ap.add_argument("--rest", default="", help="further bench/throughput_gpu.py options, one string")
    args, rest = ap.parse_known_args()
    install()
    argv = [str(args.out), "--phase", args.phase, *rest, *args.rest.split()]
    sys.argv = ["throughput_gpu.py", *argv]
    t0 = time.perf_counter()
    tg.main()
    wall = time.perf_counter() - t0
    calls = sorted(({"name": k, "calls": v[0], "s": v[1]} for k, v in CALLS.items()), key=lambda r: -r["s"])
    holds = sorted(({"phase": p, "by": w, "n": v[0], "held_s": v[1], "waited_s": v[2]}
                    for (p, w), v in HOLDS.items()), key=lambda r: -r["held_s"])
    rounds = [{"kind": k, "n": v[0], "s": v[1], "device_s": v[2]} for k, v in sorted(ROUNDS.items())]
    doc = {"phase": args.phase, "wall_s": wall, "calls": calls, "holds": holds, "rounds": rounds}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"profile_{args.phase}.json").write_text(json.dumps(doc, indent=2))
    lines = [f"phase {args.phase}, wall {wall:.1f} s", "",
             "| hold | by | n | held s | waited s |", "|---|---|---|---|---|"]
    lines += [f"| {h['phase']} | {h['by']} | {h['n']} | {h['held_s']:.2f} | {h['waited_s']:.2f} |" for h in holds]
    lines += ["", "| round | n | s | device s | ms per round beside the device's |", "|---|---|---|---|---|"]
    lines += [f"| {r['kind']} | {r['n']} | {r['s']:.2f} | {r['device_s']:.2f} | "
              f"{(r['s'] - r['device_s']) / r['n'] * 1e3:.1f} |" for r in rounds]
    lines += ["", "| function | calls | inclusive s |", "|---|---|---|"]
    lines += [f"| {c['name']} | {c['calls']} | {c['s']:.2f} |" for c in calls]
    (args.out / f"profile_{args.phase}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
