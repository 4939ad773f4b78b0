"""The generated text of an exported package: pyproject.toml, the package and op __init__.py,
the per-op pytest file, the per-op docs page and the README. Pure functions of op.json's content."""

from __future__ import annotations

import json
from pathlib import Path

from farm.evaluate import verified
from farm.export.fetch import module_name
from farm.targets import builtin_targets, known

RUNTIME_FILE = Path(__file__).with_name("package_runtime.py")


def envelope_text(env: dict) -> str:
    from farm.export.package_envelope import text

    return text(env)
FRESH_SEEDS = (1001, 1002)


TRITON_MARKER = 'sys_platform == "linux" and (platform_machine == "x86_64" or platform_machine == "aarch64")'


def _triton_distribution(target: str) -> str:
    """Which distribution gives the target's `import triton` (Target.triton_distribution:
    triton-ascend replaces triton); triton for a target not installed here."""
    caps = known(target)
    return caps.triton_distribution if caps else "triton"


def pyproject(name: str, run: str | None, version: str, entries: list[dict]) -> str:
    # triton only where it has wheels (a macOS or Windows install gets the fallbacks);
    # numpy where a kernel runs in Triton's interpreter, which needs it
    deps = ['"torch"']
    if any(_triton_distribution(t) == "triton" for e in entries for t in e["targets"]):
        deps.append(f"'triton; {TRITON_MARKER}'")
    if any(e.get("interpret") for e in entries):
        deps.append('"numpy"')
    return f"""[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name.replace('_', '-')}"
version = "{version}"
description = "Triton kernels verified by Kernel Farm{' (run ' + run + ')' if run else ''}, with PyTorch fallbacks"
readme = "README.md"
requires-python = ">=3.10"
dependencies = [{", ".join(deps)}]

[project.optional-dependencies]
test = ["pytest"]

[tool.setuptools.packages.find]
include = ["{name}", "{name}.*"]

[tool.setuptools.package-data]
"*" = ["*.json", "*.pt"]
"""


def layers_of(entries: list[dict]) -> dict[str, dict]:
    """Per layer kind, the op that implements it: a training op first, then by name."""
    chosen: dict[str, dict] = {}
    for e in sorted(entries, key=lambda e: (not e.get("backward"), e["source"], e["op"])):
        for layer in e.get("layers") or []:
            chosen.setdefault(layer["kind"], {"op": f"{e['source']}/{e['op']}", "module": e["module"],
                                              "class": e["class"], **{k: layer[k] for k in ("forward", "init", "ranks")}})
    return chosen


def package_init(name: str, entries: list[dict], version: str = "0.1.0") -> str:
    ops = ",\n".join(f'    "{e["source"]}/{e["op"]}": "{e["module"]}"' for e in entries)
    layers = json.dumps(layers_of(entries), indent=1)
    return f'''"""Kernels exported by Kernel Farm (`farm export`). One subpackage per source and op; the
dispatch rule is in _runtime.py and README.md. Force the PyTorch fallback for every op with
KFARM_FORCE_FALLBACK=1, {name.upper()}_FORCE_FALLBACK=1 or force_fallback(True).

    import {name}
    report = {name}.patch(model)     # swap the layers this package has kernels for; print(report)
    {name}.stats()                   # kernel and fallback calls per op
"""

from {name} import _layers
from {name}._layers import GELU, LayerNorm, PatchReport, RMSNorm, SiLU, SwiGLUMLP, GELUTanh, patch
from {name}._runtime import (FORCE_ENV, GRAD_ENV, FallbackWarning, KernelGradError, NoFallbackError, fallback_only,
                             force_fallback, on_grad, reset_stats, stats)

__version__ = "{version}"
PACKAGE_FORCE_ENV = "{name.upper()}_FORCE_FALLBACK"

# source/op -> module
OPS = {{
{ops}
}}

# layer kind -> the op that implements it (found by behaviour at export; _layers.py)
LAYERS = {layers}
_layers.configure(LAYERS)

__all__ = ["OPS", "LAYERS", "FORCE_ENV", "GRAD_ENV", "PACKAGE_FORCE_ENV", "FallbackWarning", "KernelGradError",
           "NoFallbackError", "fallback_only", "force_fallback", "on_grad", "stats", "reset_stats", "patch", "PatchReport", "RMSNorm",
           "LayerNorm", "SiLU", "GELU", "GELUTanh", "SwiGLUMLP", "__version__"]
'''


def op_init(pkg: str, source: str, op: str, fn: str, cls: str, doc: dict) -> str:
    return f'''"""{source}/{op}: {doc["doc"] or "exported kernel"}

    from {pkg}.{module_name(source)}.{module_name(op)} import {fn}, {cls}
    {fn}(*inputs)                   # with the verified constructor arguments
    {cls}(*init_inputs)(*inputs)    # nn.Module, same constructor as the task's Model

Kernels: {", ".join(sorted(doc["kernels"])) or "none"}; fallback: {doc["truth"] or "none"}. Rule: {pkg}/_runtime.py.
"""

from pathlib import Path

from {pkg}._runtime import Op, OpModule

op = Op(Path(__file__).parent, __name__)
explain = op.explain


class {cls}(OpModule):
    """nn.Module: the verified kernel where the rule allows, else the PyTorch fallback."""

    op = op


def {fn}(*inputs):
    """Run {source}/{op} on `inputs` (the task's forward arguments)."""
    return op(*inputs)


__all__ = ["{fn}", "{cls}", "op", "explain"]
'''


CONFTEST = '''"""Generated by farm export. The tests import the installed package, not this folder."""
'''


def op_tests(pkg: str, source: str, op: str, doc: dict, cls_name: str = "") -> str:
    mod = f"{pkg}.{module_name(source)}.{module_name(op)}"
    data = f'DATA = Path(__file__).parent / "data" / {doc["data_file"]!r}' if doc["data_file"] else "DATA = None"
    aot_targets = [t for t, k in doc["kernels"].items() if (k.get("aot") or {}).get("status") == "generated"]
    aot_dir = f'AOT = Path(__file__).parent.parent / "aot" / {source!r} / {op!r}'
    return f'''"""Generated by farm export: {source}/{op}. Kernel tests skip where their device is absent;
the fallback tests always run."""

import random
import warnings
from pathlib import Path

import pytest
import torch

import {pkg}
from {pkg}._checks import check_outputs, load_case
from {pkg}._runtime import NoFallbackError
from {mod} import op

{data}
{aot_dir}
TARGETS = {sorted(doc["kernels"])!r}
AOT_TARGETS = {aot_targets!r}


def _case(device="cpu"):
    if DATA is None or not DATA.exists():
        pytest.skip("the stored seed set was too large to ship with the tests")
    return load_case(DATA, device)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv({pkg}.FORCE_ENV, raising=False)
    monkeypatch.delenv({pkg}.PACKAGE_FORCE_ENV, raising=False)
    {pkg}.force_fallback(None)
    yield
    {pkg}.force_fallback(None)


def test_fallback_on_cpu_matches_stored_outputs(monkeypatch):
    monkeypatch.setenv({pkg}.FORCE_ENV, "1")
    case = _case()
    if not op.has_fallback:
        with pytest.raises(NoFallbackError):
            op(*case["inputs"])
        return
    assert op.explain(*case["inputs"])["backend"] == "fallback"
    check_outputs(op(*case["inputs"]), case["outputs"], op.tolerance)


@pytest.mark.parametrize("switch", ["env", "package_env", "function"])
def test_forced_fallback_switch(monkeypatch, switch):
    case = _case()
    if switch == "env":
        monkeypatch.setenv({pkg}.FORCE_ENV, "1")
    elif switch == "package_env":
        monkeypatch.setenv({pkg}.PACKAGE_FORCE_ENV, "1")
    else:
        {pkg}.force_fallback(True)
    decision = op.explain(*case["inputs"])
    assert decision["backend"] == "fallback" and "forced" in decision["reason"]


def test_rule_on_cpu_inputs():
    case = _case()
    decision = op.explain(*case["inputs"])
    runs_kernel = any(op.device_type(t) == "cpu" and not op.ready(t) for t in TARGETS)
    assert decision["backend"] == ("kernel" if runs_kernel else "fallback"), decision


def test_other_dtype_falls_back():
    case = _case()
    inputs = [x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
              for x in case["inputs"]]
    if all(a is b for a, b in zip(inputs, case["inputs"])):
        pytest.skip("no floating-point input to change")
    assert op.explain(*inputs)["backend"] == "fallback"


@pytest.mark.parametrize("target", TARGETS)
def test_kernel_on_stored_seed_set(target):
    if op.ready(target):
        pytest.skip(op.ready(target))
    case = _case(op.device_type(target))
    decision = op.explain(*case["inputs"])
    assert decision["backend"] == "kernel", decision
    with warnings.catch_warnings():
        warnings.simplefilter("error", {pkg}.FallbackWarning)
        out = op(*case["inputs"])
    check_outputs(out, case["outputs"], op.tolerance)


@pytest.mark.parametrize("seed", {list(FRESH_SEEDS)!r})
@pytest.mark.parametrize("target", TARGETS)
def test_kernel_on_fresh_inputs(target, seed):
    if op.ready(target):
        pytest.skip(op.ready(target))
    if not op.has_fallback:
        pytest.skip("no PyTorch Reference to check fresh inputs against (reference-data mode)")
    inputs = op.fresh_inputs(seed, op.device_type(target))
    expected = op.run_truth(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    got = op.run_kernel(target, *inputs)
    check_outputs(got, [x.cpu() if isinstance(x, torch.Tensor) else x for x in _list(expected)], op.tolerance)


def _list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


SPACE_CASES = 20
GRAD_SCALE = 8.0  # gradients sum over rows: the forward tolerance times this (the farm's)


def _space_cases(target):
    """(values, dtype, seed) of random points inside the target's verified envelope."""
    env = op.envelope(target)
    if env["status"] != "checked":
        pytest.skip(f"the envelope is the stored seed set only: {{env['reason']}}")
    dims = env["space"]["dims"]
    dtypes = sorted({{s["dtype"] for s in env["signatures"]}}, key=str)
    rng = random.Random(20260)
    for i in range(SPACE_CASES):
        yield {{d["name"]: rng.randint(d["low"], d["high"]) for d in dims}}, dtypes[i % len(dtypes)], 5000 + i


@pytest.mark.parametrize("target", TARGETS)
def test_kernel_over_the_space(target):
    """20 random shapes inside the space, each verified dtype: the kernel runs (no fallback) and
    equals the PyTorch truth, gradients included for a training op."""
    if op.ready(target):
        pytest.skip(op.ready(target))
    if not op.has_fallback:
        pytest.skip("no PyTorch truth to compare with (reference-data mode)")
    device = op.device_type(target)
    for values, dtype, seed in _space_cases(target):
        inputs = op.fresh_inputs(seed, device, values, dtype)
        assert op.explain(*inputs)["backend"] == "kernel", (values, dtype, op.explain(*inputs))
        before = {pkg}.stats().get(op.key, {{}}).get("kernel", 0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", {pkg}.FallbackWarning)
            got = _run(inputs, grad=op.backward)
        assert {pkg}.stats()[op.key]["kernel"] == before + 1, (values, dtype)
        with {pkg}.fallback_only():
            expected = _run(inputs, grad=op.backward)
        check_outputs(got[0], expected[0], op.tolerance)
        for g, e in zip(got[1], expected[1]):
            check_outputs(g, e, {{k: (a * GRAD_SCALE, r * GRAD_SCALE) for k, (a, r) in op.tolerance.items()}})


def _run(inputs, grad):
    """The op's outputs, and with `grad` the input gradients for a fixed upstream gradient."""
    inputs = [x.clone().requires_grad_(grad and x.is_floating_point()) if isinstance(x, torch.Tensor) else x
              for x in inputs]
    out = op(*inputs)
    outs = _list(out)
    if not grad:
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], []
    gen = torch.Generator().manual_seed(7)
    upstream = [torch.randn(o.shape, generator=gen).to(o.dtype).to(o.device) for o in outs]
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    grads = torch.autograd.grad(outs, leaves, upstream, allow_unused=True)
    return [o.detach() for o in outs], [[g] for g in grads if g is not None]


@pytest.mark.parametrize("target", TARGETS)
def test_outside_the_envelope_falls_back_and_is_counted(target):
    if op.ready(target) or not op.has_fallback:
        pytest.skip(op.ready(target) or "no fallback")
    env = op.envelope(target)
    if env["status"] != "checked" or not env["space"]["dims"]:
        pytest.skip("no space to step outside of")
    dim = env["space"]["dims"][0]
    inputs = op.fresh_inputs(1, op.device_type(target), {{dim["name"]: dim["high"] + 1}})
    decision = op.explain(*inputs)
    assert decision["backend"] == "fallback" and decision["rule"] == "envelope", decision
    {pkg}.reset_stats()
    with pytest.warns({pkg}.FallbackWarning, match="outside the verified envelope"):
        with torch.no_grad():
            op(*inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", {pkg}.FallbackWarning)  # once per op
        with torch.no_grad():
            op(*inputs)
    assert {pkg}.stats()[op.key]["by_rule"] == {{"envelope": 2}}


def test_torch_compile_traces_the_op():
    """fullgraph=True: the op is one torch.library node, no graph break (aot_eager: no C compiler needed)."""
    if not op.has_fallback:
        pytest.skip("no PyTorch fallback: the op is not a custom op (eager only)")
    inputs = op.fresh_inputs(3)
    from {mod} import {cls_name}
    layer = {cls_name}(*op.init_inputs())
    if layer.library_op() is None:
        pytest.skip(op.library_why)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        check_outputs(compiled(*inputs), _list(layer(*inputs)), op.tolerance)


@pytest.mark.parametrize("target", AOT_TARGETS)
def test_aot_c_on_stored_seed_set(target):
    if op.ready(target):
        pytest.skip(op.ready(target))
    from {pkg}._aot import build, replay

    build(AOT)
    out = replay(AOT, _case(op.device_type(target)))
    check_outputs(out, _case()["outputs"], op.tolerance)
'''


def op_doc(pkg: str, source: str, op: str, fn: str, cls: str, doc: dict) -> str:
    mod = f"{pkg}.{module_name(source)}.{module_name(op)}"
    fallback = {"Reference": "pytorch-reference (the task's Reference)",
                "Model": "pytorch-model (the task's Model, which is PyTorch)"}.get(doc["truth"] or "", "none")
    lines = [f"# {source}/{op}", "", doc["doc"] or "", "",
             "```python", f"from {mod} import {fn}, {cls}", f"{fn}(*inputs)                 # verified constructor arguments",
             f"{cls}(*init_inputs)(*inputs)  # nn.Module", f"{mod}.explain(*inputs)      # what runs, and why", "```", "",
             "## Support", "", "| device | backend | status |", "|---|---|---|"]
    kernels = doc["kernels"]
    builtin = builtin_targets()
    rows = [(t.name, t.torch_device) for t in builtin]
    rows += [(t, k["device_type"]) for t, k in sorted(kernels.items()) if t not in {b.name for b in builtin}]
    for target, device in rows:
        if target in kernels:
            k = kernels[target]
            note = " (Triton's interpreter; only with TRITON_INTERPRET=1)" if k.get("interpret") else ""
            lines.append(f"| {device} | triton-{target if not k.get('interpret') else 'interpreter'} | verified on "
                         f"{k.get('device_name') or target}{note}, run {k.get('run')} candidate {k.get('candidate')} |")
        else:
            lines.append(f"| {device} | {fallback.split(' ')[0]} | no kernel: never run on this device; fallback |")
    lines += ["", f"Fallback: {fallback}. " + ("Where it would be used, a call raises NoFallbackError instead."
                                                if doc["truth"] is None else ""),
              "The rule (README.md): forced fallback > gradients without a verified backward > device without a "
              "kernel > inputs outside the verified envelope > kernel import failure (FallbackWarning) > kernel.", "",
              "## Verified envelope", "",
              f"Shape space ({(doc.get('space') or {}).get('origin', 'none')}): "
              f"{_space_text(doc.get('space') or {})}. Training op: {'yes' if doc.get('backward') else 'no'}.", ""]
    for target, k in sorted(kernels.items()):
        env = k["envelope"]
        lines.append(f"- **{target}**: {envelope_text(env)} ({env['status']}: {env['reason']})")
        failed = [c for c in env.get("cases") or [] if not c["passed"]]
        lines += [f"  - failed at the {c['case_text']}: {c['reason']}" for c in failed]
    lines += ["", "Cases the export checked (the kernel in a child process, the PyTorch truth beside it, the farm's "
              "tolerances; forward, and backward for a training op):", "",
              "| target | case | dimensions | dtype | seed | result |", "|---|---|---|---|---|---|"]
    for target, k in sorted(kernels.items()):
        for c in k["envelope"].get("cases") or []:
            dims = ", ".join(f"{n}={v}" for n, v in c["values"].items())
            lines.append(f"| {target} | {c['label']} | {dims} | {c['dtype'] or '-'} | {c['seed']} | "
                         f"{'pass' if c['passed'] else 'FAIL: ' + c['reason']} |")
    lines += ["", "## Verified inputs", "",
              f"Stored seed set (the benchmark case): seed {doc.get('seed')}, shape set "
              f"`{doc.get('shapes') or 'bench'}`, made on {doc.get('ref_device') or '?'}.", "",
              "| input | kind | dtype | shape / value |", "|---|---|---|---|"]
    first = next(iter(kernels.values()))
    for i, v in enumerate(first["verified_inputs"]):
        lines.append(f"| {i} | {v['kind']} | {v.get('dtype', v.get('type', ''))} | "
                     f"{v.get('shape', v.get('value', ''))} |")
    lines += ["", "## Verification", ""]
    for target, k in sorted(kernels.items()):
        ver = k.get("verified") or {}
        lines += [f"- **{target}** on {k.get('device_name') or '?'}: outputs against the stored seed set "
                  f"(sha256 {str(k['ref_sha256'])[:16]}..., made by the original Model on {ver.get('ref_device') or '?'})"
                  f"; unseen inputs: {verified.describe(ver)}; a bitwise-identical second run, inputs left unchanged, "
                  "Triton launches observed."]
        if not k["ref_matches"]:
            lines.append(f"  The store's seed set has changed since (verified on {str(ver.get('ref_sha256'))[:16]}...); "
                         "the tests use the current one.")
    lines += ["", "Tolerance (|out - expected| <= atol + rtol*|expected|; integers exact; NaN/Inf positions equal):", "",
              "| dtype | atol | rtol |", "|---|---|---|"]
    lines += [f"| {d} | {a:g} | {r:g} |" for d, (a, r) in sorted(doc["tolerance"].items())]
    lines += ["", "## Timing", ""]
    for target, k in sorted(kernels.items()):
        t = k.get("timing") or {}
        base = k.get("baseline") or {}
        flush = (k.get("config") or {}).get("flush", "write")
        mode = ("Triton's interpreter on the CPU: host clock; the figures say nothing about speed"
                if k.get("interpret") else
                f"device events, cache flush `{flush}` before each rep, median of reps, no CUDA graph")
        lines += [f"**{target}** ({mode}):", "", "| | median ms | min ms | reps | rel. std. error |", "|---|---|---|---|---|",
                  f"| kernel | {_f(k.get('time_ms'))} | {_f(t.get('min_ms'))} | {t.get('reps', '-')} | "
                  f"{_pct(t.get('rse'))} |",
                  f"| original Model | {_f(base.get('model_ms'))} | | | |",
                  f"| PyTorch Reference | {_f(base.get('reference_ms'))} | | | |", "",
                  f"Speedup vs Model {_x(k.get('speedup_vs_model'))} {_spread(k.get('speedup_vs_model'), t)}, "
                  f"vs Reference {_x(k.get('speedup_vs_reference'))} {_spread(k.get('speedup_vs_reference'), t)}. "
                  "The spread is the kernel's own (min and relative standard error over its reps); the baselines' "
                  "spread is not stored.", ""]
    lines += ["## Reproduce", "", "```",
              f"farm reference --source {source} --op {op} --seed {doc.get('seed') or 0} --shapes {doc.get('shapes') or 'bench'}"]
    for _target, k in sorted(kernels.items()):
        lines.append(k["command"])
    lines += [f"farm export --run {first.get('run')} --source {source} --op {op} --out DIR --name {pkg}",
              "pip install DIR && pytest DIR/tests", "```", "", "## Not run on hardware", ""]
    never = [t.hardware for t in builtin if t.hardware and t.name not in kernels]
    if never:
        lines.append(f"- No kernel for {', '.join(never)}: these devices use the fallback; unverified there.")
    for target, k in sorted(kernels.items()):
        if k.get("interpret"):
            lines.append(f"- The {target} kernel ran in Triton's interpreter only: semantics verified, no hardware "
                         "timing.")
    for target, k in sorted(kernels.items()):
        a = k.get("aot")
        if a:
            state = {"generated": "C generated" + (f" for sm_{a['arch']} without a GPU" if a.get("arch") else "")
                     + ("" if a.get("testable") else f"; no stored-output test ({a.get('not_testable')})"),
                     "skipped": f"AOT C not generated: {a.get('reason')}",
                     "failed": f"AOT C failed: {a.get('reason')}"}[a["status"]]
            lines.append(f"- {target} AOT: {state}. The compiled library is built and run by "
                         "tests/test_*::test_aot_c_on_stored_seed_set (unverified until that passes on a GPU).")
    lines.append("- Inputs outside the envelope (other shapes, dtypes, constructor arguments): never run "
                 "through the kernel; unverified (KFARM_SHAPES=rank lets them through anyway).")
    lines += ["", "The timings and speedups are the search's figures for its best candidate, from the run above; "
              "the exported package does not re-time anything."]
    return "\n".join(lines) + "\n"


def _space_text(space: dict) -> str:
    dims = ", ".join(f"{d['name']} {d['low']}..{d['high']}" for d in space.get("dims", []))
    dtypes = space.get("dtypes") or []
    return (dims or "fixed") + (f"; dtypes {', '.join(dtypes)}" if len(dtypes) > 1 else "")


def _f(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def _x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _spread(speedup, timing: dict) -> str:
    if speedup is None or not timing.get("median_ms") or not timing.get("min_ms"):
        return ""
    best = speedup * timing["median_ms"] / timing["min_ms"]
    rse = timing.get("rse")
    return f"(at the kernel's min {best:.2f}x" + (f"; ±{100 * rse:.1f}%)" if rse is not None else ")")


def readme(index: dict) -> str:
    pkg = index["package"]
    lines = [f"# {pkg}", "",
             f"Triton kernels verified by Kernel Farm, exported {index['exported_at']} from {index['store']}"
             + (f", run {index['run']}" if index["run"] else "") + ".", "",
             "    pip install .            # torch; triton where it has wheels", "    pytest tests             # kernel tests skip where their device is absent", "",
             "Two lines put the kernels into a model (the layers this package has kernels for: "
             f"{', '.join(sorted(layers_of(index['ops']))) or 'none'}):", "",
             "```python", f"import {pkg}", f"print({pkg}.patch(model))   # swaps recognised layers; says what it swapped",
             "```", "",
             "| op | call | kernels | fallback | speedup vs Model | AOT C | docs |", "|---|---|---|---|---|---|---|"]
    for e in index["ops"]:
        speed = ", ".join(f"{t} {_x(v)}" for t, v in e["speedup_vs_model"].items())
        aot_s = ", ".join(f"{t}: {s}" for t, s in e["aot"].items()) or "-"
        lines.append(f"| {e['source']}/{e['op']} | `{e['module']}.{e['function']}` | {', '.join(e['targets'])} | "
                     f"{e['truth'] or 'none'} | {speed} | {aot_s} | [docs](docs/{e['source']}/{e['op']}.md) |")
    rule = (RUNTIME_FILE.read_text().split('"""')[1]).split("\n\n", 2)[-1].strip()
    lines += ["", "## The dispatch rule", "", rule, "",
              f"Switches: `KFARM_FORCE_FALLBACK=1` or `{pkg.upper()}_FORCE_FALLBACK=1` (or `{pkg}.force_fallback(True)`) "
              "forces the fallback; `KFARM_GRAD=raise` (or `on_grad(\"raise\")`) raises instead of falling back where "
              "a forward-only op is asked for gradients; `KFARM_SHAPES=rank` lets the kernel take shapes outside the "
              f"envelope (same dtypes and ranks: unverified). `<op module>.explain(*inputs)` says what would run and "
              f"why; `{pkg}.stats()` counts kernel and fallback calls per op.", ""]
    return "\n".join(lines) + "\n"
