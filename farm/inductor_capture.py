"""torch.compile a task's Reference and turn inductor's Triton output into a ModelNew candidate.

Two halves, used by farm.generators.inductor:

capture (child side, `capture_child`)
    Runs in a child process pinned to the target (farm.isolation.run_in_child): loads the
    task, builds the ground-truth module (Reference, else Model), compiles it with
    `torch.compile(mode=..., dynamic=False, fullgraph=True)` and runs it once on the task's
    inputs while hooks record
      - the Python wrapper module inductor generated (`def call(args)` and the kernel
        sources inside `async_compile.triton(...)`),
      - every kernel launch: its arguments' names, the config inductor settled on after
        autotuning (XBLOCK/R0_BLOCK..., num_warps, num_stages) and the grid it launched,
      - which forward input each graph input is, and where each forward output comes from
        (a graph output, an input, or a view of one of them).
    Everything returned is plain data (str/int/list/dict), so it pickles, and can be kept
    as a JSON sample for tests (tests/data/inductor/).

assemble (parent side, `assemble`)
    Pure source-to-source: the kernels become plain `@triton.jit` functions (inductor's
    `@triton_heuristics.*` decorators dropped), the `triton_helpers.*` jit functions they
    call are copied in (renamed `triton_helpers_<name>`), and the wrapper's `call` becomes
    `ModelNew.forward`: the same allocations (`torch.empty_strided`), and one plain launch
    `kernel[grid](name=value, ..., XBLOCK=XBLOCK_0, num_warps=.., num_stages=..)` per
    inductor launch, with the block sizes bound to a local once so that grid and launch
    agree when a block size is edited (e.g. by the tune generator).

Why plain launches and no inductor runtime: the evaluator counts launches by wrapping
`JITFunction.run`; inductor's `CachingAutotuner` launches compiled binaries directly, which
the evaluator would (rightly) not see. Copying the helpers keeps the candidate
self-contained and editable; when a helper cannot be copied (it needs a module-level name
other than tl/triton/libdevice/math), the candidate imports
`torch._inductor.runtime.triton_helpers` instead, which passes the static checks.

A candidate is shape-specialized: inductor compiled it for the exact shapes, strides,
dtypes, constructor arguments and non-tensor inputs of the capture, and the candidate
asserts all of them.

On the cpu target (Triton interpreter), inductor is asked for Triton via
`torch._inductor.config.cpu_backend = "triton"`. Its code generation asks the (absent)
Triton driver for a backend hash, which the child replaces with a constant; kernels are not
executed during capture (the interpreter cannot run inductor's `libdevice` calls), so the
first config is taken; the assembled candidate maps `libdevice.f` to `tl.math.f`, which the
interpreter implements, and refuses (no seed) when a function has no such equivalent.
"""

from __future__ import annotations

import ast
import builtins
import inspect
from collections.abc import Callable
from typing import Any

from farm.pyast import dotted_name as _dotted

FORMAT = 1  # of the capture dict
_EMPTY_STRIDED = {"empty_strided_cuda", "empty_strided_cpu", "empty_strided_xpu", "empty_strided_mtia",
                  "empty_strided"}
_DROP_CALLS = {"assert_alignment", "get_raw_stream"}
_GRID_AXES = {"Grid1D": ("xnumel", "XBLOCK"), "Grid2D": ("xnumel", "XBLOCK", "ynumel", "YBLOCK"),
              "Grid3D": ("xnumel", "XBLOCK", "ynumel", "YBLOCK", "znumel", "ZBLOCK")}


class Unsupported(Exception):
    """What inductor produced cannot become a candidate; the message says why."""


# ====================================================================== capture (child)


def _literal(value: Any) -> str | None:
    """repr(value) if it is a plain literal that round-trips, else None."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value)
        try:
            if ast.literal_eval(text) == value or text in ("nan", "inf", "-inf"):
                return text
        except (ValueError, SyntaxError):
            return None
    return None


def _params(fn: Callable) -> tuple[list[str], list[str | None], bool]:
    """(names, literal defaults, has *args) of a method's positional parameters after self."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    names, defaults = [], []
    varargs = False
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            varargs = True
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
            defaults.append(None if p.default is p.empty else (_literal(p.default) or "None"))
    return names, defaults, varargs


def _flatten(value: Any, leaves: list) -> Any:
    """Output structure as plain data; tensors become {'leaf': index into leaves}."""
    import torch

    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return {"leaf": len(leaves) - 1}
    if isinstance(value, (tuple, list)):
        return {"seq": "tuple" if isinstance(value, tuple) else "list", "items": [_flatten(v, leaves) for v in value]}
    text = _literal(value)
    if text is None:
        raise Unsupported(f"forward returns a {type(value).__name__}, which a candidate cannot rebuild")
    return {"const": text}


def _same_tensor(a, b) -> bool:
    return (a is b) or (a.device == b.device and a.dtype == b.dtype and a.data_ptr() == b.data_ptr()
                        and tuple(a.shape) == tuple(b.shape) and tuple(a.stride()) == tuple(b.stride()))


def _source_of(t, candidates: list[tuple[tuple, Any]]) -> dict:
    """Where an output tensor comes from: one of candidates (exactly, or as a view of its storage)."""
    for ref, c in candidates:
        if c is t:
            return {"ref": list(ref)}
    for ref, c in candidates:
        if _same_tensor(c, t):
            return {"ref": list(ref)}
    for ref, c in candidates:
        if c.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() and c.dtype == t.dtype:
            return {"ref": list(ref), "view": [list(t.shape), list(t.stride()), t.storage_offset()]}
    raise Unsupported("a forward output is neither a graph output nor an input (nor a view of one): "
                      "it was made outside the compiled graph")


class _Recorder:
    """Hooks on inductor's GraphLowering (wrapper code, graph inputs/outputs) and
    CachingAutotuner (launch configs and grids)."""

    def __init__(self, execute_kernels: bool):
        self.execute_kernels = execute_kernels
        self.modules: dict[int, dict] = {}
        self.calls: list[dict] = []
        self.launches: list[dict] = []
        self.problems: list[str] = []

    def install(self) -> list[Callable[[], None]]:
        from torch._inductor.graph import GraphLowering
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner

        rec = self
        undo = []
        orig_compile = GraphLowering.compile_to_module
        orig_run = CachingAutotuner.run

        def compile_to_module(graph, *args, **kwargs):
            mod = orig_compile(graph, *args, **kwargs)
            if getattr(graph, "constants", None):
                rec.problems.append(f"the graph holds constant tensors ({', '.join(sorted(graph.constants))}), "
                                    "which a candidate cannot rebuild")
            with open(mod.__file__) as fh:  # the module inductor just wrote
                code = fh.read()
            key = id(mod)
            rec.modules[key] = {"code": code}
            inner = mod.call

            def call(args):
                given = list(args)
                result = inner(args)
                rec.calls.append({"module": key, "args": given, "result": result})
                return result

            mod.call = call
            return mod

        def run(self, *args, **kwargs):
            result = orig_run(self, *args, **kwargs) if rec.execute_kernels else None
            if kwargs.get("benchmark_run"):
                return result
            try:
                rec.launches.append(_launch_record(self, args, kwargs))
            except Exception as exc:  # noqa: BLE001 - reported as the reason for no seed
                rec.problems.append(f"launch of {self.inductor_meta.get('kernel_name', '?')} not understood: {exc}")
            return result

        GraphLowering.compile_to_module = compile_to_module
        CachingAutotuner.run = run
        undo.append(lambda: setattr(GraphLowering, "compile_to_module", orig_compile))
        undo.append(lambda: setattr(CachingAutotuner, "run", orig_run))
        return undo


def _launch_record(autotuner, args: tuple, kwargs: dict) -> dict:
    """The config, argument names, scalar values and grid of one inductor kernel launch."""
    import torch
    from torch._inductor.runtime.triton_heuristics import GridExpr

    launchers = getattr(autotuner, "launchers", None) or []
    cfg = launchers[0].config if len(launchers) == 1 else autotuner.configs[0]
    meta = autotuner.triton_meta
    signature = list(meta.get("signature", {}))
    names = [k for k in signature if k not in cfg.kwargs]
    if len(names) != len(args):
        names = [k for k in signature if meta["signature"][k] != "constexpr"]
    if len(names) != len(args):
        raise Unsupported(f"{len(args)} launch arguments for signature {signature}")
    scalars = {}
    for name, value in zip(names, args):
        if not isinstance(value, torch.Tensor):
            if _literal(value) is None:
                raise Unsupported(f"argument {name} is a {type(value).__name__}")
            scalars[name] = value
    grid = GridExpr.from_meta(autotuner.inductor_meta, cfg).eval_slow(dict(zip(names, args)))
    constants = {k: v for k, v in (meta.get("constants") or {}).items() if _literal(v) is not None}
    options = {}
    if meta.get("enable_fp_fusion") is False:
        options["enable_fp_fusion"] = False
    if meta.get("launch_pdl"):
        options["launch_pdl"] = True
    return {
        "kernel": autotuner.inductor_meta.get("kernel_name") or autotuner.fn.__name__,
        "arg_names": names,
        "scalars": scalars,
        "config": {k: v for k, v in cfg.kwargs.items()},
        "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages,
        "num_ctas": getattr(cfg, "num_ctas", 1),
        "maxnreg": getattr(cfg, "maxnreg", None),
        "grid": [int(g) for g in grid],
        "grid_type": autotuner.inductor_meta.get("grid_type", ""),
        "constants": constants,
        "options": options,
        "extra_kwargs": sorted(k for k in kwargs if k not in ("stream", "benchmark_run")),
    }


def _configure(target: str, mode: str, emulate_precision_casts: bool = True) -> None:
    import torch
    import torch._inductor.config as icfg

    torch._dynamo.reset()
    icfg.compile_threads = 1  # no worker pool: the child stays one process group, small graphs
    icfg.force_disable_caches = True  # a cache hit would skip the hooks
    # Round fp16/bf16 intermediates where eager does: the evaluator compares with eager
    # Reference outputs, and inductor's fp32-throughout math can differ by more than the
    # tolerance where eager's rounded intermediates cancel (rotary embedding: x1*cos - x2*sin).
    if hasattr(icfg, "emulate_precision_casts"):
        icfg.emulate_precision_casts = emulate_precision_casts
    if target == "cpu":
        import warnings

        warnings.filterwarnings("ignore", message="Could not find an active CPU backend")
        icfg.cpu_backend = "triton"
        import torch.utils._triton as ut

        try:
            ut.triton_hash_with_backend()
        except Exception:  # noqa: BLE001 - no driver under the interpreter: a fixed hash will do
            ut.triton_hash_with_backend = lambda: "TRITON-INTERPRETER"


def capture_child(report: Callable[[str], None], task_path: str, source: str, shapes: str, mode: str,
                  target: str, seed: int = 0, emulate_precision_casts: bool = True) -> dict:
    """In a child pinned to the target: compile the ground truth and record what inductor made.

    Returns {"ok": True, ...capture...} or {"ok": False, "reason": ...} for an understood
    refusal; unexpected errors raise (the parent gets the traceback)."""
    import torch

    from farm import corpus
    from farm.opcheck import draw_init_inputs, draw_inputs
    from farm.tensors import to_device

    report("load")
    task = corpus.load_task(corpus.ref_from_file(task_path, source=source), shapes)
    cls = task.truth_cls
    init_inputs = draw_init_inputs(task, seed)
    inputs = draw_inputs(task, seed)
    device = "cpu" if target == "cpu" else "cuda:0"
    model = cls(*init_inputs).to(device).eval()
    state = list(model.state_dict())
    if state:
        return {"ok": False, "reason": f"{cls.__name__} holds parameters/buffers ({', '.join(state[:4])}): "
                                       "not supported (the candidate could not reproduce their values)"}
    dev_inputs = to_device(inputs, device)
    report("compile")
    _configure(target, mode, emulate_precision_casts)
    rec = _Recorder(execute_kernels=target != "cpu")
    undo = rec.install()
    try:
        compiled = torch.compile(model, mode=None if mode == "default" else mode, dynamic=False, fullgraph=True)
        with torch.no_grad():
            out = compiled(*dev_inputs)
        if target != "cpu":
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - torch.compile failing is a reason, not a crash
        return {"ok": False, "reason": f"torch.compile failed: {type(exc).__name__}: {str(exc)[:600]}"}
    finally:
        for fn in undo:
            fn()
    report("record")
    if rec.problems:
        return {"ok": False, "reason": "; ".join(rec.problems)}
    if len(rec.calls) != 1:
        return {"ok": False, "reason": f"the compiled forward ran {len(rec.calls)} inductor graphs (expected one)"}
    call = rec.calls[0]
    try:
        capture = _describe(task, cls, init_inputs, inputs, dev_inputs, call, out)
    except Unsupported as exc:
        return {"ok": False, "reason": str(exc)}
    capture.update(ok=True, format=FORMAT, wrapper=rec.modules[call["module"]]["code"], launches=rec.launches,
                   mode=mode, target=target, shapes=shapes, emulate_precision_casts=emulate_precision_casts,
                   op=task.ref.op, source=source, torch_version=str(torch.__version__), triton_version=_triton_version(),
                   device_name=torch.cuda.get_device_name(0) if target != "cpu" else "cpu (Triton interpreter)")
    return capture


def _triton_version() -> str:
    import triton

    return str(triton.__version__)


def _describe(task, cls, init_inputs, inputs, dev_inputs, call, out) -> dict:
    import torch

    graph_inputs = []
    for k, arg in enumerate(call["args"]):
        if not isinstance(arg, torch.Tensor):
            raise Unsupported(f"graph input {k} is a {type(arg).__name__} (dynamic value)")
        for i, v in enumerate(dev_inputs):
            if isinstance(v, torch.Tensor) and _same_tensor(v, arg):
                graph_inputs.append(i)
                break
        else:
            raise Unsupported(f"graph input {k} is not one of the forward's inputs (a parameter or constant)")
    leaves: list = []
    structure = _flatten(out, leaves)
    result = list(call["result"]) if isinstance(call["result"], (list, tuple)) else [call["result"]]
    pool = [(("ret", j), t) for j, t in enumerate(result) if isinstance(t, torch.Tensor)]
    pool += [(("input", i), t) for i, t in enumerate(dev_inputs) if isinstance(t, torch.Tensor)]
    sources = [_source_of(t, pool) for t in leaves]
    in_desc = []
    for v in inputs:
        if isinstance(v, torch.Tensor):
            in_desc.append({"tensor": True, "shape": list(v.shape), "stride": list(v.stride()), "dtype": str(v.dtype)})
        else:
            text = _literal(v)
            if text is None:
                raise Unsupported(f"a forward input is a {type(v).__name__}, which is neither a tensor nor a literal")
            in_desc.append({"tensor": False, "value": text})
    init_names, init_defaults, init_var = _params(cls.__init__)
    fwd_names, _, fwd_var = _params(cls.forward)
    return {
        "class": cls.__name__,
        "init_names": init_names,
        "init_defaults": init_defaults,
        "init_varargs": init_var,
        "init_values": [_literal(v) for v in init_inputs],
        "forward_names": fwd_names,
        "forward_varargs": fwd_var,
        "inputs": in_desc,
        "graph_inputs": graph_inputs,
        "outputs": {"structure": structure, "sources": sources},
        "n_results": len(result),
    }


# ====================================================================== assemble (parent)




def kernel_sources(wrapper: str) -> dict[str, str]:
    """name -> source of every `name = async_compile.triton('name', '''...''')` in the wrapper."""
    found: dict[str, str] = {}
    for node in ast.parse(wrapper).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = _dotted(node.value.func)
            if func.startswith("async_compile."):
                if func != "async_compile.triton":
                    raise Unsupported(f"the wrapper compiles a {func.split('.', 1)[1]} kernel, not Triton")
                name, src = (a.value for a in node.value.args[:2])
                found[name] = src
    return found


def _free_names(fn: ast.FunctionDef) -> set[str]:
    bound = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
    bound |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


class _Usage:
    """What renaming met: libdevice functions shimmed, and those with no interpreter twin."""

    def __init__(self):
        self.shims: set[str] = set()
        self.missing: set[str] = set()


class _Renamer(ast.NodeTransformer):
    """Rewrites free names, `triton_helpers.x` and (cpu) `libdevice.x` inside jit functions."""

    def __init__(self, free: set[str], names: dict[str, str], helper_prefix: str | None,
                 libdevice_to_math: bool, usage: _Usage):
        self.free, self.names = free, names
        self.helper_prefix = helper_prefix
        self.libdevice_to_math = libdevice_to_math
        self.usage = usage

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.free and node.id in self.names:
            return ast.copy_location(ast.Name(self.names[node.id], node.ctx), node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        base = node.value
        if isinstance(base, ast.Name) and base.id in self.free:
            if base.id == "triton_helpers":
                if self.helper_prefix is not None:
                    return ast.copy_location(ast.Name(self.helper_prefix + node.attr, node.ctx), node)
                return node
            if base.id == "libdevice" and self.libdevice_to_math:
                import triton.language as tl

                if hasattr(tl.math, node.attr):
                    return ast.copy_location(ast.parse(f"tl.math.{node.attr}", mode="eval").body, node)
                if node.attr in INTERPRETER_SHIMS:
                    self.usage.shims.add(node.attr)
                    return ast.copy_location(ast.Name(f"libdevice_{node.attr}", node.ctx), node)
                self.usage.missing.add(node.attr)
                return node
        self.generic_visit(node)
        return node


def _jit_functions(src: str, where: str) -> list[ast.FunctionDef]:
    """The @triton.jit functions of one inductor kernel module, heuristics decorators dropped."""
    out = []
    for node in ast.parse(src).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                _dotted(node.value.func).startswith("triton_helpers.set_driver_to_"):
            continue
        if isinstance(node, ast.FunctionDef):
            jit = [d for d in node.decorator_list
                   if _dotted(d.func if isinstance(d, ast.Call) else d) in ("triton.jit", "jit")]
            if not jit:
                raise Unsupported(f"{where}: function {node.name} is not a @triton.jit function")
            node.decorator_list = jit
            out.append(node)
            continue
        raise Unsupported(f"{where}: unsupported statement at line {node.lineno}: {ast.unparse(node)[:80]}")
    return out


def _helper_library() -> dict[str, ast.FunctionDef]:
    """The top-level @triton.jit functions of torch._inductor.runtime.triton_helpers, read from
    its file without importing it: importing torch._inductor changes Triton's interpreter for
    the rest of the process, and this runs in the search process."""
    from pathlib import Path

    import torch

    path = Path(torch.__file__).parent / "_inductor" / "runtime" / "triton_helpers.py"
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and any(
                _dotted(d.func if isinstance(d, ast.Call) else d) == "triton.jit" for d in node.decorator_list):
            found[node.name] = node
    return found


# cpu target: libdevice functions without a tl.math twin, as jit functions the interpreter runs
INTERPRETER_SHIMS = {
    "tanh": "@triton.jit\ndef libdevice_tanh(x):\n    return 2.0 * tl.sigmoid(2.0 * x) - 1.0",
    "isnan": "@triton.jit\ndef libdevice_isnan(x):\n    return x != x",
    "isinf": "@triton.jit\ndef libdevice_isinf(x):\n    return (x == float('inf')) | (x == float('-inf'))",
}

_ALLOWED_FREE = {"tl", "triton", "libdevice", "tl_math"} | set(dir(builtins))


def _inline_helpers(needed: set[str], cpu: bool, usage: _Usage) -> list[str] | None:
    """Sources of the needed triton_helpers functions and everything they call, renamed
    triton_helpers_<name>; None if one of them needs more than tl/triton/libdevice/math."""
    library = _helper_library()
    order: list[str] = []
    todo = sorted(needed)
    while todo:
        name = todo.pop()
        if name in order:
            continue
        if name not in library:
            return None
        order.append(name)
        for free in _free_names(library[name]):
            if free in library and free not in order:
                todo.append(free)
    names = {n: "triton_helpers_" + n for n in order}
    names["math"] = "tl_math"  # triton_helpers' `math` is triton.language.math
    out = []
    for name in sorted(order):
        fn = ast.parse(ast.unparse(library[name])).body[0]
        free = _free_names(fn)
        if free - set(names) - _ALLOWED_FREE:
            return None
        fn = _Renamer(free, names, "triton_helpers_", cpu, usage).visit(fn)
        fn.name = names[name]
        out.append(ast.unparse(ast.fix_missing_locations(fn)))
    return out


def _kernel_defs(kernels: dict[str, str], cpu: bool) -> tuple[list[str], dict[str, ast.FunctionDef], list[str]]:
    """(module-level source blocks, kernel name -> def, header imports)."""
    fns: dict[str, ast.FunctionDef] = {}
    seen_src: dict[str, str] = {}
    for kname, src in kernels.items():
        for fn in _jit_functions(src, kname):
            text = ast.unparse(fn)
            if fn.name in seen_src and seen_src[fn.name] != text:
                raise Unsupported(f"two different jit functions named {fn.name}")
            seen_src[fn.name] = text
            fns[fn.name] = fn
    helpers_used: set[str] = set()
    for fn in fns.values():
        helpers_used |= {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)
                         and isinstance(n.value, ast.Name) and n.value.id == "triton_helpers"}
    usage = _Usage()
    inlined = _inline_helpers(helpers_used, cpu, usage) if helpers_used else []
    header, blocks = [], []
    if inlined is None:
        header.append("from torch._inductor.runtime import triton_helpers")
        prefix = None
    else:
        blocks.extend(inlined)
        prefix = "triton_helpers_"
    for name, fn in fns.items():
        fn = ast.fix_missing_locations(_Renamer(_free_names(fn), {}, prefix, cpu, usage).visit(fn))
        fns[name] = fn
        blocks.append(ast.unparse(fn))
    if usage.missing:
        raise Unsupported(f"libdevice function(s) {', '.join(sorted(usage.missing))} have no equivalent "
                          "that the Triton interpreter runs")
    blocks[:0] = [INTERPRETER_SHIMS[name] for name in sorted(usage.shims)]
    text = "\n".join(blocks)
    if "libdevice." in text:
        header.append("from triton.language.extra import libdevice")
    if "tl_math." in text:
        header.append("from triton.language import math as tl_math")
    return blocks, fns, header


def _call_function(wrapper: str) -> ast.FunctionDef:
    calls = [n for n in ast.walk(ast.parse(wrapper)) if isinstance(n, ast.FunctionDef) and n.name == "call"]
    if len(calls) != 1:
        raise Unsupported(f"the wrapper has {len(calls)} call() functions (expected one)")
    return calls[0]


class _WrapperRewrite(ast.NodeTransformer):
    """Expressions of the wrapper's call(): allocations and reinterpret_tensor."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        name = _dotted(node.func)
        if name in _EMPTY_STRIDED:
            args = node.args[:2]
            kw = [k for k in node.keywords if k.arg == "dtype"]
            if len(node.args) > 2:
                kw = [ast.keyword("dtype", node.args[2])]
            kw.append(ast.keyword("device", ast.Name("_dev", ast.Load())))
            return ast.copy_location(ast.Call(ast.parse("torch.empty_strided", mode="eval").body, args, kw), node)
        if name == "reinterpret_tensor":
            return ast.copy_location(ast.Call(ast.Name("_reinterpret", ast.Load()), node.args, node.keywords), node)
        return node


def _launch_lines(rec: dict, run: ast.Call, index: int, kernel: ast.FunctionDef) -> list[str]:
    """A plain launch for one `kernel.run(...)` with the recorded config and grid."""
    if len(run.args) != len(rec["arg_names"]):
        raise Unsupported(f"launch {index} of {rec['kernel']}: {len(run.args)} arguments, "
                          f"recorded {len(rec['arg_names'])}")
    extra = [k.arg for k in run.keywords if k.arg != "stream"]
    if extra or rec.get("extra_kwargs"):
        raise Unsupported(f"launch {index} of {rec['kernel']} passes {extra or rec['extra_kwargs']}")
    params = [a.arg for a in kernel.args.args]
    kwargs = {name: ast.unparse(arg) for name, arg in zip(rec["arg_names"], run.args)}
    lines = []
    blocks = {}
    for key, value in rec["config"].items():
        if key in params:
            local = f"{key}_{index}"
            lines.append(f"{local} = {value!r}")
            kwargs[key] = local
            blocks[key] = (local, value)
    for key, value in rec.get("constants", {}).items():
        if key in params and key not in kwargs:
            kwargs[key] = repr(value)
    missing = [p for p in params if p not in kwargs]
    if missing:
        raise Unsupported(f"launch {index} of {rec['kernel']}: no value for {', '.join(missing)}")
    grid = _grid_text(rec, blocks)
    if "triton.cdiv" not in grid:
        # the grid does not follow the block locals: those that shape it must keep their values
        lines += [f"assert {local} == {value!r}, 'the grid is fixed for {key}={value}'"
                  for key, (local, value) in blocks.items() if not key.startswith("R")]
    for numel_name, block, mask in _UNMASKED_AXES:
        numel = rec["scalars"].get(numel_name)
        if block in blocks and isinstance(numel, int) and _unmasked(kernel, mask):
            # inductor dropped this mask because every block it tried divides the size
            local = blocks[block][0]
            lines.append(f"assert {numel} % {local} == 0, '{kernel.name} has no {mask}: {block} must divide {numel}'")
    opts = [f"num_warps={rec['num_warps']}", f"num_stages={rec['num_stages']}"]
    if rec.get("num_ctas", 1) not in (1, None):
        opts.append(f"num_ctas={rec['num_ctas']}")
    if rec.get("maxnreg"):
        opts.append(f"maxnreg={rec['maxnreg']}")
    opts += [f"{k}={v!r}" for k, v in rec.get("options", {}).items()]
    args = ", ".join([f"{k}={v}" for k, v in kwargs.items()] + opts)
    lines.append(f"{rec['kernel']}[{grid}]({args})")
    return lines


_UNMASKED_AXES = (("xnumel", "XBLOCK", "xmask"), ("ynumel", "YBLOCK", "ymask"), ("znumel", "ZBLOCK", "zmask"),
                  ("r0_numel", "R0_BLOCK", "r0_mask"), ("r1_numel", "R1_BLOCK", "r1_mask"))


def _unmasked(kernel: ast.FunctionDef, mask: str) -> bool:
    """Whether the kernel sets `mask` to all-true (tl.full(..., True, ...)) rather than a bound."""
    for node in ast.walk(kernel):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == mask for t in node.targets):
            value = node.value
            while isinstance(value, ast.Subscript):
                value = value.value
            return isinstance(value, ast.Call) and _dotted(value.func) == "tl.full"
    return False


def _grid_text(rec: dict, blocks: dict[str, tuple[str, int]]) -> str:
    """Grid as cdiv(numel, BLOCK) over the block locals where that reproduces the recorded
    grid (Grid1D/2D/3D), else the recorded grid literally."""
    literal = f"({', '.join(str(g) for g in rec['grid'])})"
    axes = _GRID_AXES.get(rec.get("grid_type", ""))
    if not axes:
        return literal
    parts, values = [], []
    for numel_name, block_name in zip(axes[::2], axes[1::2]):
        numel = rec["scalars"].get(numel_name)
        if not isinstance(numel, int):
            return literal
        if block_name in blocks:
            local, block = blocks[block_name]
            parts.append(f"triton.cdiv({numel}, {local})")
            values.append(-(-numel // block))
        else:
            parts.append(str(numel))
            values.append(numel)
    while len(parts) < 3:
        parts.append("1")
        values.append(1)
    if values != list(rec["grid"]):
        return literal
    return f"({', '.join(parts)})"


def _forward_body(cap: dict, fns: dict[str, ast.FunctionDef], param_names: list[str]) -> list[str]:
    call = _call_function(cap["wrapper"])
    launches = list(cap["launches"])
    state = {"launch": 0, "graph_args": None, "ret": None}
    lines: list[str] = []
    rewrite = _WrapperRewrite()

    def emit(stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id == "args":
            target = stmt.targets[0]
            names = [e.id for e in target.elts] if isinstance(target, (ast.Tuple, ast.List)) else [target.id]
            if len(names) != len(cap["graph_inputs"]):
                raise Unsupported(f"call() unpacks {len(names)} inputs, recorded {len(cap['graph_inputs'])}")
            for name, i in zip(names, cap["graph_inputs"]):
                lines.append(f"{name} = {param_names[i]}")
            state["graph_args"] = names
            return
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            func = _dotted(stmt.value.func)
            if func in ("args.clear", "torch.cuda.set_device") or func in _DROP_CALLS:
                return
            if func == "assert_size_stride":
                a = stmt.value.args
                if isinstance(a[0], ast.Name) and a[0].id in (state["graph_args"] or ()):
                    return  # an input: forward checks it (with its dtype) first
                lines.append(f"_check({ast.unparse(a[0])}, {ast.unparse(a[1])}, {ast.unparse(a[2])})")
                return
            if func.endswith(".run") and func[:-4] in fns:
                if state["launch"] >= len(launches):
                    raise Unsupported(f"more launches in call() than were recorded ({len(launches)})")
                rec = launches[state["launch"]]
                if rec["kernel"] != func[:-4]:
                    raise Unsupported(f"launch {state['launch']} is {func[:-4]} in call(), {rec['kernel']} recorded")
                lines.extend(_launch_lines(rec, stmt.value, state["launch"], fns[func[:-4]]))
                state["launch"] += 1
                return
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and \
                _dotted(stmt.value.func) in _DROP_CALLS:
            return
        if isinstance(stmt, ast.With) and all("DeviceGuard" in _dotted(i.context_expr.func)
                                              for i in stmt.items if isinstance(i.context_expr, ast.Call)):
            for inner in stmt.body:
                emit(inner)
            return
        if isinstance(stmt, ast.Return):
            value = stmt.value
            items = value.elts if isinstance(value, (ast.Tuple, ast.List)) else [value]
            items = [ast.unparse(rewrite.visit(i)) for i in items]
            lines.append(f"_ret = ({', '.join(items)}{',' if len(items) == 1 else ''})")
            state["ret"] = len(items)
            return
        if isinstance(stmt, (ast.If, ast.For, ast.While, ast.Try)):
            raise Unsupported(f"control flow in call() (line {stmt.lineno}) is not supported")
        lines.append(ast.unparse(ast.fix_missing_locations(rewrite.visit(stmt))))

    for stmt in call.body:
        emit(stmt)
    if state["graph_args"] is None and cap["graph_inputs"]:
        raise Unsupported("call() does not unpack its arguments")
    if state["launch"] != len(launches):
        raise Unsupported(f"call() has {state['launch']} launches, {len(launches)} were recorded")
    if state["ret"] != cap["n_results"]:
        raise Unsupported(f"call() returns {state['ret']} values, {cap['n_results']} were recorded")
    return lines


def _output_expr(node: dict, sources: list[dict], param_names: list[str]) -> str:
    if "const" in node:
        return node["const"]
    if "seq" in node:
        items = [_output_expr(n, sources, param_names) for n in node["items"]]
        if node["seq"] == "list":
            return f"[{', '.join(items)}]"
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    src = sources[node["leaf"]]
    kind, idx = src["ref"]
    base = f"_ret[{idx}]" if kind == "ret" else param_names[idx]
    if "view" in src:
        size, stride, offset = src["view"]
        return f"{base}.as_strided({tuple(size)}, {tuple(stride)}, {offset})"
    return base


_PRELUDE = '''
def _check(t, size, stride, dtype=None):
    """The candidate is specialized to these shapes: refuse anything else."""
    assert tuple(t.shape) == tuple(size) and tuple(t.stride()) == tuple(stride), (
        f"compiled for shape {tuple(size)} / stride {tuple(stride)}, got {tuple(t.shape)} / {tuple(t.stride())}")
    assert dtype is None or t.dtype == dtype, f"compiled for {dtype}, got {t.dtype}"


def _reinterpret(t, size, stride, offset):
    return t.as_strided(size, stride, t.storage_offset() + offset)
'''


def assemble(cap: dict, target: str | None = None) -> str:
    """The candidate module for one capture (see the module docstring)."""
    target = target or cap["target"]
    cpu = target == "cpu"
    kernels = kernel_sources(cap["wrapper"])
    if not kernels:
        raise Unsupported("inductor generated no Triton kernel (the graph is all extern/aten calls)")
    blocks, fns, header = _kernel_defs(kernels, cpu)
    n_in = len(cap["inputs"])
    names = list(cap["forward_names"][:n_in])
    reserved = {"self", "torch", "triton", "tl", "nn", "_dev", "_ret", "_check", "_reinterpret"}
    if len(names) < n_in or cap.get("forward_varargs") or any(
            n in reserved or n.startswith(("arg", "buf")) for n in names):
        names = [f"in{i}" for i in range(n_in)]
    body = _forward_body(cap, fns, names)
    checks = []
    for name, desc in zip(names, cap["inputs"]):
        if desc["tensor"]:
            checks.append(f"_check({name}, {tuple(desc['shape'])}, {tuple(desc['stride'])}, {desc['dtype']})")
        else:
            checks.append(f"assert {name} == {desc['value']}, {'compiled for ' + name + ' == ' + desc['value']!r}")
    tensor_in = [n for n, d in zip(names, cap["inputs"]) if d["tensor"]]
    dev = f"_dev = {tensor_in[0]}.device" if tensor_in else f"_dev = torch.device({'cpu' if cpu else 'cuda'!r})"
    ret = _output_expr(cap["outputs"]["structure"], cap["outputs"]["sources"], names)
    forward = [f"    def forward(self, {', '.join(names)}):"]
    forward += [f"        {line}" for line in checks + [dev] + body]
    forward.append(f"        return {ret}")
    init = _init_lines(cap)
    extra = []
    free = set()
    for line in body:
        free |= {n.id for n in ast.walk(ast.parse(line.strip())) if isinstance(n, ast.Name)}
    if "aten" in free:
        extra.append("aten = torch.ops.aten")
    if "extern_kernels" in free:
        header.append("from torch._inductor.select_algorithm import extern_kernels")
    doc = _doc(cap, target, len(fns))
    imports = ["import torch", "import torch.nn as nn", "import triton", "import triton.language as tl", *header]
    parts = [f'"""{doc}"""\n' + "\n".join(imports) + ("\n\n" + "\n".join(extra) if extra else ""),
             _PRELUDE.strip(), *blocks,
             "class ModelNew(nn.Module):\n" + "\n".join(init) + "\n\n" + "\n".join(forward)]
    source = "\n\n\n".join(parts) + "\n"
    ast.parse(source)
    return source


def _init_lines(cap: dict) -> list[str]:
    names = list(cap["init_names"])
    defaults = list(cap["init_defaults"])
    sig = []
    seen_default = False
    for name, default in zip(names, defaults):
        if default is None and seen_default:
            default = "None"
        seen_default = seen_default or default is not None
        sig.append(name if default is None else f"{name}={default}")
    if cap.get("init_varargs"):
        sig.append("*args")
    lines = [f"    def __init__(self{''.join(', ' + s for s in sig)}):", "        super().__init__()"]
    for name, value in zip(names, cap["init_values"]):
        if value is not None:
            lines.append(f"        assert {name} == {value}, {'compiled for ' + name + ' == ' + value!r}")
    return lines


def _doc(cap: dict, target: str, n_kernels: int) -> str:
    mode = cap["mode"]
    return (f"{cap['op']}: Triton from torch.compile({cap['class']}, mode={mode!r}, dynamic=False), made into "
            f"plain launches\nby the farm's inductor generator ({n_kernels} kernel(s); captured on "
            f"{cap['device_name']}, torch {cap['torch_version']}, triton {cap['triton_version']}; target {target}).\n\n"
            f"Shape-specialized: correct only for the captured input shapes, strides and dtypes\n"
            f"({cap['shapes']} shape set) and constructor arguments, which forward and __init__ assert.\n")
