"""The kernel-task corpus: find sources and ops, load task files in isolation, validate them.

Rules are those of docs/task-format.md; every violation is a TaskError naming the file and
the rule, never a bare traceback.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import itertools
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.config import Settings
from farm.errors import FarmError, InvalidName, TaskError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
SHAPE_SETS = ("bench", "small")
_TRITON_MARKERS = ("@triton.jit", "@triton.autotune", "triton.jit(")
_TOLERANCE_DTYPES = ("float16", "bfloat16", "float32", "float64")
_counter = itertools.count()


def validate_name(name: str, what: str) -> str:
    """Source and op names become storage keys: nothing that could leave its prefix."""
    if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
        raise InvalidName(f"invalid {what} name {name!r}: use letters, digits, '_', '-', '.' (no '..', no '/')")
    return name


@dataclass(frozen=True)
class TaskRef:
    """Where a task lives; cheap, no code executed."""

    source: str
    op: str
    path: Path

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
    model_cls: type
    reference_cls: type | None
    tolerance: dict[str, tuple[float, float]] = field(default_factory=dict)
    inplace_args: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    doc: str = ""

    @property
    def truth_cls(self) -> type:
        """The class whose output is ground truth: Reference, else Model (pure PyTorch)."""
        return self.reference_cls or self.model_cls

    def init_inputs(self) -> list:
        return self._call_list("get_init_inputs")

    def inputs(self) -> list:
        values = self._call_list("get_inputs")
        _check_forward_arity(self, len(values))
        return values

    def _call_list(self, name: str) -> list:
        try:
            values = getattr(self.module, name)()
        except Exception as exc:  # noqa: BLE001 - a task's own bug, reported against its file
            raise TaskError(self.ref.path, f"{name}() raised", f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(values, (list, tuple)):
            raise TaskError(self.ref.path, f"{name}() must return a list", f"got {type(values).__name__}")
        return list(values)


# ---------------------------------------------------------------- discovery


def discover_sources(settings: Settings) -> dict[str, Path]:
    """Every folder under tasks/ plus the `corpus.sources` of the configuration."""
    found: dict[str, Path] = {}
    root = settings.tasks_dir()
    if root.is_dir():
        for sub in sorted(root.iterdir()):
            if sub.is_dir() and not sub.name.startswith((".", "_")) and any(sub.glob("*.py")):
                found[sub.name] = sub
    for name, folder in settings.corpus.sources.items():
        validate_name(name, "source")
        path = Path(folder).expanduser()
        if not path.is_dir():
            raise FarmError(f"corpus.sources.{name}: folder {path} does not exist")
        found[name] = path
    return found


def list_ops(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith(("_", ".")) and NAME_RE.match(p.stem))


def find_tasks(settings: Settings, sources: list[str] | None = None, ops: list[str] | None = None) -> list[TaskRef]:
    """The tasks selected by --source/--ops; an unknown name is an error that lists the known ones."""
    known = discover_sources(settings)
    chosen = sources or list(known)
    for name in chosen:
        if name not in known:
            raise FarmError(f"unknown source '{name}' (--source); known: {', '.join(known) or 'none'}")
    refs = [TaskRef(s, op, known[s] / f"{op}.py") for s in chosen for op in list_ops(known[s])]
    if ops:
        wanted = set(ops)
        missing = wanted - {r.op for r in refs} - {r.key for r in refs}
        if missing:
            raise FarmError(f"unknown op(s) {', '.join(sorted(missing))} (--ops) in source(s) {', '.join(chosen)}")
        refs = [r for r in refs if r.op in wanted or r.key in wanted]
    return refs


def ref_from_file(path: str | Path, source: str = "local") -> TaskRef:
    path = Path(path)
    if not path.is_file():
        raise FarmError(f"task file {path} does not exist")
    return TaskRef(source, validate_name(path.stem, "op"), path)


# ---------------------------------------------------------------- loading


def load_task(ref: TaskRef, shapes: str = "bench") -> Task:
    """Execute a task file as a fresh module and check its static rules."""
    if shapes not in SHAPE_SETS:
        raise FarmError(f"unknown shape set '{shapes}' (--shapes); use one of {', '.join(SHAPE_SETS)}")
    module = _exec_isolated(ref.path)
    model_cls = _require_module_class(ref, module, "Model")
    reference_cls = getattr(module, "Reference", None)
    if reference_cls is not None:
        reference_cls = _require_module_class(ref, module, "Reference")
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(getattr(module, fn, None)):
            raise TaskError(ref.path, f"must define {fn}()", "the farm calls it to build the op's arguments")
    source_text = ref.path.read_text(errors="replace")
    if reference_cls is None and any(m in source_text for m in _TRITON_MARKERS):
        raise TaskError(ref.path, "Model launches Triton kernels, so the file must define class Reference",
                        "a pure-PyTorch Reference is the ground truth on every device")
    if reference_cls is not None:
        _check_same_signature(ref, model_cls, reference_cls, "__init__")
        _check_same_signature(ref, model_cls, reference_cls, "forward")
    task = Task(
        ref=ref,
        module=module,
        shapes=shapes,
        model_cls=model_cls,
        reference_cls=reference_cls,
        tolerance=_tolerance(ref, module),
        inplace_args=_int_tuple(ref, module, "INPLACE_ARGS"),
        tags=_str_tuple(ref, module, "TAGS"),
        doc=(module.__doc__ or "").strip(),
    )
    if shapes == "small":
        _apply_small_shapes(ref, module)
    return task


def _exec_isolated(path: Path) -> types.ModuleType:
    """Own module name, and nothing the file added to sys.modules or sys.path stays behind."""
    name = f"farm_task_{next(_counter)}_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}"
    try:
        code = compile(path.read_bytes(), str(path), "exec")
    except SyntaxError as exc:
        raise TaskError(path, "is not valid Python", f"line {exc.lineno}: {exc.msg}") from None
    except OSError as exc:
        raise TaskError(path, "cannot be read", str(exc)) from None
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    before_modules = set(sys.modules)
    before_path = list(sys.path)
    sys.modules[name] = module  # dataclasses and typing look their module up while it executes
    try:
        exec(code, module.__dict__)
    except Exception as exc:  # noqa: BLE001 - any failure of a task's top level is the task's
        raise TaskError(path, "fails on import", f"{type(exc).__name__}: {exc}") from None
    finally:
        sys.path[:] = before_path
        folder = str(path.parent.resolve())
        for added in set(sys.modules) - before_modules:
            mod_file = getattr(sys.modules.get(added), "__file__", None) or ""
            if added == name or mod_file.startswith(folder):
                sys.modules.pop(added, None)
    return module


def _require_module_class(ref: TaskRef, module: types.ModuleType, name: str) -> type:
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


def _apply_small_shapes(ref: TaskRef, module: types.ModuleType) -> None:
    small = getattr(module, "SMALL_SHAPES", None)
    if small is None:
        return
    if not isinstance(small, dict):
        raise TaskError(ref.path, "SMALL_SHAPES must be a dict of module constants to override")
    for key, value in small.items():
        if not hasattr(module, key):
            raise TaskError(ref.path, "SMALL_SHAPES may only override existing module globals",
                            f"'{key}' is not defined in the file")
        setattr(module, key, value)


def _tolerance(ref: TaskRef, module: types.ModuleType) -> dict[str, tuple[float, float]]:
    raw = getattr(module, "TOLERANCE", {}) or {}
    if not isinstance(raw, dict):
        raise TaskError(ref.path, "TOLERANCE must be a dict like {'float16': (atol, rtol)}")
    out = {}
    for dtype, pair in raw.items():
        if dtype not in _TOLERANCE_DTYPES:
            raise TaskError(ref.path, "TOLERANCE keys must be float dtype names",
                            f"'{dtype}' is not one of {', '.join(_TOLERANCE_DTYPES)}")
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(v, (int, float)) and v >= 0 for v in pair)):
            raise TaskError(ref.path, "TOLERANCE values must be (atol, rtol) pairs of non-negative numbers",
                            f"{dtype}: {pair!r}")
        out[dtype] = (float(pair[0]), float(pair[1]))
    return out


def _int_tuple(ref: TaskRef, module: types.ModuleType, name: str) -> tuple[int, ...]:
    raw = getattr(module, name, ()) or ()
    if not isinstance(raw, (tuple, list)) or not all(isinstance(v, int) and v >= 0 for v in raw):
        raise TaskError(ref.path, f"{name} must be a tuple of argument indices", repr(raw))
    return tuple(raw)


def _str_tuple(ref: TaskRef, module: types.ModuleType, name: str) -> tuple[str, ...]:
    raw = getattr(module, name, ()) or ()
    if not isinstance(raw, (tuple, list)) or not all(isinstance(v, str) for v in raw):
        raise TaskError(ref.path, f"{name} must be a tuple of strings", repr(raw))
    return tuple(raw)


def describe(task: Task) -> dict[str, Any]:
    """What `farm ops list` shows of a loaded task."""
    first_line = task.doc.splitlines()[0] if task.doc else ""
    return {
        "source": task.ref.source,
        "op": task.ref.op,
        "path": str(task.ref.path),
        "reference": task.reference_cls is not None,
        "tags": list(task.tags),
        "inplace_args": list(task.inplace_args),
        "has_small_shapes": bool(getattr(task.module, "SMALL_SHAPES", None)),
        "summary": first_line,
    }
