"""torch.compile a task's Reference and record inductor's Triton output (farm.generators.inductor.assemble
turns it into a ModelNew candidate; both are used by farm.generators.inductor.generator).

capture (child side, `capture_child`)
    Runs in a child process pinned to the target (farm.runtime.children.run_in_child): loads the
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

On the cpu target (Triton interpreter), inductor is asked for Triton via
`torch._inductor.config.cpu_backend = "triton"`. Its code generation asks the (absent)
Triton driver for a backend hash, which the child replaces with a constant; kernels are not
executed during capture (the interpreter cannot run inductor's `libdevice` calls), so the
first config is taken (farm.generators.inductor.assemble maps libdevice for the interpreter)."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from typing import Any

from farm.generators.inductor import decompose
from farm.generators.inductor.constructor import copied_init
from farm.generators.inductor.layers import Unsupported, state_layers, tensor_state
from farm.targets import Target, get_target

FORMAT = 1  # of the capture dict


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
    return (a is b) or (
        a.device == b.device
        and a.dtype == b.dtype
        and a.data_ptr() == b.data_ptr()
        and tuple(a.shape) == tuple(b.shape)
        and tuple(a.stride()) == tuple(b.stride())
    )


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
    raise Unsupported(
        "a forward output is neither a graph output nor an input (nor a view of one): "
        "it was made outside the compiled graph"
    )


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
                rec.problems.append(
                    f"the graph holds constant tensors ({', '.join(sorted(graph.constants))}), "
                    "which a candidate cannot rebuild"
                )
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

        # patched while the capture runs, put back by `undo` (torch's stubs forbid assigning methods)
        GraphLowering.compile_to_module = compile_to_module  # type: ignore[method-assign,assignment]
        CachingAutotuner.run = run  # type: ignore[method-assign]
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


def _configure(target: Target, mode: str, emulate_precision_casts: bool = True) -> None:
    import torch
    import torch._inductor.config as icfg

    torch._dynamo.reset()
    import warnings

    # the caches are off on purpose (a hit would skip the hooks): torch's note saying so is noise
    warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
    icfg.compile_threads = 1  # no worker pool: the child stays one process group, small graphs
    icfg.force_disable_caches = True  # a cache hit would skip the hooks
    # Round fp16/bf16 intermediates where eager does: the evaluator compares with eager
    # Reference outputs, and inductor's fp32-throughout math can differ by more than the
    # tolerance where eager's rounded intermediates cancel (rotary embedding: x1*cos - x2*sin).
    if hasattr(icfg, "emulate_precision_casts"):
        icfg.emulate_precision_casts = emulate_precision_casts
    # no extern library calls: matmul and convolution become Triton (farm.generators.inductor.decompose);
    # on a device (cuda), max-autotune keeps matmul for inductor's Triton mm templates (tl.dot) instead
    templates = not target.interpret and mode.startswith("max-autotune")
    decompose.install(matmul=not templates)
    if templates:
        icfg.max_autotune_gemm_backends = "TRITON"
    if target.interpret:
        import warnings

        warnings.filterwarnings("ignore", message="Could not find an active CPU backend")
        icfg.cpu_backend = "triton"
        import torch.utils._triton as ut

        try:
            ut.triton_hash_with_backend()
        except Exception:  # noqa: BLE001 - no driver under the interpreter: a fixed hash will do
            ut.triton_hash_with_backend = lambda: "TRITON-INTERPRETER"  # type: ignore[assignment]  # was cached


def _set_options(options: dict) -> str:
    """Inductor config options by dotted name ("triton.persistent_reductions": False); the
    first name this torch does not know, else ""."""
    import torch._inductor.config as icfg

    for key, value in options.items():
        owner: Any = icfg
        *path, last = key.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        if owner is None or not hasattr(owner, last):
            return key
        setattr(owner, last, value)
    return ""


def capture_child(
    report: Callable[[str], None],
    task_path: str,
    source: str,
    shapes: str,
    mode: str,
    target: str,
    seed: int = 0,
    emulate_precision_casts: bool = True,
    policy=None,
    reference: str | None = None,
    options: dict | None = None,
    cases: list[dict] | None = None,
) -> dict:
    """In a child pinned to the target: compile the ground truth and record what inductor made.

    `cases`: the recorded cases of the op's shape space (farm.corpus.cases.Case.as_dict); each
    whose inputs differ from the benchmark case's is compiled at its own shapes too, under
    capture["cases"] (a list of {"case", "wrapper", "launches", "inputs", ...}), for a candidate
    that dispatches on its input shapes (farm.generators.inductor.dispatch).

    Returns {"ok": True, ...capture...} or {"ok": False, "reason": ...} for an understood
    refusal; unexpected errors raise (the parent gets the traceback)."""
    import torch

    from farm.corpus import tasks as taskfiles
    from farm.corpus.inputs import draw_init_inputs, draw_seeded
    from farm.runtime.tensors import seed_all, to_device

    caps = get_target(target)
    report("load")
    # `reference`: AKG's comparison class that runs here (the reference data names it), the
    # PyTorch truth of a Triton original
    task = taskfiles.load_task(taskfiles.ref_from_file(task_path, source=source, policy=policy), shapes,
                            reference=reference)
    cls = task.truth_cls
    init_inputs = draw_init_inputs(task, seed)
    # one draw, not draw_inputs' checked pair: the reference stage has checked the task's
    # determinism already, and at KernelBench's shapes a second multi-GiB host draw per capture
    # was most of an H100 capture's time
    inputs = draw_seeded(task, seed)
    device = "cpu" if caps.interpret else f"{caps.torch_device}:0"  # the pinned device is always index 0
    seed_all(seed)
    model = cls(*init_inputs).to(device).eval()
    init_copy = None
    try:
        layers = state_layers(model, cls.__name__, seed)  # farm.generators.inductor.layers
    except Unsupported as exc:
        try:  # no constructor calls rebuild the state: the ground truth's own __init__ may
            layers, init_copy = [], copied_init(cls, model, init_inputs, seed)
        except Unsupported as why_not:
            return {"ok": False, "reason": f"{exc}; {why_not}"}
    dev_inputs = to_device(inputs, device)
    report("compile")
    _configure(caps, mode, emulate_precision_casts)
    unknown = _set_options(options or {})
    if unknown:
        return {"ok": False, "reason": f"this torch's inductor has no option {unknown}"}
    out, rec, reason = _compiled_call(model, dev_inputs, mode, caps)
    if reason:
        return {"ok": False, "reason": reason}
    report("record")
    if rec.problems:
        return {"ok": False, "reason": "; ".join(rec.problems)}
    if len(rec.calls) != 1:
        return {"ok": False, "reason": f"the compiled forward ran {len(rec.calls)} inductor graphs (expected one)"}
    call = rec.calls[0]
    try:
        _same_constants(out, model, lambda: to_device(draw_seeded(task, seed + 1), device))
        capture = _describe(task, cls, init_inputs, inputs, dev_inputs, call, out, model)
    except Unsupported as exc:
        return {"ok": False, "reason": str(exc)}
    capture["layers"], capture["init_copy"] = layers, init_copy
    if cases:
        report("cases")
        try:
            capture["cases"] = _case_captures(task, cls, init_inputs, model, cases, capture["inputs"], device,
                                              mode, caps)
        except Unsupported as exc:
            return {"ok": False, "reason": str(exc)}
    capture.update(
        ok=True,
        format=FORMAT,
        wrapper=rec.modules[call["module"]]["code"],
        launches=rec.launches,
        mode=mode,
        options=dict(options or {}),
        target=target,
        shapes=shapes,
        emulate_precision_casts=emulate_precision_casts,
        op=task.ref.op,
        source=source,
        torch_version=str(torch.__version__),
        triton_version=_triton_version(),
        device_name="cpu (Triton interpreter)" if caps.interpret else caps.device_name(),
    )
    return capture


def _compiled_call(model, dev_inputs: list, mode: str, target: Target) -> tuple[Any, _Recorder, str]:
    """(output, what was recorded, "" or why there is no capture) of one compile and run."""
    import torch

    torch._dynamo.reset()  # a fresh compile whose hooks see everything (each case compiles anew)
    rec = _Recorder(execute_kernels=not target.interpret)
    undo = rec.install()
    out = None
    try:
        compiled = torch.compile(model, mode=None if mode == "default" else mode, dynamic=False, fullgraph=True)
        with torch.no_grad():
            out = compiled(*dev_inputs)
        target.synchronize()
    except Exception as exc:  # noqa: BLE001 - torch.compile failing is a reason, not a crash
        return out, rec, f"torch.compile failed: {type(exc).__name__}: {str(exc)[:600]}"
    finally:
        for fn in undo:
            fn()
    if rec.problems:
        return out, rec, "; ".join(rec.problems)
    if len(rec.calls) != 1:
        return out, rec, f"the compiled forward ran {len(rec.calls)} inductor graphs (expected one)"
    return out, rec, ""


def _case_captures(task, cls, init_inputs, model, cases: list[dict], bench_inputs: list, device: str, mode: str,
                   target: Target) -> list[dict]:
    """One capture per case whose inputs (shapes, strides, dtypes, values) no earlier one has:
    inductor's kernels are compiled for one shape (dynamic=False)."""
    from farm.corpus.cases import Case, applied
    from farm.corpus.inputs import draw_seeded
    from farm.runtime.tensors import to_device

    seen, out = [bench_inputs], []
    for doc in cases:
        case = Case.from_dict(doc)
        with applied(task, task.space, case):
            inputs = draw_seeded(task, case.seed)
        dev_inputs = to_device(inputs, device)
        result, rec, reason = _compiled_call(model, dev_inputs, mode, target)
        where = f"at the {case.describe()}"
        if reason:
            raise Unsupported(f"{where}: {reason}")
        try:
            one = _describe(task, cls, init_inputs, inputs, dev_inputs, rec.calls[0], result, model)
        except Unsupported as exc:
            raise Unsupported(f"{where}: {exc}") from None
        if one["inputs"] in seen:
            continue
        seen.append(one["inputs"])
        one.update(case=case.as_dict(), wrapper=rec.modules[rec.calls[0]["module"]]["code"], launches=rec.launches)
        out.append(one)
    return out


def _same_constants(out, model, other_inputs: Callable[[], list]) -> None:
    """The plain values a forward returns become literals of the candidate: only if the ground
    truth returns the same ones on other inputs (a `.item()` of a result is no constant)."""
    import torch

    def plain(value) -> list:
        if isinstance(value, (tuple, list)):
            return [p for v in value for p in plain(v)]
        return [] if isinstance(value, torch.Tensor) else [value]

    mine = plain(out)
    if all(v is None for v in mine):
        return  # nothing to compare: spare the forward
    with torch.no_grad():  # a second draw only here: at KernelBench's shapes it costs GiBs on the host
        other = plain(model(*other_inputs()))
    if mine != other and not all(a != a and b != b for a, b in zip(mine, other) if a != b):
        raise Unsupported(f"forward returns plain values that depend on its inputs ({mine[:3]} on one draw, "
                          f"{other[:3]} on another): a candidate's outputs are tensors or constants")


def _triton_version() -> str:
    import triton

    return str(triton.__version__)


def _describe(task, cls, init_inputs, inputs, dev_inputs, call, out, model=None) -> dict:
    import torch

    state = [(kind, n, t) for n, (kind, t) in tensor_state(model).items()] if model is not None else []
    graph_inputs: list[int | dict[str, str]] = []  # a forward input's index, or {kind: name} of the module's
    for k, arg in enumerate(call["args"]):
        if not isinstance(arg, torch.Tensor):
            raise Unsupported(f"graph input {k} is a {type(arg).__name__} (dynamic value)")
        for i, v in enumerate(dev_inputs):
            if isinstance(v, torch.Tensor) and _same_tensor(v, arg):
                graph_inputs.append(i)
                break
        else:
            for kind, name, t in state:
                if _same_tensor(t, arg):
                    graph_inputs.append({kind: name})
                    break
            else:
                raise Unsupported(
                    f"graph input {k} ({tuple(arg.shape)} {arg.dtype}) is neither a forward input nor a tensor the "
                    "module holds (a constant)"
                )
    leaves: list = []
    structure = _flatten(out, leaves)
    result = list(call["result"]) if isinstance(call["result"], (list, tuple)) else [call["result"]]
    pool: list[tuple[tuple, Any]] = [(("ret", j), t) for j, t in enumerate(result) if isinstance(t, torch.Tensor)]
    pool += [(("input", i), t) for i, t in enumerate(dev_inputs) if isinstance(t, torch.Tensor)]
    pool += [((kind, name), t) for kind, name, t in state]  # a parameter, buffer or table returned as it is
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
