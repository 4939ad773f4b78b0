"""Ascend frontend check: compile a candidate's kernels with triton-ascend itself, up to Linalg.

No Ascend NPU is needed. Two processes, because triton-ascend replaces the `triton` package:

1. record (the farm's environment, a child under the CPU interpreter): run the candidate's
   forward (or a task's Model) on the given inputs with every Triton launch recorded and
   skipped: kernel, file, argument types and alignment, integer values (Triton specialises on
   them), constexprs, launch options, grid. Autotuned kernels are recorded once per config,
   since autotuning compiles every one.
2. compile (the triton-ascend virtualenv, `frontend_compile.py`): triton-ascend's binder and
   compiler on each recorded launch: frontend -> TTIR -> Linalg. The result names the kernel,
   the stage and the compiler's message.

Stages run: Python frontend, TTIR, Linalg (triton-adapter-opt). Never run: bishengir (needs
CANN) and the NPU. A kernel that reaches Linalg can still fail there (docs/ascend.md).

The virtualenv is made by `farm ascend setup-frontend`; its Python is found from the setting
`ascend.frontend_python` (env FARM_ASCEND_FRONTEND_PYTHON), else the default location.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.runtime import scratch as hostile

# (argv, scratch folder, environment, extra read-only paths) -> the argv that runs it inside
# an operating-system boundary (farm.evaluate.sandbox.wrap, passed in by the evaluator)
Wrap = Callable[[list[str], Path, dict, list], list[str]]

RESULT_CAP = 16 << 20  # bytes of a recording child's result file read back

log = logging.getLogger(__name__)

CHECK_NAME = "triton-ascend frontend check"  # how verdicts name this check (farm.evaluate.evaluator)
TRITON_ASCEND = "triton-ascend==3.2.0"
FRONTEND_PACKAGES = (TRITON_ASCEND, "pybind11", "numpy")  # triton-ascend imports both and declares neither
SUPPORTED_PYTHONS = ("3.11", "3.10", "3.9")  # triton-ascend 3.2.0 wheels
DEFAULT_VENV = Path("~/.farm/ascend-frontend").expanduser()
ENV_PYTHON = "FARM_ASCEND_FRONTEND_PYTHON"
CHILD = Path(__file__).with_name("frontend_compile.py")
STAGES = ("record", "load", "options", "launch", "frontend", "ttir", "linalg")
NEVER_RUN = "bishengir (npubin, needs CANN) and the NPU never ran"
RECORD_TIMEOUT_S = 300.0
COMPILE_TIMEOUT_S = 600.0


@dataclass
class KernelResult:
    kernel: str
    stage: str  # the stage reached ("linalg" when ok) or the one that failed
    ok: bool
    message: str | None = None
    file: str = ""
    launches: int = 1  # recorded launches with this signature

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FrontendReport:
    results: list[KernelResult]
    triton_version: str = ""
    note: str = NEVER_RUN

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    def first_failure(self) -> KernelResult | None:
        return next((r for r in self.results if not r.ok), None)

    def summary(self) -> str:
        bad = self.first_failure()
        if bad is None:
            return f"{len(self.results)} kernel launch signature(s) reach Linalg with triton-ascend {self.triton_version}"
        return f"triton-ascend {self.triton_version}: kernel {bad.kernel} fails at stage {bad.stage}: " \
               f"{first_line(bad.message)}"

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "triton_version": self.triton_version, "note": self.note,
                "results": [r.as_dict() for r in self.results]}


def first_line(message: str | None) -> str:
    """A result's message starts with its cause (the compiler's innermost error)."""
    lines = [ln for ln in (message or "").strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


# ------------------------------------------------------------------ the virtualenv

def configured_python(setting: str | None = None) -> Path | None:
    """The frontend environment's Python: the setting, else $FARM_ASCEND_FRONTEND_PYTHON, else
    the default location if `farm ascend setup-frontend` made it there; None if not configured."""
    for value in (setting, os.environ.get(ENV_PYTHON)):
        if value:
            path = Path(value).expanduser()
            if not path.is_file():
                raise FarmError(f"ascend frontend python {path} (ascend.frontend_python / {ENV_PYTHON}) does not "
                                "exist: run `farm ascend setup-frontend`")
            return path
    default = DEFAULT_VENV / "bin" / "python"
    return default if default.is_file() else None


_said_unconfigured = False


def not_configured_notice() -> str:
    return (f"Ascend frontend check not configured (no {ENV_PYTHON}, no {DEFAULT_VENV}): kernels are not compiled "
            "with triton-ascend before they run; `farm ascend setup-frontend` sets it up")


def say_not_configured_once() -> None:
    """Said once per process, never silently skipped."""
    global _said_unconfigured
    if not _said_unconfigured:
        _said_unconfigured = True
        log.warning(not_configured_notice())


def find_base_python() -> str:
    """A Python that triton-ascend 3.2.0 has wheels for (3.9-3.11)."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" in SUPPORTED_PYTHONS:
        return sys.executable
    for version in SUPPORTED_PYTHONS:
        found = shutil.which(f"python{version}")
        if found:
            return found
    raise FarmError(f"{TRITON_ASCEND} needs Python {', '.join(SUPPORTED_PYTHONS)}; none found on PATH "
                    "(install one, or pass --python)")


def setup_frontend(venv: Path = DEFAULT_VENV, python: str | None = None, progress=print) -> Path:
    """Create (or reuse) the virtualenv with triton-ascend; returns its Python after a probe."""
    venv = venv.expanduser()
    py = venv / "bin" / "python"
    if not py.is_file():
        if venv.exists() and (not venv.is_dir() or any(venv.iterdir())):  # the user's folder: never filled
            raise FarmError(f"{venv} (--venv) exists and is not a virtualenv (no bin/python): choose a new or empty "
                            "folder")
        base = python or find_base_python()
        progress(f"creating {venv} with {base}")
        _run([base, "-m", "venv", str(venv)], "create the virtualenv")
    if probe(py) is None:
        progress(f"installing {' '.join(FRONTEND_PACKAGES)} into {venv}")
        _run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", *FRONTEND_PACKAGES],
             f"install {TRITON_ASCEND}")
    info = probe(py)
    if info is None or "ascend" not in info.get("backends", []):
        raise FarmError(f"{venv}: triton-ascend does not import there ({info}); remove the folder and retry")
    return py


def probe(python: Path) -> dict | None:
    """{triton_version, backends} if `python` has triton-ascend, else None."""
    try:
        done = subprocess.run([str(python), str(CHILD), "--probe"], check=False, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (json.JSONDecodeError, IndexError):
        return None


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise FarmError(f"could not {what}: {' '.join(cmd)} exited {done.returncode}: "
                        f"{(done.stderr or done.stdout).strip()[-800:]}")


# ------------------------------------------------------------------ 1. record (farm's environment)

def _describe(value: Any) -> dict:
    """One argument as the compile child needs it (JSON)."""
    import torch

    if isinstance(value, torch.Tensor) or (hasattr(value, "data_ptr") and hasattr(value, "dtype")):
        return {"kind": "tensor", "dtype": str(value.dtype), "aligned": value.data_ptr() % 16 == 0}
    value = getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"kind": "value", "value": value}
    if type(value).__name__ == "dtype" and hasattr(value, "name"):  # tl.float16 as a constexpr
        return {"kind": "tl_dtype", "name": value.name}
    return {"kind": "unsupported", "type": type(value).__name__}


OPTION_KEYS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
# what triton-ascend 3.2's NPU driver reports (ascend/backend/driver.py): an A2 part's core counts
ASCEND_DEVICE_PROPERTIES = {"max_shared_mem": 1, "num_aicore": 24, "num_vectorcore": 48}


class _AscendHostDriver:
    """triton.runtime.driver.active while recording: answers host code as triton-ascend's
    driver would on an NPU (its property keys, an npu target), so host code that reads keys
    Ascend does not have (multiprocessor_count, ...) fails here as it would there."""

    class utils:  # lower case: the attribute name Triton host code reads
        @staticmethod
        def get_device_properties(device):
            return dict(ASCEND_DEVICE_PROPERTIES)

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("npu", "Ascend910B4", 0)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_benchmarker(self):
        raise RuntimeError("no Ascend device here: nothing can be timed while recording launches")


def _launch_record(fn: Any, args: tuple, kwargs: dict) -> dict:
    import inspect

    sig = inspect.signature(fn.fn)
    names = list(sig.parameters)
    grid = kwargs.pop("grid", None)
    kwargs.pop("warmup", None)
    options = {k: kwargs.pop(k) for k in list(kwargs) if k not in names}
    bound = sig.bind_partial(*args, **kwargs).arguments
    record_args = {name: _describe(value) for name, value in bound.items()}
    if callable(grid):
        meta = {**{n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty},
                **bound, **options}
        grid = grid(meta)
    try:
        grid = [int(g) for g in (grid or ())]
    except (TypeError, ValueError):
        grid = None
    return {"kernel": fn.fn.__name__, "file": fn.fn.__code__.co_filename, "args": record_args,
            "options": {k: v for k, v in options.items() if v is not None and isinstance(v, (int, float, str, bool))},
            "grid": grid}


def record_child(report, path: str, cls_name: str, init_inputs: list | None, inputs: list | None) -> dict:
    """In a child under TRITON_INTERPRET=1: every Triton launch of cls(*init)(*inputs), recorded
    and not executed (the compile check needs types and values, not results). Inputs None: the
    file's own get_init_inputs()/get_inputs() under seed 0 (a task file the corpus rules reject)."""
    import importlib.util

    import torch
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction

    launches: list[dict] = []

    def record(self, *args, **kwargs):
        launches.append(_launch_record(self, args, dict(kwargs)))

    def autotune_all(self, *args, **kwargs):
        # autotuning compiles every config; the interpreter cannot benchmark them anyway
        for config in self.configs:
            extra = {k: getattr(config, k, None) for k in OPTION_KEYS}
            self.fn.run(*args, **{**kwargs, **config.kwargs, **{k: v for k, v in extra.items() if v is not None}})

    InterpretedFunction.run = record
    Autotuner.run = autotune_all
    import triton

    triton.runtime.driver.set_active(_AscendHostDriver())
    report("load")
    spec = importlib.util.spec_from_file_location("farm_frontend_candidate", path)
    assert spec is not None and spec.loader is not None  # a .py path always has both
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls = getattr(module, cls_name, None)
    if not isinstance(cls, type):
        raise FarmError(f"{path} defines no class {cls_name}")
    if inputs is None or init_inputs is None:  # the file's own, drawn together
        torch.manual_seed(0)
        init_inputs = list(module.get_init_inputs())
        inputs = list(module.get_inputs())
    report("forward")
    error = ""
    try:
        with torch.no_grad():
            cls(*init_inputs)(*inputs)
    except Exception as exc:  # noqa: BLE001 -- skipped launches leave garbage behind; what was recorded stands
        error = f"{type(exc).__name__}: {exc}"
    return {"launches": launches, "error": error[-600:]}


def record_launches(path: Path, cls_name: str, init_inputs: list | None, inputs: list | None,
                    timeout_s: float = RECORD_TIMEOUT_S, wrap: Wrap | None = None) -> tuple[list[dict], str]:
    """(launches, error) from running the file's class in an interpreter child; with `wrap`
    (the evaluator's operating-system boundary) a fresh interpreter inside it, since the
    forward is untrusted candidate code."""
    env = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    if wrap is not None:
        return _record_wrapped(path, cls_name, init_inputs, inputs, timeout_s, wrap, env)
    from farm.runtime.children import run_in_child

    outcome = run_in_child(record_child, (str(path), cls_name, init_inputs, inputs), timeout_s=timeout_s, env=env)
    if not outcome.ok:
        lines = outcome.error.strip().splitlines()
        return [], lines[-1] if lines else outcome.status
    return outcome.value["launches"], outcome.value["error"]


def _record_wrapped(path: Path, cls_name: str, init_inputs: list | None, inputs: list | None, timeout_s: float,
                    wrap: Wrap, env: dict[str, str]) -> tuple[list[dict], str]:
    import torch

    with tempfile.TemporaryDirectory(prefix="farm-frontend-rec-") as tmp:
        scratch = Path(tmp)
        torch.save({"init_inputs": init_inputs, "inputs": inputs}, scratch / "inputs.pt")
        root = str(Path(__file__).resolve().parents[2])
        env = {**{k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL")}, **env,
               "HOME": str(scratch), "PYTHONPATH": root, "TRITON_CACHE_DIR": str(scratch / "triton")}
        launcher = "import sys; sys.path.pop(0); from farm.ascend.frontend import record_main; record_main()"
        argv = wrap([sys.executable, "-c", launcher, str(path), cls_name, str(scratch / "inputs.pt"),
                     str(scratch / "launches.json")], scratch, env, [path.parent])
        try:
            done = hostile.run_capped(argv, timeout_s, env=env, cwd=scratch, start_new_session=True)
        except subprocess.TimeoutExpired:
            return [], f"no result after {timeout_s:.0f} s"
        try:  # written by the candidate's process: no link followed, no FIFO opened, no unbounded read
            value = json.loads(hostile.read_capped(scratch, "launches.json", RESULT_CAP))
        except FileNotFoundError:
            lines = (done.stderr or done.stdout).strip().splitlines()
            return [], lines[-1] if lines else f"exited {done.returncode}"
        except (hostile.UnsafeFile, ValueError) as exc:
            return [], f"the recording child left no usable result: {exc}"
        if not isinstance(value, dict) or not isinstance(value.get("launches"), list):
            return [], "the recording child left no usable result"
    return value["launches"], str(value.get("error", ""))


def record_main() -> None:
    """Entry of the wrapped recording child: argv = file, class, inputs.pt, out.json."""
    import torch

    path, cls_name, inputs_pt, out = sys.argv[1:5]
    data = torch.load(inputs_pt, weights_only=True)
    try:
        value = record_child(lambda stage: None, path, cls_name, data["init_inputs"], data["inputs"])
    except Exception as exc:  # noqa: BLE001 -- the candidate's failure is the result
        value = {"launches": [], "error": f"{type(exc).__name__}: {exc}"[-600:]}
    Path(out).write_text(json.dumps(value))


def unique_launches(launches: list[dict]) -> list[dict]:
    """One job per distinct (kernel, file, arguments, options, grid size class)."""
    seen: dict[str, dict] = {}
    for launch in launches:
        grid = launch.get("grid") or []
        over = 1
        for g in grid:
            over *= g
        key = json.dumps([launch["kernel"], launch["file"], launch["args"], launch["options"], over > 65535],
                         sort_keys=True)
        if key in seen:
            seen[key]["count"] += 1
        else:
            seen[key] = {**launch, "count": 1}
    return list(seen.values())


# ------------------------------------------------------------------ 2. compile (triton-ascend env)

def compile_launches(python: Path, launches: list[dict], timeout_s: float = COMPILE_TIMEOUT_S,
                     wrap: Wrap | None = None) -> FrontendReport:
    jobs = unique_launches(launches)
    for i, job in enumerate(jobs):
        job["index"] = i
    with tempfile.TemporaryDirectory(prefix="farm-frontend-") as tmp:
        spec = Path(tmp) / "jobs.json"
        spec.write_text(json.dumps(jobs))
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "TRITON_INTERPRET", "PYTHONHOME", "VIRTUAL_ENV")}
        env["TRITON_CACHE_DIR"] = str(Path(tmp) / "cache")
        env["TRITON_DEFAULT_BACKEND"] = "ascend"  # the only one; named, as every farm process does
        argv = [str(python), str(CHILD), str(spec)]
        if wrap is not None:  # it executes the candidate's top-level statements: inside the boundary
            env = {**{k: v for k, v in env.items() if k in ("PATH", "LANG", "LC_ALL")}, "HOME": tmp,
                   "TRITON_CACHE_DIR": env["TRITON_CACHE_DIR"], "TRITON_DEFAULT_BACKEND": "ascend"}
            venv = python.parent.parent
            argv = wrap(argv, Path(tmp), env, [venv, Path(os.path.realpath(python)).parent.parent, CHILD.parent,
                                               *{Path(j["file"]).parent for j in jobs}])
        try:
            done = hostile.run_capped(argv, timeout_s, env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise FarmError(f"the triton-ascend frontend took more than {timeout_s:.0f} s") from None
    try:
        reply = json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise FarmError(f"the triton-ascend frontend ({python}) exited {done.returncode} without a result: "
                        f"{(done.stderr or done.stdout).strip()[-800:]}") from None
    results = []
    for r in reply["results"]:
        job = jobs[r["index"]]
        results.append(KernelResult(r["kernel"], r["stage"], r["ok"], r["message"], r["file"], job["count"]))
    return FrontendReport(results, reply.get("triton_version", ""))


# ------------------------------------------------------------------ both

def check_file(python: Path, path: Path, cls_name: str, init_inputs: list | None = None,
               inputs: list | None = None, wrap: Wrap | None = None) -> FrontendReport:
    """Record the launches of `cls_name` in `path` on these inputs (None: the file's own), then
    compile them."""
    launches, error = record_launches(path, cls_name, init_inputs, inputs, wrap=wrap)
    if not launches:
        why = error or "the forward launched no Triton kernel"
        return FrontendReport([KernelResult("-", "record", False, f"no launch recorded under the CPU interpreter: {why}",
                                            str(path))])
    return compile_launches(python, launches, wrap=wrap)


def check_source(python: Path, source: str, cls_name: str, init_inputs: list | None = None,
                 inputs: list | None = None, wrap: Wrap | None = None) -> FrontendReport:
    """As check_file, for source text (a candidate): written to a file of its own first,
    since Triton reads kernel source from files."""
    with tempfile.TemporaryDirectory(prefix="farm-frontend-src-") as tmp:
        path = Path(tmp) / "candidate.py"
        path.write_text(source)
        report = check_file(python, path, cls_name, init_inputs, inputs, wrap)
    for r in report.results:
        r.file = "candidate" if r.file == str(path) else r.file
    return report
