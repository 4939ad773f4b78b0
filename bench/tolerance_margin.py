"""How often a correct kernel misses an op's tolerance on fresh random inputs.

Runs a candidate's ModelNew (or the task's own Model) and the task's Reference on N input sets
from the task's get_inputs() under fresh torch seeds, and counts the sets whose outputs miss the
farm's tolerance (farm.runtime.tolerance, with the task's TOLERANCE), with the largest absolute
difference seen. A correct kernel that misses on a few sets in a hundred sits at the
tolerance's edge: its accumulation order differs from Reference's by more than the tolerance
admits (bench/results/issue33/NOTES-2026-11-27.md, third part: demo/row_sum on the H100).

usage (repository root):
    python bench/tolerance_margin.py tasks/demo/row_sum.py --candidate CANDIDATE.py --sets 500 [--farm-defaults]
    python bench/tolerance_margin.py tasks/demo/row_sum.py --tune 2 --sets 500   # tune's third initial candidate on cuda
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.corpus import metadata  # noqa: E402
from farm.runtime.tensors import to_device  # noqa: E402
from farm.runtime.tolerance import all_ok, as_output_list, compare_outputs  # noqa: E402


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def margin(task_path: Path, candidate: Path | None, sets: int, device: str, seed: int = 1000,
           defaults: bool = False) -> dict:
    task = load(task_path, "task")
    init = list(getattr(task, "get_init_inputs", list)())
    kernels = {"Model": task.Model(*init).to(device)}
    if candidate is not None:
        kernels["candidate"] = load(candidate, "candidate").ModelNew(*init).to(device)
    truth_model = task.Reference(*init).to(device)
    tolerance = {} if defaults else metadata.tolerance(task_path, task)
    misses = {name: 0 for name in kernels}
    worst = {name: 0.0 for name in kernels}
    with torch.no_grad():
        for i in range(sets):
            torch.manual_seed(seed + i)
            inputs = to_device(list(task.get_inputs()), device)
            truth = [t.cpu() for t in as_output_list(truth_model(*inputs))]
            for name, kernel in kernels.items():
                got = [t.cpu() for t in as_output_list(kernel(*inputs))]
                misses[name] += not all_ok(compare_outputs(got, truth, tolerance))
                for g, t in zip(got, truth):
                    if g.is_floating_point():
                        worst[name] = max(worst[name], float((g.double() - t.double()).abs().max()))
    return {"task": str(task_path), "candidate": str(candidate) if candidate else None, "sets": sets,
            "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
            "tolerance": tolerance or "farm defaults", "misses": misses, "worst_abs_diff": worst}


def tune_candidate(task_path: Path, index: int, target: str = "cuda") -> Path:
    """The tune generator's `index`-th initial candidate for the task (0: the original Model;
    on cuda 1 and 2: its tiles x8 and x32), written beside nothing the farm reads."""
    import tempfile

    from farm.generators import load_generator
    from farm.generators.base import Context

    ctx = Context(task_code=task_path.read_text(), op=task_path.stem, source=task_path.parent.name, target=target)
    proposal = load_generator("tune").initial_candidates(ctx)[index]
    print(f"tune candidate {index}: {proposal.note}", file=sys.stderr)
    out = Path(tempfile.mkdtemp(prefix="tolerance-margin-")) / f"{task_path.stem}_tune{index}.py"
    out.write_text(proposal.source)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", type=Path)
    ap.add_argument("--candidate", type=Path, default=None, help="a candidate file with ModelNew")
    ap.add_argument("--tune", type=int, default=None, help="instead: the tune generator's initial candidate of this index")
    ap.add_argument("--sets", type=int, default=200)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--farm-defaults", action="store_true", help="the farm's default tolerance, not the task's TOLERANCE")
    args = ap.parse_args()
    candidate = tune_candidate(args.task, args.tune) if args.tune is not None else args.candidate
    print(json.dumps(margin(args.task, candidate, args.sets, args.device, defaults=args.farm_defaults), indent=1))


if __name__ == "__main__":
    main()
