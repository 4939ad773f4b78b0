"""The size a large task is verified at: for a compact .pt (farm.reference.drawn), the task at
the largest derived shapes whose reference data ships in full, and that data, made on the
device at hand in a child process with the .pt's seed.

The compact .pt's inputs are a recipe and its outputs samples: an evaluator would have to move
the whole set through its runners for every check. Candidates of such a task are verified at
these fitted shapes instead (the profile's tolerances, its trials), where every value is there
to compare; docs/corpus.md says where they are timed.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from farm.corpus.tasks import TaskRef
from farm.errors import FarmError
from farm.runtime.children import run_in_child
from farm.targets import DeviceSpec

UNBOUNDED_MFLOP = 1e12  # the device runs the fitted shapes: only memory bounds them


def fit_ref(ref: TaskRef, budget_mb: float) -> TaskRef:
    """The task whose `small` shape set is the largest derived one within `budget_mb` of inputs,
    parameters and outputs (SMALL_SHAPES or corpus.shapes, where given, still win)."""
    policy = dataclasses.replace(ref.policy, small_budget_mb=budget_mb, small_budget_mflop=UNBOUNDED_MFLOP)
    return dataclasses.replace(ref, policy=policy)


def fitted(ref: TaskRef, data: dict, spec: DeviceSpec, timeout_s: float = 600.0) -> tuple[TaskRef, dict]:
    """(ref, data) unchanged for a .pt that ships its inputs; for a compact one, the fitted task
    and its reference data in full, marked with where it comes from ("fitted")."""
    if data.get("save_inputs") is not False:
        return ref, data
    from farm.reference.generate import load_pt, reference_child

    budget = float(data.get("ship_max_mb") or 256.0)
    small = fit_ref(ref, budget)
    with tempfile.TemporaryDirectory(prefix="farm-fit-") as tmp:
        path = Path(tmp) / "fit.pt"
        outcome = run_in_child(reference_child, (small, spec, int(data.get("seed", 0)), "small", str(path),
                                                 data.get("reference_class"), 0, 0, -1),
                               timeout_s=timeout_s, env=spec.child_env())
        if not outcome.ok:
            last = (outcome.error or "").strip().splitlines()[-1:] or [outcome.stage]
            raise FarmError(f"{ref.path}: no shapes within {budget:g} MiB to verify its candidates at "
                            f"({outcome.stage}): {last[0]}")
        fit = load_pt(path)
    fit["fitted"] = {"from_shapes": data.get("shapes", "bench"), "budget_mb": budget,
                     "input_shapes": [list(s) if s is not None else None for s in fit["input_shapes"]]}
    return small, fit
