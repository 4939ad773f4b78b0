"""What a runner command costs besides the device work it asks for (issue #17).

A search's device-minute went to hundreds of small runner commands per op (bench/
throughput_profile.py: about 30 ms per comparison round whose kernels run for a few). This
times the pieces of one command inside a runner built in this process (no sandbox, so no
pipe), on one op at a time: loading the task (a rebuild: the file's import, the module's
construction, the unload before it; and a load of the module kept from before), the unload
with and without the collector's view frozen, the tampering check that follows every command, a comparison round
in each mode, the per-call pass, one run; and, through a real sandboxed runner, the round
trip of an empty command.

usage (repository root):
    python bench/runner_overheads.py OUT --ops demo/row_sum sglang/merge_state_triton
    python bench/runner_overheads.py OUT --device cpu --ops demo/row_sum
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.config import load_settings  # noqa: E402
from farm.corpus import inputs as corpus_inputs  # noqa: E402
from farm.corpus import tasks as taskfiles  # noqa: E402
from farm.evaluate import runner_child  # noqa: E402
from farm.evaluate.runner import Limits, Runner  # noqa: E402
from farm.targets import resolve_device  # noqa: E402


def clock(fn, n: int = 5) -> float:
    """Median milliseconds of `n` calls of `fn`."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def one_op(ref, spec, sets: int, shapes: str) -> dict:
    import torch

    task = taskfiles.load_task(ref, shapes)
    init = corpus_inputs.draw_init_inputs(task, 0)
    runner = runner_child.ChildRunner(spec)
    runner.snapshot()
    keys = ["pt"] + [f"seed{i}" for i in range(sets - 1)]
    for i, key in enumerate(keys):
        runner.put_inputs(key, corpus_inputs.draw_inputs(task, i + 1))
    path, source = str(ref.path.resolve()), ref.source
    row = {"op": ref.key, "input_mb": sum(v.numel() * v.element_size() for v in runner.inputs["pt"]
                                          if isinstance(v, torch.Tensor)) / 2**20}
    row["import_task_ms"] = clock(lambda: taskfiles.load_task(taskfiles.ref_from_file(path, source), shapes))
    # a rebuild: the unload before it, the file's import, the construction (every load, before issue 17)
    row["rebuild_ms"] = clock(lambda: runner._build(path, source, shapes, "Model", init, None, None, None))
    row["unload_ms"] = clock(runner.unload)
    gc.freeze()  # as the runner does once started (runner_child.main)
    row["unload_frozen_ms"] = clock(runner.unload)
    gc.unfreeze()
    runner.load_task(path, source, shapes, "Model", init)
    row["load_task_kept_ms"] = clock(lambda: runner.load_task(path, source, shapes, "Model", init))
    runner.load_task(path, source, shapes, "Model", init, slot="Model")
    row["tampering_ms"] = clock(runner.tampering, 10)
    row["run_ms"] = clock(lambda: runner.run("pt", (), False, False))
    row["run_poisoned_ms"] = clock(lambda: runner.run("pt", (), True, False))
    for mode in ("events", "graph"):
        rkeys = keys[1:] if mode == "events" else keys[1:2]
        reply = runner.time_round("Model", rkeys, mode, 20, calls=64 if mode == "graph" else 0)
        if reply.get("ok") and not reply.get("capture_error"):
            row[f"round_{mode}_ms"] = clock(lambda rkeys=rkeys, mode=mode: runner.time_round("Model", rkeys, mode, 20,
                                                                       calls=64 if mode == "graph" else 0), 10)
            row[f"round_{mode}_device_ms"] = sum(reply["samples"]) * (64 if mode == "graph" else 1)
        else:
            row[f"round_{mode}"] = reply.get("capture_error") or reply.get("error", "")[-200:]
    runner.model = runner.models["Model"]
    row["time_pass_ms"] = clock(lambda: runner.time(keys[1:], {}, (), ()), 3)
    return row


def round_trip(spec) -> dict:
    box = Runner(spec, Limits())
    t0 = time.perf_counter()
    box.ensure_started()
    start = (time.perf_counter() - t0) * 1e3
    cmd = "device_limits" if spec.target.name == "cpu" else "put_inputs"  # the cheapest command of each
    ms = clock(lambda: box.call(cmd, 60, key="x", inputs=[]), 20)
    box.close()
    return {"start_ms": start, "empty_command_ms": ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--ops", nargs="+", required=True)
    ap.add_argument("--sets", type=int, default=6, help="input sets kept in the runner (the .pt's and secret ones)")
    args = ap.parse_args()
    spec = resolve_device(args.device)
    settings, _ = load_settings(overrides={"corpus.tasks_dir": ""})
    refs = [r for r in taskfiles.find_tasks(settings, sorted({k.split("/")[0] for k in args.ops})) if r.key in args.ops]
    doc = {"device": spec.label, "sandbox": round_trip(spec), "ops": []}
    for ref in refs:
        try:
            doc["ops"].append(one_op(ref, spec, args.sets, "small" if spec.target.interpret else "bench"))
        except Exception as exc:  # noqa: BLE001 - one op's failure is a row, not the end
            doc["ops"].append({"op": ref.key, "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(json.dumps(doc["ops"][-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runner_overheads.json").write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc["sandbox"]))


if __name__ == "__main__":
    main()
