"""Child of the Ascend frontend check: runs in the triton-ascend virtualenv, never in the farm's.

    <frontend python> frontend_compile.py JOBS.json   ->   one JSON list on the last stdout line

triton-ascend 3.2 replaces the `triton` package, so this file imports only the standard library
and that `triton`; it is run by path (not as part of `farm`). For each recorded launch it
rebuilds what triton-ascend's own `JITFunction.run` would compile (its binder, its
specialisation, its options) and runs the compiler's stages up to Linalg:

    load      the kernel's file, with torch and torch_npu stubbed (host code is not compiled)
    options   launch options (num_warps, ...) that triton-ascend rejects
    launch    the grid limit that triton-ascend's launcher enforces (product <= 65535)
    frontend  Python AST -> Triton IR (triton-ascend's language: missing APIs, bad arguments)
    ttir      Triton IR passes
    linalg    triton-adapter-opt: Triton IR -> Linalg (the `ttadapter` stage)

The next stage (`npubin`: bishengir-compile, needs the CANN toolkit) and the NPU never run here.
"""

import ast
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types

MESSAGE_LIMIT = 1500
GRID_LIMIT = 65535  # triton-ascend 3.2 runtime/jit.py: "grid should be less than 65536!"
ASCEND_ARCH = os.environ.get("FARM_ASCEND_ARCH", "Ascend910B4")
STAGE_NAMES = {"ttir": "ttir", "ttadapter": "linalg"}


class _Stub:
    """Stands for any torch object in host code: attribute, call, item, base class."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return _Stub(f"{self._name}.{key}")

    def __call__(self, *args, **kwargs):
        return _Stub(f"{self._name}()")

    def __getitem__(self, key):
        return _Stub(f"{self._name}[]")

    def __mro_entries__(self, bases):
        return (object,)

    def __iter__(self):
        return iter(())

    def __repr__(self):
        return f"<stub {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return _Stub(f"{self.__name__}.{key}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """torch is not installed here (and need not be: only kernels are compiled)."""

    ROOTS = ("torch", "torch_npu")

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


class _CompileOnlyDriver:
    """The process's Triton driver, chosen explicitly: triton-ascend's NPUDriver cannot exist
    without CANN, and module-level code (triton.autotune) asks the active driver for a
    benchmarker. Nothing is launched or timed here."""

    class utils:  # lower case: the attribute name Triton host code reads
        @staticmethod
        def get_device_properties(device):
            return {"max_shared_mem": 1, "num_aicore": 24, "num_vectorcore": 48}

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("npu", ASCEND_ARCH, 0)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_benchmarker(self):
        def no_bench(*args, **kwargs):
            raise RuntimeError("the frontend check compiles only: nothing is timed")

        return no_bench


def load_kernels(path):
    """The file's top-level statements one by one, so that one needing real torch (class
    ModelNew, a host helper) is skipped and the kernels and their globals remain."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    module = types.ModuleType(f"farm_frontend_{abs(hash(path))}")
    module.__file__ = path
    sys.modules[module.__name__] = module
    skipped = []
    for stmt in tree.body:
        try:
            exec(compile(ast.Module([stmt], []), path, "exec"), module.__dict__)
        except Exception as exc:  # noqa: BLE001 -- reported if a kernel then turns out missing
            skipped.append(f"line {stmt.lineno}: {type(exc).__name__}: {exc}")
    return module, skipped


class _Pointer:
    """A tensor argument as triton's binder sees it: a dtype and an address's alignment."""

    def __init__(self, dtype, aligned):
        self.dtype, self.aligned = dtype, aligned

    def data_ptr(self):
        return 0 if self.aligned else 8


def _value(arg):
    kind = arg["kind"]
    if kind == "tensor":
        return _Pointer(arg["dtype"], arg["aligned"])
    if kind == "tl_dtype":
        import triton.language as tl

        return tl.dtype(arg["name"])
    if kind == "unsupported":
        raise ValueError(f"argument of type {arg['type']} cannot be reproduced outside the farm's process")
    return arg["value"]


def _jit_function(obj):
    while obj is not None and not hasattr(obj, "params"):  # Autotuner/Heuristics wrap a JITFunction
        obj = getattr(obj, "fn", None)
    return obj


def _root_cause(exc):
    """The first line says what went wrong: triton's CompilationError nests the repr of the
    error it wraps (`raise CompilationError(...) from e`), so the innermost cause is the message;
    the full text (with the kernel source around the failing call) follows it."""
    inner = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    head = f"{type(inner).__name__}: {inner}".strip().splitlines()
    head = head[-1] if inner is not exc and head else (head[0] if head else type(exc).__name__)
    full = f"{type(exc).__name__}: {exc}"
    return head if full.strip() == head else f"{head}\n{full}"


def _short(text):
    text = text.strip()
    if len(text) <= MESSAGE_LIMIT:
        return text
    head, _, rest = text.partition("\n")  # keep the first line (the cause) and the end
    return f"{head}\n...{rest[-(MESSAGE_LIMIT - len(head)):]}"


def compile_launch(fn, launch):
    """(stage reached or failed, message or None) for one recorded launch."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    target = GPUTarget("npu", ASCEND_ARCH, 0)
    backend = make_backend(target)
    fn.create_binder(backend)
    try:
        args = {name: _value(a) for name, a in launch["args"].items()}
    except ValueError as exc:
        return "load", str(exc)
    kwargs = dict(args, **launch.get("options", {}))
    kwargs["debug"] = False
    try:
        bound_args, sig_and_spec, _constexprs, _values, excess = fn.binder(**kwargs)
    except TypeError as exc:
        return "frontend", f"TypeError: {exc}"
    try:
        options = backend.parse_options(kwargs)
    except Exception as exc:  # noqa: BLE001
        return "options", f"{type(exc).__name__}: {exc}"
    unknown = [k for k in excess if k not in options.__dict__]
    if unknown:  # the words of triton-ascend's JITFunction.run
        return "options", f"KeyError: Keyword argument {unknown[0]} was specified but unrecognised"
    grid = launch.get("grid")
    if grid:
        size = 1
        for g in grid[:3]:
            size *= int(g)
        if size > GRID_LIMIT and os.environ.get("TRITON_ALL_BLOCKS_PARALLEL", "0") == "0":
            return "launch", (f"RuntimeError: grid should be less than 65536! (grid {tuple(grid)}, {size} programs; "
                              "triton-ascend's launcher refuses it)")
    bound = tuple(bound_args.values())
    keys = [fn.params[i].name for i in fn.non_constexpr_indices]
    signature = {k: ("*i8" if v == "none" else v) for k, v in zip(keys, sig_and_spec[:len(keys)])}
    attrs = backend.get_attrs_descriptor(fn.params, bound)
    constant_params = attrs.get_constants()
    constants = {p.name: v for v, p in zip(bound, fn.params) if p.is_constexpr or p.num in constant_params or v is None}
    src = fn.ASTSource(fn, signature, constants, attrs)
    stages = {}
    backend.add_stages(stages, options)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    metadata = {"hash": src.hash(), "target": target, **options.__dict__}
    try:
        module = src.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(), context)
    except Exception as exc:  # noqa: BLE001 -- the compiler's message is the result
        return "frontend", _root_cause(exc)
    for stage in ("ttir", "ttadapter"):
        try:
            module = stages[stage](module, metadata)
        except Exception as exc:  # noqa: BLE001
            detail = exc.stderr.decode(errors="replace") if getattr(exc, "stderr", None) else str(exc)
            return STAGE_NAMES[stage], f"{type(exc).__name__}: {detail}"
    return "linalg", None


def main(jobs_path):
    sys.meta_path.insert(0, _StubFinder())
    with open(jobs_path) as f:
        jobs = json.load(f)
    import triton
    from triton.runtime.driver import driver

    driver.set_active(_CompileOnlyDriver())
    results = []
    modules = {}
    for launch in jobs:
        path = launch["file"]
        if path not in modules:
            modules[path] = load_kernels(path)
        module, skipped = modules[path]
        fn = _jit_function(module.__dict__.get(launch["kernel"]))
        base = {"kernel": launch["kernel"], "file": path, "index": launch.get("index")}
        if fn is None:
            why = "; ".join(skipped) or "no such top-level name"
            results.append({**base, "stage": "load", "ok": False,
                            "message": _short(f"kernel {launch['kernel']} not found in {path}: {why}")})
            continue
        try:
            stage, message = compile_launch(fn, launch)
        except Exception as exc:  # noqa: BLE001 -- e.g. the binder rejecting the arguments
            stage, message = "frontend", f"{type(exc).__name__}: {exc}"
        results.append({**base, "stage": stage, "ok": message is None,
                        "message": None if message is None else _short(message)})
    print(json.dumps({"triton_version": triton.__version__, "arch": ASCEND_ARCH, "results": results}))
    sys.stdout.flush()
    os._exit(0)  # skip the MLIR context teardown and nanobind's leak report


if __name__ == "__main__":
    if sys.argv[1:] == ["--probe"]:
        import triton
        from triton.backends import backends

        print(json.dumps({"triton_version": triton.__version__, "backends": sorted(backends)}))
        sys.stdout.flush()
        os._exit(0)
    main(sys.argv[1])
