"""The kernel-task corpus: find sources and ops, load task files in isolation, validate them.

Rules are those of docs/task-format.md; every violation is a TaskError naming the file and
the rule, never a bare traceback.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import itertools
import logging
import re
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.config import Settings
from farm.corpus import metadata
from farm.corpus.akg import AKG_CORPUS, akg_folders  # noqa: F401 - AKG_CORPUS: named here by tests and docs
from farm.corpus.outputs import check_outputs  # noqa: F401 - taskfiles.check_outputs, as callers know it
from farm.corpus.shapes import NoShapes, ShapePolicy, derive, measure, memory_limit_bytes
from farm.corpus.toplevel import run_top_level
from farm.errors import FarmError, InvalidName, TaskError
from farm.runtime.tensors import own_generator

if TYPE_CHECKING:  # torch is imported where a task is loaded: listing tasks needs none
    from torch import nn

# a leading '_' is allowed: AKG's corpus has ops named after private kernels (_compute_pid)
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
SHAPE_SETS = ("bench", "small")
NO_SMALL_SHAPES = "has no small shapes (no SMALL_SHAPES, none in corpus.shapes, none derivable)"
_TRITON_MARKERS = ("@triton.jit", "@triton.autotune", "triton.jit(")
# The class that holds the op's PyTorch semantics: ours, then the names AKG's files use for
# their comparison class (which may call into sglang/vllm: see farm.corpus.modes)
REFERENCE_CLASSES = ("Reference", "ModelSglang", "ModelSGLang", "ModelVLLM", "ModelTorch")
# How a task's outputs are judged (docs/task-format.md, "Modes"):
MODES = ("reference", "reference-data", "model")
NOT_TASKS = ("__init__.py",)  # package markers sit beside task files in some corpora
_counter = itertools.count()
log = logging.getLogger(__name__)
_exec_lock = threading.RLock()  # task files run one at a time (_exec_isolated)


def validate_name(name: str, what: str, option: str = "") -> str:
    """Source, op and run names become storage keys: nothing that could leave its prefix."""
    if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
        where = f" ({option})" if option else ""
        raise InvalidName(f"invalid {what} name {name!r}{where}: use letters, digits, '_', '-', '.', starting with "
                          "a letter or digit (no '..', no '/')")
    return name


@dataclass(frozen=True)
class TaskRef:
    """Where a task lives; cheap, no code executed."""

    source: str
    op: str
    path: Path
    policy: ShapePolicy = ShapePolicy()  # budgets and config shapes (farm.corpus.shapes)
    origin: str = "file"  # bundled (tasks/), akg (corpus.akg_root), config (corpus.sources), file

    @property
    def key(self) -> str:
        return f"{self.source}/{self.op}"

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


@dataclass
class Task:
    """A loaded, statically validated task file."""

    ref: TaskRef
    module: types.ModuleType
    shapes: str
    model_cls: type[nn.Module]
    reference_cls: type[nn.Module] | None
    mode: str = "reference"  # one of MODES
    comparison: str | None = None  # name of the file's Reference-like class, used or not
    mode_reason: str = ""
    tolerance: dict[str, tuple[float, float]] = field(default_factory=dict)
    inplace_args: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    doc: str = ""
    backward: bool = False  # BACKWARD: a training op, verified and timed forward and backward
    grad_inputs: tuple[int, ...] | None = None  # GRAD_INPUTS; None: every floating-point tensor input
    # where the small shapes come from: file (SMALL_SHAPES), config, derived, full (the file's
    # own shapes fit the small budget); "" for the bench shape set
    shape_origin: str = ""
    shape_overrides: dict[str, Any] = field(default_factory=dict)
    shape_note: str = ""
    input_kwargs: dict[str, Any] = field(default_factory=dict)  # get_inputs keywords of a space's case
    _guarded: bool = False
    _space: Any = None  # farm.corpus.space.ShapeSpace, found on first use
    # bytes a case may need where the space is found on a device whose memory is shared by
    # several jobs (farm.reference.generate); None: the host's budget alone
    device_budget_bytes: int | None = None
    _host_limit: int | None = None  # memory_limit_bytes read once: the space's largest case is sized by it

    @property
    def space(self):
        """Which dimensions vary and over what range (farm.corpus.space): declared or derived."""
        from farm.corpus.space import space_of

        return space_of(self)

    @property
    def truth_cls(self) -> type:
        """The class whose output is ground truth: Reference, else Model (pure PyTorch)."""
        return self.reference_cls or self.model_cls

    def init_inputs(self) -> list:
        self.guard()
        return self._call_list("get_init_inputs")

    def guard(self) -> None:
        """Stop before allocating what cannot fit: inputs, parameters and outputs are measured
        on the meta device against corpus.memory_limit_mb (half the available memory if 0)."""
        if self._guarded:
            return
        try:
            fp = measure(self.module, self.model_cls, self.input_kwargs)
        except Exception:  # noqa: BLE001 - a file the meta device cannot build is checked for real
            self._guarded = True
            return
        limit = self._host_limit = self._host_limit or memory_limit_bytes(self.ref.policy)
        if fp.total_bytes > limit:
            hint = ("set smaller shapes (corpus.shapes in the config, or SMALL_SHAPES in the file)"
                    if self.shapes == "small" else "use --shapes small")
            raise TaskError(self.ref.path, f"needs {fp.describe()} at {self.shapes} shapes (measured on the meta "
                                           f"device), over the memory limit of {limit / 2**30:.2f} GiB",
                            f"{hint}, or raise corpus.memory_limit_mb")
        self._guarded = True

    def inputs(self) -> list:
        self.guard()
        values = self._call_list("get_inputs")
        _check_forward_arity(self, len(values))
        return values

    def _call_list(self, name: str) -> list:
        try:
            values = getattr(self.module, name)(**(self.input_kwargs if name == "get_inputs" else {}))
        except Exception as exc:  # noqa: BLE001 - a task's own bug, reported against its file
            raise TaskError(self.ref.path, f"{name}() raised", f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(values, (list, tuple)):
            raise TaskError(self.ref.path, f"{name}() must return a list", f"got {type(values).__name__}")
        return list(values)


# ---------------------------------------------------------------- discovery


def discover_sources_with_origin(settings: Settings) -> dict[str, tuple[Path, str]]:
    """Every folder under tasks/, then corpus.akg_root's task folders, then corpus.sources.
    A later layer replaces a source of the same name as a whole (docs/corpus.md): tasks of
    one source never mix files of two corpora."""
    found: dict[str, tuple[Path, str]] = {}
    root = settings.tasks_dir()
    if root.is_dir():
        for sub in sorted(root.iterdir()):
            if sub.is_dir() and not sub.name.startswith((".", "_")) and any(sub.glob("*.py")):
                found[sub.name] = (sub, "bundled")
    if settings.corpus.akg_root:
        for name, folder in akg_folders(settings.corpus.akg_root).items():
            found[name] = (folder, "akg")
    for name, where in settings.corpus.sources.items():
        validate_name(name, "source", f"corpus.sources.{name}")
        path = Path(where).expanduser()
        if not path.is_dir():
            raise FarmError(f"corpus.sources.{name}: folder {path} does not exist")
        if name in found and found[name][1] == "bundled" and found[name][0].resolve() != path.resolve():
            # both would write refs/<name>/..., runs and kernels under the same keys; the layer that
            # replaces bundled sources on purpose is corpus.akg_root (docs/corpus.md)
            raise FarmError(f"corpus.sources.{name}: {path} has the name of the source {found[name][0]} "
                            "(bundled); give it a name of its own")
        found[name] = (path, "config")
    return found


def natural_key(text: str) -> tuple:
    """Sort key that orders digit runs by value: 2_x before 10_x before 100_x."""
    return tuple((0, int(part), part) if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part)


def natural_sorted(items, key=None) -> list:
    key = key or (lambda x: x)
    return sorted(items, key=lambda item: natural_key(str(key(item))))


def discover_sources(settings: Settings) -> dict[str, Path]:
    return {name: path for name, (path, _origin) in discover_sources_with_origin(settings).items()}


def list_ops(folder: Path) -> list[str]:
    return natural_sorted(p.stem for p in _task_files(folder) if NAME_RE.match(p.stem))


def shape_policy(settings: Settings, source: str, op: str) -> ShapePolicy:
    """The shape settings for one op: budgets, and config shapes ('<source>', then '<source>/<op>')."""
    corpus_cfg = settings.corpus
    overrides: dict[str, Any] = {}
    for key in (source, f"{source}/{op}"):
        for name, value in (corpus_cfg.shapes.get(key) or {}).items():
            overrides[name] = tuple(value) if isinstance(value, list) else value
    return ShapePolicy(small_budget_mb=corpus_cfg.small_budget_mb, small_budget_mflop=corpus_cfg.small_budget_mflop,
                       memory_limit_mb=corpus_cfg.memory_limit_mb, overrides=tuple(sorted(overrides.items())),
                       space_max=corpus_cfg.space_max, small_space_max=corpus_cfg.small_space_max,
                       op_overrides=tuple(sorted((corpus_cfg.shapes.get(f"{source}/{op}") or {}).keys())))


def misnamed_files(folder: Path) -> list[Path]:
    """Task files whose stem cannot be an op name (`bad name.py`, `-dash.py`): never loaded,
    but listed by `farm ops list` with the rule they break rather than silently left out."""
    return [p for p in _task_files(folder) if not NAME_RE.match(p.stem)]


def _task_files(folder: Path) -> list[Path]:
    """Every Python file of the folder is a task (a leading '_' included, as the existing tools
    take them), except package markers."""
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith(".") and p.name not in NOT_TASKS)


def find_tasks(settings: Settings, sources: list[str] | None = None, ops: list[str] | None = None,
               op_option: str = "--ops") -> list[TaskRef]:
    """The tasks selected by --source/--ops; an unknown name is an error that lists the known ones."""
    known_with_origin = discover_sources_with_origin(settings)
    known = {name: path for name, (path, _origin) in known_with_origin.items()}
    chosen = sources or list(known)
    for name in chosen:
        if name not in known:
            raise FarmError(f"unknown source '{name}' (--source); known: {', '.join(known) or 'none'}")
    refs = [TaskRef(s, op, known[s] / f"{op}.py", shape_policy(settings, s, op), known_with_origin[s][1])
            for s in chosen for op in list_ops(known[s])]
    misnamed = [p for s in chosen for p in misnamed_files(known[s])]
    for path in misnamed:  # never skipped without a word (farm ops list lists them too)
        log.warning("%s is left out: its name is not an op name (letters, digits, '_', '-', '.'; rename it)", path)
    if misnamed and not refs and not ops:
        raise FarmError(f"no usable task in source(s) {', '.join(chosen)}: {len(misnamed)} file(s) whose name is not "
                        f"an op name, e.g. {misnamed[0]} (rename them: letters, digits, '_', '-', '.')")
    if ops:
        wanted = set(ops)
        missing = wanted - {r.op for r in refs} - {r.key for r in refs}
        if missing:
            for name in missing:  # an unsafe name is a usage error of its own, named whole
                try:
                    for part in name.split("/", 1):
                        validate_name(part, "op", op_option)
                except InvalidName:
                    validate_name(name, "op", op_option)
            raise FarmError(f"unknown op(s) {', '.join(sorted(missing))} ({op_option}) in source(s) "
                            f"{', '.join(chosen)}")
        refs = [r for r in refs if r.op in wanted or r.key in wanted]
    return refs


def ref_from_file(path: str | Path, source: str = "local", settings: Settings | None = None,
                  policy: ShapePolicy | None = None) -> TaskRef:
    path = Path(path)
    if not path.is_file():
        raise FarmError(f"task file {path} does not exist")
    op = validate_name(path.stem, "op")
    if policy is None:
        policy = shape_policy(settings, source, op) if settings is not None else ShapePolicy()
    return TaskRef(source, op, path, policy)


# ---------------------------------------------------------------- loading


def load_task(ref: TaskRef, shapes: str = "bench", reference: str | None = None) -> Task:
    """Execute a task file as a fresh module and check its static rules.

    `reference` names a comparison class of AKG's (ModelSglang, ModelVLLM, ...) that
    farm.corpus.modes has found to run without sglang/vllm: it then serves as Reference. A
    class named `Reference` always does. Without either, a Triton task is in reference-data
    mode and a pure-PyTorch Model is its own truth."""
    if shapes not in SHAPE_SETS:
        raise FarmError(f"unknown shape set '{shapes}' (--shapes); use one of {', '.join(SHAPE_SETS)}")
    if not NAME_RE.match(ref.op) or ".." in ref.op:
        raise TaskError(ref.path, "has a file name that is not a valid op name",
                        "use letters, digits, '_', '-', '.' (no '..')")
    module = _exec_isolated(ref.path)
    model_cls = _require_module_class(ref, module, "Model")
    comparison = next((name for name in REFERENCE_CLASSES if getattr(module, name, None) is not None), None)
    reference_cls = None
    if comparison is not None:
        cls = _require_module_class(ref, module, comparison)
        if comparison == "Reference" or reference == comparison:
            reference_cls = cls
    elif reference is not None:
        raise TaskError(ref.path, f"has no class {reference}", "the reference data names it as the file's Reference")
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(getattr(module, fn, None)):
            raise TaskError(ref.path, f"must define {fn}()", "the farm calls it to build the op's arguments")
    source_text = ref.path.read_text(errors="replace")
    launches_triton = any(m in source_text for m in _TRITON_MARKERS)
    if reference_cls is not None:
        _check_same_signature(ref, model_cls, reference_cls, "__init__")
        _check_same_signature(ref, model_cls, reference_cls, "forward")
        mode, why = "reference", f"class {reference_cls.__name__} is the PyTorch truth"
    elif launches_triton:
        mode = "reference-data"
        why = (f"class {comparison} is not used as Reference" if comparison else "no Reference class") + \
            ": the original Model's outputs on the reference platform are the truth"
    else:
        mode, why = "model", "Model is pure PyTorch and its own truth"
    task = Task(
        ref=ref,
        module=module,
        shapes=shapes,
        model_cls=model_cls,
        reference_cls=reference_cls,
        mode=mode,
        comparison=comparison,
        mode_reason=why,
        tolerance=metadata.tolerance(ref.path, module),
        inplace_args=metadata.int_tuple(ref.path, module, "INPLACE_ARGS"),
        tags=metadata.str_tuple(ref.path, module, "TAGS"),
        doc=(module.__doc__ or "").strip(),
        backward=metadata.backward(ref.path, module),
        grad_inputs=metadata.int_tuple(ref.path, module, "GRAD_INPUTS") if hasattr(module, "GRAD_INPUTS") else None,
    )
    if task.grad_inputs is not None and not task.backward:
        raise TaskError(ref.path, "GRAD_INPUTS needs BACKWARD = True", "it names the inputs of a backward pass")
    metadata.indices_in_forward(ref.path, model_cls, "INPLACE_ARGS", task.inplace_args)
    metadata.indices_in_forward(ref.path, model_cls, "GRAD_INPUTS", task.grad_inputs or ())
    metadata.small_shapes(ref.path, module)
    if shapes == "small":
        _apply_small_shapes(task)
    return task


def _exec_isolated(path: Path) -> types.ModuleType:
    """Own module name, and nothing the file added to sys.modules or sys.path stays behind.
    One at a time in a process: the clean-up drops what appeared in sys.modules from the task's
    folder meanwhile, which would include another thread's task of that folder (several ops of
    a batch searched at once, farm.search.batch)."""
    with _exec_lock:
        return _exec_isolated_unlocked(path)


def _exec_isolated_unlocked(path: Path) -> types.ModuleType:
    name = f"farm_task_{next(_counter)}_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}"
    try:
        text = path.read_bytes()
        code = compile(text, str(path), "exec")
    except SyntaxError as exc:
        raise TaskError(path, "is not valid Python", f"line {exc.lineno}: {exc.msg}") from None
    except OSError as exc:
        raise TaskError(path, "cannot be read", str(exc)) from None
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None  # a path ending in .py always has one
    module = importlib.util.module_from_spec(spec)
    before_modules = set(sys.modules)
    before_path = list(sys.path)
    sys.modules[name] = module  # dataclasses and typing look their module up while it executes
    if b"driver.active" in text:
        from farm.targets.interpret import ensure_driver

        ensure_driver()  # a module-level device probe needs a driver; a GPU-less host has none
    try:
        run_top_level(code, module.__dict__, path)
    finally:
        sys.path[:] = before_path
        folder = str(path.parent.resolve())
        for added in set(sys.modules) - before_modules:
            mod_file = getattr(sys.modules.get(added), "__file__", None) or ""
            if added == name or mod_file.startswith(folder):
                sys.modules.pop(added, None)
    return module


def _require_module_class(ref: TaskRef, module: types.ModuleType, name: str) -> type[nn.Module]:
    import torch.nn as nn

    obj = getattr(module, name, None)
    if obj is None:
        raise TaskError(ref.path, f"must define class {name}(nn.Module)")
    if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        raise TaskError(ref.path, f"{name} must be a subclass of torch.nn.Module", f"got {obj!r}")
    return obj


def _positional(cls: type, method: str) -> tuple[int, bool]:
    """(number of positional parameters after self, whether *args is accepted)."""
    params = list(inspect.signature(getattr(cls, method)).parameters.values())[1:]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    count = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    return count, varargs


def _check_same_signature(ref: TaskRef, model: type, reference: type, method: str) -> None:
    m, r = _positional(model, method), _positional(reference, method)
    if m != r and not (m[1] or r[1]):
        raise TaskError(ref.path, f"Reference.{method} must take the same arguments as Model.{method}",
                        f"Model takes {m[0]}, Reference takes {r[0]}")


def _check_forward_arity(task: Task, n_inputs: int) -> None:
    for cls in filter(None, (task.model_cls, task.reference_cls)):
        params = list(inspect.signature(cls.forward).parameters.values())[1:]
        required = sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
        count, varargs = _positional(cls, "forward")
        if n_inputs < required or (n_inputs > count and not varargs):
            raise TaskError(task.ref.path, f"{cls.__name__}.forward must accept the inputs of get_inputs()",
                            f"get_inputs() gives {n_inputs}, forward takes {required}..{count}")


def check_init_arity(task: Task, init_inputs: list) -> None:
    for cls in filter(None, (task.model_cls, task.reference_cls)):
        try:
            inspect.signature(cls.__init__).bind(None, *init_inputs)
        except TypeError as exc:
            raise TaskError(task.ref.path, f"{cls.__name__}.__init__ must accept get_init_inputs()",
                            str(exc)) from None


_DERIVED: dict[tuple, tuple[dict, str]] = {}  # (path, sha256, policy) -> derived shapes, per process


def _apply_small_shapes(task: Task) -> None:
    """The small shape set: config shapes, else the file's SMALL_SHAPES, else derived ones
    (farm.corpus.shapes); a file whose own shapes fit the budget runs as it is ("full").
    Where none can be found the task fails here, with the reason: it never runs at full size
    under the name small."""
    ref, module = task.ref, task.module
    config = ref.policy.override_dict
    small = getattr(module, "SMALL_SHAPES", None)
    if small is not None and not isinstance(small, dict):
        raise TaskError(ref.path, "SMALL_SHAPES must be a dict of module constants to override")
    for key in list(config):
        if not hasattr(module, key):
            if key in ref.policy.op_overrides:
                raise TaskError(ref.path, "corpus.shapes may only override existing module globals",
                                f"'{key}' (corpus.shapes.{ref.source}/{ref.op}) is not defined in the file")
            del config[key]  # a source-wide name this file does not use
    if small:
        for key, value in small.items():
            if not hasattr(module, key):
                raise TaskError(ref.path, "SMALL_SHAPES may only override existing module globals",
                                f"'{key}' is not defined in the file")
            setattr(module, key, value)
        task.shape_origin, task.shape_overrides = "file", dict(small)
    for key, value in config.items():
        setattr(module, key, value)
    if config:
        task.shape_origin = "config"
        task.shape_overrides.update(config)
    if small:
        return
    derived = (str(ref.path.resolve()), ref.sha256(), ref.policy)
    if derived not in _DERIVED:
        try:
            overrides, _fp, note = derive(module, task.model_cls, ref.policy, fixed_names=tuple(config))
        except NoShapes as exc:
            raise TaskError(ref.path, NO_SMALL_SHAPES, str(exc)) from None
        _check_real_forward(task, overrides)
        _DERIVED[derived] = (overrides, note)
    overrides, note = _DERIVED[derived]
    for name, value in overrides.items():
        setattr(module, name, value)
    task.shape_overrides.update(overrides)
    task.shape_note = note
    if overrides:
        task.shape_origin = "derived" if not config else "config+derived"
    elif not config:
        task.shape_origin = "full"


def _check_real_forward(task: Task, overrides: dict) -> None:
    """Derived shapes must run: one real forward on the CPU (small by construction)."""
    if not overrides:
        return
    import torch

    try:
        with own_generator(0), torch.no_grad():
            init_inputs = list(task.module.get_init_inputs())
            model = task.model_cls(*init_inputs).eval()
            model(*task.module.get_inputs())
    except Exception as exc:  # noqa: BLE001 - the derived shapes do not suit this Model
        shown = ", ".join(f"{k}={v}" for k, v in overrides.items())
        raise TaskError(task.ref.path, "has no small shapes: the derived ones fail a real forward",
                        f"{shown}: {type(exc).__name__}: {str(exc)[:200]}") from None


def describe(task: Task) -> dict[str, Any]:
    """What `farm ops list` shows of a loaded task."""
    first_line = task.doc.splitlines()[0] if task.doc else ""
    space = task.space
    return {
        "source": task.ref.source,
        "op": task.ref.op,
        "path": str(task.ref.path),
        "origin": task.ref.origin,
        "reference": task.reference_cls is not None,
        "reference_class": task.reference_cls.__name__ if task.reference_cls is not None else None,
        "mode": task.mode,
        "mode_reason": task.mode_reason,
        "tags": list(task.tags),
        "inplace_args": list(task.inplace_args),
        "backward": task.backward,
        "has_small_shapes": bool(getattr(task.module, "SMALL_SHAPES", None)),
        "small_shapes": task.shape_origin or "",
        # which dimensions vary, over what range, and where that came from (declared, derived, none)
        "space": space.as_dict(),
        "space_text": space.describe(),
        "space_origin": space.origin,
        "summary": first_line,
    }
