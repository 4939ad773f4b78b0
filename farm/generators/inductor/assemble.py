"""Turn a capture (farm.generators.inductor.capture) into a ModelNew candidate.

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

On the cpu target (how the capture gets Triton there: farm.generators.inductor.capture), the
candidate maps `libdevice.f` to `tl.math.f`, which the interpreter implements, and refuses (no
seed) when a function has no such equivalent."""

from __future__ import annotations

import ast
from typing import Any

from farm import pyast
from farm.generators.inductor.kernels import _kernel_defs, kernel_sources
from farm.generators.inductor.layers import Unsupported
from farm.pyast import dotted_name as _dotted
from farm.targets import known

_EMPTY_STRIDED = {"empty_strided_cuda", "empty_strided_cpu", "empty_strided_xpu", "empty_strided_mtia", "empty_strided"}

_DROP_CALLS = {"assert_alignment", "get_raw_stream"}

_GRID_AXES = {
    "Grid1D": ("xnumel", "XBLOCK"),
    "Grid2D": ("xnumel", "XBLOCK", "ynumel", "YBLOCK"),
    "Grid3D": ("xnumel", "XBLOCK", "ynumel", "YBLOCK", "znumel", "ZBLOCK"),
}


def _call_function(wrapper: str) -> ast.FunctionDef:
    calls = [n for n in ast.walk(pyast.parse(wrapper)) if isinstance(n, ast.FunctionDef) and n.name == "call"]
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
            return ast.copy_location(ast.Call(pyast.parse("torch.empty_strided", mode="eval").body, args, kw), node)
        if name == "reinterpret_tensor":
            return ast.copy_location(ast.Call(ast.Name("_reinterpret", ast.Load()), node.args, node.keywords), node)
        return node


def _launch_lines(
    rec: dict, run: ast.Call, index: int, kernel: ast.FunctionDef, interpreter: bool = False
) -> list[str]:
    """A plain launch for one `kernel.run(...)` with the recorded config and grid."""
    if len(run.args) != len(rec["arg_names"]):
        raise Unsupported(
            f"launch {index} of {rec['kernel']}: {len(run.args)} arguments, recorded {len(rec['arg_names'])}"
        )
    extra = [k.arg for k in run.keywords if k.arg != "stream"]
    if extra or rec.get("extra_kwargs"):
        raise Unsupported(f"launch {index} of {rec['kernel']} passes {extra or rec['extra_kwargs']}")
    params = [a.arg for a in kernel.args.args]
    kwargs = {name: ast.unparse(arg) for name, arg in zip(rec["arg_names"], run.args)}
    lines = []
    blocks = {}
    if interpreter:
        rec = _interpreter_config(rec, kernel)
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
        lines += [
            f"assert {local} == {value!r}, 'the grid is fixed for {key}={value}'"
            for key, (local, value) in blocks.items()
            if not key.startswith("R")
        ]
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


INTERPRETER_TILE = 2**16  # elements per program the cpu target's XBLOCK is raised to


def _interpreter_config(rec: dict, kernel: ast.FunctionDef) -> dict:
    """The cpu target's config: XBLOCK raised so that one program covers up to
    INTERPRETER_TILE elements. Inductor's first config (the interpreter does not autotune)
    suits a GPU's threads; the Triton interpreter pays per program, so a conv reduction with
    XBLOCK=2 ran 50,000 programs per call. Only where the grid follows XBLOCK (cdiv), and an
    unmasked x axis keeps a block that divides its size."""
    config = dict(rec["config"])
    xnumel = rec["scalars"].get("xnumel")
    block = config.get("XBLOCK")
    if not isinstance(xnumel, int) or not isinstance(block, int) or rec.get("grid_type") not in _GRID_AXES:
        return rec
    other = 1
    for key, value in config.items():
        if key.endswith("BLOCK") and key != "XBLOCK" and isinstance(value, int):
            other *= value
    target = min(1 << max(xnumel - 1, 0).bit_length(), max(block, INTERPRETER_TILE // max(other, 1)))
    new = 1 << (target.bit_length() - 1)  # a power of two, as tl.arange needs
    if _unmasked(kernel, "xmask"):
        while new > block and xnumel % new:
            new //= 2
    new = max(new, block)
    if new == block:
        return rec
    config["XBLOCK"] = new
    axes = _GRID_AXES[rec["grid_type"]]
    grid = list(rec["grid"])
    if grid[0] != -(-xnumel // block) or axes[:2] != ("xnumel", "XBLOCK"):
        return rec  # a grid this rule does not understand: leave it as inductor made it
    grid[0] = -(-xnumel // new)
    return {**rec, "config": config, "grid": grid}


_UNMASKED_AXES = (
    ("xnumel", "XBLOCK", "xmask"),
    ("ynumel", "YBLOCK", "ymask"),
    ("znumel", "ZBLOCK", "zmask"),
    ("r0_numel", "R0_BLOCK", "r0_mask"),
    ("r1_numel", "R1_BLOCK", "r1_mask"),
)


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
    state: dict[str, Any] = {"launch": 0, "graph_args": None, "ret": None}
    lines: list[str] = []
    rewrite = _WrapperRewrite()

    def emit(stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id == "args":
            target = stmt.targets[0]
            elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
            names = [e.id for e in elts if isinstance(e, ast.Name)]
            if len(names) != len(elts):
                raise Unsupported(f"call() unpacks its inputs into {ast.unparse(target)}, not names")
            if len(names) != len(cap["graph_inputs"]):
                raise Unsupported(f"call() unpacks {len(names)} inputs, recorded {len(cap['graph_inputs'])}")
            for name, i in zip(names, cap["graph_inputs"]):
                lines.append(f"{name} = {_graph_input(i, param_names)}")
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
                lines.extend(_launch_lines(rec, stmt.value, state["launch"], fns[func[:-4]], interprets(cap["target"])))
                state["launch"] += 1
                return
        if (
            isinstance(stmt, ast.Assign)
            and isinstance(stmt.value, ast.Call)
            and _dotted(stmt.value.func) in _DROP_CALLS
        ):
            return
        if isinstance(stmt, ast.With) and all(
            "DeviceGuard" in _dotted(i.context_expr.func) for i in stmt.items if isinstance(i.context_expr, ast.Call)
        ):
            for inner in stmt.body:
                emit(inner)
            return
        if isinstance(stmt, ast.Return):
            value = stmt.value
            items = value.elts if isinstance(value, (ast.Tuple, ast.List)) else [value] if value is not None else []
            texts = [ast.unparse(rewrite.visit(i)) for i in items]
            lines.append(f"_ret = ({', '.join(texts)}{',' if len(texts) == 1 else ''})")
            state["ret"] = len(texts)
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


def _graph_input(source: int | dict, param_names: list[str]) -> str:
    """A forward argument, or the module's own parameter/buffer (rebuilt by __init__)."""
    if isinstance(source, int):
        return param_names[source]
    if "param" in source:
        return f"self.get_parameter({source['param']!r})"
    if "buffer" in source:
        return f"self.get_buffer({source['buffer']!r})"
    owner, _, name = source["attr"].rpartition(".")  # a plain tensor attribute
    return f"self.get_submodule({owner!r}).{name}" if owner else f"self.{name}"


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
    if kind == "ret":
        base = f"_ret[{idx}]"
    elif kind == "input":
        base = param_names[idx]
    else:  # the module's own tensor
        base = _graph_input({kind: idx}, param_names)
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


def interprets(target: str | None) -> bool:
    """Whether the target runs Triton in the interpreter (cpu): its kernels get the interpreter's
    config, and the capture launched nothing on a device."""
    caps = known(target)
    return bool(caps and caps.interpret)


def assemble(cap: dict, target: str | None = None) -> str:
    """The candidate module for one capture (see the module docstring)."""
    target = target or cap["target"]
    cpu = interprets(target)
    kernels = kernel_sources(cap["wrapper"])
    if not kernels:
        raise Unsupported("inductor generated no Triton kernel (the graph is all extern/aten calls)")
    blocks, fns, header = _kernel_defs(kernels, cpu)
    n_in = len(cap["inputs"])
    names = list(cap["forward_names"][:n_in])
    reserved = {"self", "torch", "triton", "tl", "nn", "_dev", "_ret", "_check", "_reinterpret"}
    if (
        len(names) < n_in
        or cap.get("forward_varargs")
        or any(n in reserved or n.startswith(("arg", "buf")) for n in names)
    ):
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
        free |= {n.id for n in ast.walk(pyast.parse(line.strip())) if isinstance(n, ast.Name)}
    if "aten" in free:
        extra.append("aten = torch.ops.aten")
    if "extern_kernels" in free:
        header.append("from torch._inductor.select_algorithm import extern_kernels")
    doc = _doc(cap, target, len(fns))
    imports = ["import torch", "import torch.nn as nn", "import triton", "import triton.language as tl", *header]
    copy = cap.get("init_copy") or {}
    imports += [line for line in copy.get("imports", []) if line not in imports]
    _check_helper_names(copy, fns)
    methods = ["\n".join(f"    {line}" for line in m.splitlines()) for m in copy.get("methods", [])]
    parts = [
        f'"""{doc}"""\n' + "\n".join(imports) + ("\n\n" + "\n".join(extra) if extra else ""),
        _PRELUDE.strip(),
        *copy.get("module", []),
        *blocks,
        "class ModelNew(nn.Module):\n" + "\n\n".join(["\n".join(init), "\n".join(forward), *methods]),
    ]
    source = "\n\n\n".join(parts) + "\n"
    pyast.parse(source)
    return source


def _check_helper_names(copy: dict, fns: dict) -> None:
    """The module-level helpers a copied constructor brings must not shadow a kernel."""
    for text in copy.get("module", []):
        node = pyast.parse(text).body[0]
        assert isinstance(node, (ast.FunctionDef, ast.Assign)), text  # a def or `NAME = value` (constructor.py)
        name = node.name if isinstance(node, ast.FunctionDef) else _dotted(node.targets[0])
        if name in fns or name.startswith("triton_helpers_") or name.startswith("libdevice_"):
            raise Unsupported(f"the ground truth's helper {name} has the name of a kernel of the candidate")


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
    if cap.get("init_copy"):
        lines.append("        # the ground truth's own __init__: under the same seed it draws the same values")
        return lines + [f"        {line}" for line in cap["init_copy"]["body"]]
    layers = cap.get("layers") or []
    if layers:
        # built in the ground truth's order: under the same seed they hold its values
        lines.append("        # the ground truth's layers, in its order: under the same seed they hold the same values")
    made = {""}
    for layer in layers:
        parts = layer["path"].split(".")
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth])
            if prefix not in made:
                lines.append(f"        {_container(parts[:depth])}.add_module({parts[depth - 1]!r}, nn.Module())")
                made.add(prefix)
        lines.append(f"        {_container(parts)}.add_module({parts[-1]!r}, {layer['call']})")
    return lines


def _container(parts: list[str]) -> str:
    """The module that holds the last element of a dotted path, as an expression on self."""
    if len(parts) == 1:
        return "self"
    return f"self.get_submodule({'.'.join(parts[:-1])!r})"


def _doc(cap: dict, target: str, n_kernels: int) -> str:
    mode = cap["mode"]
    options = "".join(f", {k}={v!r}" for k, v in (cap.get("options") or {}).items())
    return (
        f"{cap['op']}: Triton from torch.compile({cap['class']}, mode={mode!r}, dynamic=False{options}), made into "
        f"plain launches\nby the farm's inductor generator ({n_kernels} kernel(s); captured on "
        f"{cap['device_name']}, torch {cap['torch_version']}, triton {cap['triton_version']}; target {target}).\n\n"
        f"Shape-specialized: correct only for the captured input shapes, strides and dtypes\n"
        f"({cap['shapes']} shape set) and constructor arguments, which forward and __init__ assert.\n"
    )
