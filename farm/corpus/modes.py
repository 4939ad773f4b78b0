"""Which truth a task has: its Reference class, or the original Model's recorded outputs.

A class named `Reference` is always the truth. AKG's files name their comparison class
`ModelSglang`, `ModelSGLang`, `ModelVLLM` or `ModelTorch`; many of those call into sglang, sgl_kernel or
vllm (sometimes only inside forward), which a farm host does not have. Such a class is used
as Reference only when it runs without them, and that is decided by trying: in the task's
own child process, on the CPU, with the small inputs (or, where none can be derived, the file's own).
A class that names one of those packages in its source is not tried. Otherwise the task is
in reference-data mode: the original Model's outputs on the reference platform are the truth
(farm.reference stores secret input sets beside the .pt for it).

Trials are remembered per file content (sha256) in a small JSON file, so `farm ops list`
pays for a trial once per version of a file.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from farm import paths, pyast
from farm.corpus import tasks as taskfiles
from farm.corpus.tasks import TaskRef
from farm.errors import TaskError

FRAMEWORKS = ("sglang", "sgl_kernel", "vllm")
_FRAMEWORK_RE = re.compile(r"\b(?:from|import)\s+(" + "|".join(FRAMEWORKS) + r")\b")
TRIAL_TIMEOUT_S = 60.0
TRIAL_VERSION = 1  # bump when the trial itself changes: older verdicts are tried again


@dataclass(frozen=True)
class Mode:
    mode: str  # taskfiles.MODES
    reference: str | None  # the class used as Reference, if any
    reason: str

    def as_dict(self) -> dict:
        return {"mode": self.mode, "reference_class": self.reference, "mode_reason": self.reason}


def framework_import(path: Path, name: str) -> str | None:
    """The serving framework that class `name` of the file imports in its own body, if any."""
    import ast

    text = path.read_text(errors="replace")
    try:
        tree = pyast.parse(text)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            found = _FRAMEWORK_RE.search(ast.get_source_segment(text, node) or "")
            return found.group(1) if found else None
    return None


def cache_path() -> Path:
    return paths.cache_file("reference-trials.json")


def _read_cache() -> dict:
    return paths.read_cache(cache_path())


def _write_cache(key: str, value: dict) -> None:
    paths.write_cache(cache_path(), key, value)


def trial_child(report: Callable[[str], None], ref: TaskRef, name: str) -> dict:
    """In the child, on the CPU: build the comparison class and run one forward."""
    import torch

    from farm.corpus.inputs import draw_init_inputs, draw_inputs
    from farm.runtime.tensors import clone_values, seed_all

    report("import")
    try:
        task = taskfiles.load_task(ref, "small", reference=name)
    except TaskError as exc:
        if exc.rule != taskfiles.NO_SMALL_SHAPES:
            raise
        # sizes chosen inside get_inputs (AKG's attention_kernels/): the file's own shapes, which
        # the memory guard still checks before anything is allocated
        task = taskfiles.load_task(ref, "bench", reference=name)
    report("inputs")
    init_inputs = draw_init_inputs(task, 0)
    inputs = draw_inputs(task, 0)
    report("init")
    seed_all(0)
    if task.reference_cls is None:  # the file's first comparison class is another one
        raise TaskError(ref.path, f"has no class {name} that serves as its Reference")
    model = task.reference_cls(*init_inputs).eval()
    report("forward")
    with torch.no_grad():
        model(*clone_values(inputs))
    return {"ok": True}


def resolve(task: taskfiles.Task, timeout_s: float = TRIAL_TIMEOUT_S, use_cache: bool = True) -> Mode:
    """The mode of a statically loaded task (loaded without `reference=`)."""
    reference = task.reference_cls.__name__ if task.reference_cls is not None else None
    return decide(task.ref, task.mode, task.comparison, reference, task.mode_reason, timeout_s, use_cache)


def decide(ref: TaskRef, mode: str, comparison: str | None, reference: str | None, reason: str,
           timeout_s: float = TRIAL_TIMEOUT_S, use_cache: bool = True) -> Mode:
    """From what the static load found (taskfiles.load_task) to the task's mode."""
    if reference is not None:
        return Mode("reference", reference, reason)
    name = comparison
    if name is None or mode != "reference-data":
        return Mode(mode, None, reason)
    used = framework_import(ref.path, name)
    if used:
        return Mode("reference-data", None, f"class {name} imports {used}: the original Model's outputs on the "
                                            "reference platform are the truth")
    sha = hashlib.sha256(ref.path.read_bytes()).hexdigest()
    key = f"v{TRIAL_VERSION}:{sha}:{name}"
    cached = _read_cache().get(key) if use_cache else None
    if cached is None:
        cached = _trial(ref, name, timeout_s)
        if cached.get("decided"):
            _write_cache(key, cached)
    if cached["ok"]:
        return Mode("reference", name, f"class {name} runs without {'/'.join(FRAMEWORKS)} (tried on the CPU)")
    return Mode("reference-data", None, f"class {name} did not run on the CPU ({cached['why']}): the original "
                                        "Model's outputs on the reference platform are the truth")


def static_child(report: Callable[[str], None], ref: TaskRef, shapes: str) -> dict:
    """In a child: what loading the file says, for a caller that must not execute task code."""
    report("import")
    task = taskfiles.load_task(ref, shapes)
    return {"mode": task.mode, "comparison": task.comparison, "reason": task.mode_reason,
            "reference": task.reference_cls.__name__ if task.reference_cls is not None else None}


def _trial(ref: TaskRef, name: str, timeout_s: float) -> dict:
    from farm.runtime.children import run_in_child
    from farm.targets import resolve_device

    spec = resolve_device("cpu")
    outcome = run_in_child(trial_child, (ref, name), timeout_s=timeout_s, env=spec.child_env())
    if outcome.ok:
        return {"ok": True, "decided": True, "why": ""}
    lines = [line for line in outcome.error.strip().splitlines() if line.strip()]
    why = lines[-1] if lines else outcome.status
    why = why.split("TaskError: ", 1)[-1][:300]
    # only a failure of the class itself is remembered: a timeout says more about this host's
    # load, and a failure drawing the inputs about the farm's input rules, which may change
    return {"ok": False, "decided": outcome.status == "raised" and outcome.stage in ("init", "forward"),
            "why": f"{outcome.stage}: {why}"}


def resolve_ref(ref: TaskRef, shapes: str = "bench", timeout_s: float = TRIAL_TIMEOUT_S):
    """The mode of a task, every line of the task's code run in children: a Mode, or the
    ChildOutcome of a file that could not even be loaded (its stage and error)."""
    from farm.runtime.children import run_in_child
    from farm.targets import resolve_device

    outcome = run_in_child(static_child, (ref, shapes), timeout_s=timeout_s,
                           env=resolve_device("cpu").child_env())
    if not outcome.ok:
        return outcome
    v = outcome.value
    return decide(ref, v["mode"], v["comparison"], v["reference"], v["reason"], timeout_s)


def load_resolved(ref: TaskRef, shapes: str = "bench", reference: str | None = None,
                  mode: str | None = None) -> taskfiles.Task:
    """A task with its truth decided: from the reference data's record when it has one
    (`reference`/`mode` as stored in the .pt), else by `resolve`."""
    if mode is not None:
        return taskfiles.load_task(ref, shapes, reference=reference)
    task = taskfiles.load_task(ref, shapes)
    decided = resolve(task)
    if decided.reference and task.reference_cls is None:
        try:
            return taskfiles.load_task(ref, shapes, reference=decided.reference)
        except TaskError:
            return task
    return task


def as_recorded(task: taskfiles.Task, ref_data: dict) -> taskfiles.Task:
    """The task with the inputs its Model was seen to change in place when the reference data
    was made (the .pt's `mutated_inputs`) added to its in-place arguments: AKG's files write into
    buffers they are passed without declaring INPLACE_ARGS, and a candidate must be allowed to
    do what the original does."""
    import dataclasses

    recorded = set(ref_data.get("mutated_inputs") or ())
    if recorded <= set(task.inplace_args):
        return task
    return dataclasses.replace(task, inplace_args=tuple(sorted(recorded | set(task.inplace_args))))
