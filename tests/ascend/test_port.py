"""farm port: every pass on a small source (before/after, then the CPU Triton interpreter against
torch), every corpus task's Model fully ported against its Reference, and the port generator."""

import ast
import importlib.util
import itertools
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from farm.ascend.lint import errors, lint
from farm.ascend.port import (
    PortContext,
    cap_allowed,
    pass_device,
    pass_dot,
    pass_fp64,
    pass_int64,
    pass_launch_options,
    pass_libdevice,
    pass_persistent,
    pass_tile,
    port,
    subtile_region,
)
from farm.ascend.port import pipeline as port_pipeline
from farm.corpus import opcheck
from farm.corpus import tasks as taskfiles
from farm.errors import FarmError
from farm.evaluate.static_checks import static_verdict
from farm.generators import load_generator
from farm.generators.base import Candidate, Context, model_as_candidate
from farm.runtime import tolerance
from farm.runtime.tensors import clone_values

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted(p for s in ("sglang", "vllm_triton", "demo") for p in (REPO / "tasks" / s).glob("*.py"))
ASCEND = PortContext(num_vectorcore=40, num_aicore=20)
# few cores and small sub-blocks, so that at small shapes the persistent and BLOCK_SUB loops iterate
STRESS = PortContext(num_vectorcore=3, num_aicore=2, block_sub=64)
_modules = itertools.count()


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    """Kernels defined while TRITON_INTERPRET=1 run in the CPU interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def load(source: str, tmp_path: Path):
    """Import a source from a file of its own (Triton reads kernel source from files)."""
    name = f"ported_{next(_modules)}"
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_fn(source: str, name: str = "_k"):
    return next(n for n in ast.parse(source).body if getattr(n, "name", "") == name)


def task_check(path: Path, source: str, tmp_path: Path) -> list:
    """ModelNew of `source` against the task's Reference at SMALL_SHAPES; the failed output checks."""
    task = taskfiles.load_task(taskfiles.TaskRef(path.parent.name, path.stem, path), "small")
    init, inputs = opcheck.draw_init_inputs(task, 0), opcheck.draw_inputs(task, 0)
    module = load(source, tmp_path)
    with torch.no_grad():
        got = module.ModelNew(*init)(*clone_values(inputs))
        want = task.truth_cls(*init)(*clone_values(inputs))
    checks = tolerance.compare_outputs(tolerance.as_output_list(got), tolerance.as_output_list(want), task.tolerance)
    return [c.as_dict() for c in checks if not c.ok]


# ------------------------------------------------------------------ the corpus, fully ported


@pytest.mark.parametrize("ctx", [ASCEND, STRESS], ids=["ascend", "stress"])
@pytest.mark.parametrize("path", CORPUS, ids=[f"{p.parent.name}/{p.stem}" for p in CORPUS])
def test_ported_corpus_task_matches_reference(path, ctx, tmp_path):
    source = model_as_candidate(path.read_text())
    ported = port(source, ctx)
    assert ported != source
    assert static_verdict(ported) == ("", "")
    assert "import torch_npu" in ported
    assert not [f for f in lint(ported) if f.rule in ("launch-options", "grid-limit", "int32-offset")]
    assert task_check(path, ported, tmp_path) == []


def test_port_is_idempotent():
    for path in CORPUS:
        once = port(model_as_candidate(path.read_text()), STRESS)
        assert port(once, STRESS) == once, path.stem


COMPILE_CHILD = textwrap.dedent('''
    import importlib.util, json, os, sys
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton._C.libtriton import ir
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    failures = []
    for i, job in enumerate(json.load(open(sys.argv[1]))):
        spec = importlib.util.spec_from_file_location(f"m{i}", job["path"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for k in job["kernels"]:
            try:
                ctx = ir.context(); ir.load_dialects(ctx); backend.load_dialects(ctx)
                ASTSource(getattr(module, k["kernel"]), signature=k["signature"], constexprs=k["constexprs"]).make_ir(
                    target, options, backend.get_codegen_implementation(options), backend.get_module_map(), ctx)
            except Exception as exc:
                failures.append([job["path"], k["kernel"], f"{type(exc).__name__}: {exc}"[-600:]])
    print(json.dumps(failures), flush=True)
    os._exit(0)  # skip nanobind's leak report at exit
''')
TTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "i32",
          torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}


def launch_signatures(module, task) -> list[dict]:
    """Run ModelNew with launches recorded instead of executed: each kernel's Triton signature."""
    import inspect

    from triton.runtime.interpreter import InterpretedFunction

    found = []

    def record(self, *args, grid=None, warmup=False, **kwargs):
        sig = inspect.signature(self.fn)
        bound = sig.bind(*args, **kwargs).arguments
        types, consts = {}, {}
        for name, param in sig.parameters.items():
            value = bound.get(name, param.default)
            if "constexpr" in str(param.annotation) or value is None:
                types[name], consts[name] = "constexpr", value
            elif isinstance(value, torch.Tensor):
                types[name] = "*" + TTYPES[value.dtype]
            else:
                types[name] = "i1" if isinstance(value, bool) else "i32" if isinstance(value, int) else "fp32"
        found.append({"kernel": self.fn.__name__, "signature": types, "constexprs": consts})

    # drawn first: drawing inputs measures the task's own Model on the meta device (the memory
    # guard), whose launches are not the ported module's
    init_inputs, inputs = opcheck.draw_init_inputs(task, 0), opcheck.draw_inputs(task, 0)
    original = InterpretedFunction.run
    InterpretedFunction.run = record
    try:
        module.ModelNew(*init_inputs)(*inputs)
    finally:
        InterpretedFunction.run = original
    return found


def compile_to_ttir(jobs: list[dict], tmp_path: Path) -> list:
    """Failures of the community Triton frontend (TTIR, CUDA target: no GPU needed) on the jobs,
    in a child without TRITON_INTERPRET (the interpreter and the compiler cannot share a process)."""
    spec = tmp_path / "jobs.json"
    spec.write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_CHILD, str(spec)], check=False, capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ported_corpus_kernels_compile_with_the_triton_frontend(tmp_path):
    """The interpreter is lax (a `return` in a loop, Python ints for tensors); the compiler is not."""
    jobs = []
    for ctx, path in itertools.product((ASCEND, STRESS), CORPUS):
        task = taskfiles.load_task(taskfiles.TaskRef(path.parent.name, path.stem, path), "small")
        ported = port(model_as_candidate(path.read_text()), ctx)
        module = load(ported, tmp_path)
        jobs.append({"path": module.__file__, "kernels": launch_signatures(module, task)})
    assert all(job["kernels"] for job in jobs)
    assert compile_to_ttir(jobs, tmp_path) == []


# ------------------------------------------------------------------ (a) libdevice

LIBDEVICE = '''
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice


@triton.jit
def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = libdevice.tanh(x) + tl.extra.cuda.libdevice.exp(x)  # both spellings
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _k[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
        return y
'''


def test_libdevice_moves_to_the_ascend_module_with_a_fallback(tmp_path):
    out = pass_libdevice(LIBDEVICE, ASCEND)
    assert "extra.cuda" not in out
    assert "    from triton.language.extra.ascend import libdevice  # triton-ascend 3.2\n" in out
    assert "from triton.language.extra.cann import libdevice" in out
    assert "        from triton.language.extra import libdevice  # community Triton\n" in out
    assert "y = libdevice.tanh(x) + libdevice.exp(x)  # both spellings" in out
    assert not [f for f in lint(out) if f.rule == "libdevice-cuda"]
    # community Triton has no ascend module: the fallback imports. The CPU interpreter does not
    # implement libdevice calls, so the kernel is checked by the compiler frontend instead.
    module = load(out, tmp_path)
    jobs = [{"path": module.__file__, "kernels": [{"kernel": "_k", "constexprs": {"BLOCK": 64}, "signature": {
        "x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}}]}]
    assert compile_to_ttir(jobs, tmp_path) == []


def test_libdevice_module_and_function_imports():
    src = "import triton.language.extra.cuda.libdevice as ld\nfrom triton.language.extra.cuda.libdevice import tanh, pow\n"
    out = pass_libdevice(src, ASCEND)
    assert "from triton.language.extra.ascend import libdevice as ld  # triton-ascend 3.2" in out
    assert "from triton.language.extra.ascend.libdevice import tanh, pow  # triton-ascend 3.2" in out
    assert "from triton.language.extra.libdevice import tanh, pow  # community Triton" in out
    compile(out, "x", "exec")


# ------------------------------------------------------------------ (b) num_warps / num_stages

LAUNCH_OPTIONS = '''
import torch
import triton
import triton.language as tl

CONFIGS = [triton.Config({"BLOCK": 64}, num_warps=4, num_stages=2), triton.Config({"BLOCK": 128})]


@triton.jit
def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        num_warps = 8  # only the launch reads it
        BLOCK = 64  # a comment that must survive
        _k[(triton.cdiv(x.numel(), BLOCK),)](
            x, y, x.numel(),
            BLOCK=BLOCK,
            num_warps=num_warps,
            num_stages=3,
        )
        return y
'''


def test_launch_options_are_stripped_with_their_dead_locals(tmp_path):
    out = pass_launch_options(LAUNCH_OPTIONS, ASCEND)
    assert "num_warps" not in out and "num_stages" not in out
    assert 'triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})' in out
    assert "        BLOCK = 64  # a comment that must survive\n" in out
    assert "            BLOCK=BLOCK,\n        )" in out
    x = torch.randn(300)
    assert torch.equal(load(out, tmp_path).ModelNew()(x), x * 2)


# ------------------------------------------------------------------ (c) devices

DEVICES = '''
import torch
import triton
import triton.language as tl

DEVICE = triton.runtime.driver.active.get_active_torch_device()


@triton.jit
def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


def _sync():
    torch.cuda.synchronize()


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty(x.shape, device="cuda")
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        _k[(min(triton.cdiv(x.numel(), 64), sms),)](x, y, x.numel(), BLOCK=64)
        return y.cuda() + torch.zeros(1, device="cuda:0")
'''


def test_devices_come_from_inputs_and_torch_npu_is_optional(tmp_path):
    out = pass_device(DEVICES, ASCEND)
    assert "try:\n    import torch_npu" in out and "except ImportError:\n    torch_npu = None\n" in out
    assert 'y = torch.empty(x.shape, device=x.device)' in out
    assert "sms = NUM_VECTORCORE" in out and "NUM_VECTORCORE = 40" in out
    assert "DEVICE_API.synchronize()" in out and "return y.to(DEVICE) + torch.zeros(1, device=torch.device(str(DEVICE).split(\":\")[0], 0))" in out
    assert "DEVICE = torch.device((\"npu\" if torch_npu is not None" in out
    cuda_rules = {"cuda-device", "torch-cuda", "device-props", "torch-npu-import"}
    assert [f for f in lint(out) if f.rule in cuda_rules] == []  # the guarded fallbacks are not findings
    assert [f.rule for f in lint(DEVICES) if f.rule in cuda_rules]
    x = torch.randn(100)  # on the CPU, DEVICE is "cpu" and the program count is NUM_VECTORCORE
    assert torch.equal(load(out, tmp_path).ModelNew()(x), x + 1)


# ------------------------------------------------------------------ (f) tl.dot, (g) fp64

DOT = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _k(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    idx = r[:, None] * N + r[None, :]
    a = tl.load(a_ptr + idx)
    b = tl.load(b_ptr + idx)
    c = tl.dot(a, b, out_dtype=tl.bfloat16)
    tl.store(c_ptr + idx, c)
    af = a.to(tl.float32)
    tl.store(d_ptr + idx, tl.dot(af, af, input_precision="tf32"))
    tl.store(e_ptr + idx, tl.dot(af, af, allow_tf32=True))


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        n = a.shape[0]
        c = torch.empty(n, n, dtype=torch.bfloat16)
        d = torch.empty(n, n)
        e = torch.empty(n, n)
        _k[(1,)](a, b, c, d, e, N=n)
        return c, d, e
'''


def test_dot_computes_in_float32_with_ieee_precision(tmp_path):
    out = pass_dot(DOT, ASCEND)
    assert "c = tl.dot(a, b, out_dtype=tl.float32).to(tl.bfloat16)" in out
    assert 'tl.dot(af, af, input_precision="ieee")' in out and "tf32" not in out
    assert not [f for f in lint(out) if f.rule.startswith("dot")]
    a, b = torch.randn(16, 16).half(), torch.randn(16, 16).half()
    c, d, e = load(out, tmp_path).ModelNew()(a, b)
    assert torch.allclose(c.float(), a.float() @ b.float(), atol=0.1, rtol=0.02)
    assert torch.allclose(d, a.float() @ a.float(), atol=1e-4) and torch.equal(d, e)


def test_dot_with_an_accumulator_is_accumulated_in_float32():
    src = DOT.replace("tl.dot(a, b, out_dtype=tl.bfloat16)", "tl.dot(a, b, tl.zeros((N, N), dtype=tl.bfloat16), "
                      "out_dtype=tl.bfloat16)")
    out = pass_dot(src, ASCEND)
    assert "tl.dot(a, b, tl.zeros((N, N), dtype=tl.bfloat16).to(tl.float32), out_dtype=tl.float32).to(tl.bfloat16)" in out


FP64 = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float64)
    tl.store(y_ptr + offs, (x * 3.0).to(tl.float32), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _k[(triton.cdiv(x.numel(), 32),)](x, y, x.numel(), BLOCK=32)
        return y
'''


def test_fp64_becomes_fp32_in_kernels(tmp_path):
    out = pass_fp64(FP64, ASCEND)
    assert "tl.float64" not in out and ".to(tl.float32)\n" in out
    x = torch.randn(70)
    assert torch.allclose(load(out, tmp_path).ModelNew()(x), x * 3.0)


# ------------------------------------------------------------------ (h) int64 offsets

INT64 = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask)
    tl.store(y_ptr + tl.program_id(0) * stride_y + cols, x * 2.0, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _k[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
'''


def test_program_id_is_cast_to_int64_before_the_stride(tmp_path):
    out = pass_int64(INT64, ASCEND)
    assert "x_ptr + row.to(tl.int64) * stride_x + cols" in out
    assert "y_ptr + tl.program_id(0).to(tl.int64) * stride_y + cols" in out
    assert not [f for f in lint(out) if f.rule == "int32-offset"]
    assert [f.line for f in lint(INT64) if f.rule == "int32-offset"] == [12, 13]
    x = torch.randn(5, 40)[:, :33]
    assert torch.equal(load(out, tmp_path).ModelNew()(x), x * 2)


# ------------------------------------------------------------------ (e) two-level tiling

ELEMENTWISE = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * tl.sigmoid(x) * y, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        BLOCK = 256
        _k[(triton.cdiv(x.numel(), BLOCK),)](x, y, out, x.numel(), BLOCK=BLOCK)
        return out
'''


def test_elementwise_block_gets_an_inner_block_sub_loop(tmp_path):
    out = pass_tile(ELEMENTWISE, PortContext(block_sub=32))
    assert ("    pid = tl.program_id(0)\n    for sub in range(0, BLOCK, BLOCK_SUB):\n"
            "        offs = pid * BLOCK + (sub + tl.arange(0, BLOCK_SUB))\n") in out
    assert "BLOCK: tl.constexpr, BLOCK_SUB: tl.constexpr):" in out
    assert "BLOCK=BLOCK, BLOCK_SUB=min(BLOCK, 32))" in out
    x, y = torch.randn(1000), torch.randn(1000)
    assert torch.allclose(load(out, tmp_path).ModelNew()(x, y), x * torch.sigmoid(x) * y)


def test_block_sub_is_sized_from_the_unified_buffer():
    assert pass_tile(ELEMENTWISE, ASCEND) == ELEMENTWISE  # 256 lanes fit 96 KB: nothing to do
    out = pass_tile(ELEMENTWISE, PortContext(ub_bytes=2048))
    # offs, mask, x, y: 4 + 1 + 4 + 4 = 13 B per lane -> 2048 // 13 = 157 -> 128
    assert "BLOCK_SUB=min(BLOCK, 128)" in out


ROW_REDUCTION = ELEMENTWISE.replace(
    "    tl.store(out_ptr + offs, x * tl.sigmoid(x) * y, mask=mask)",
    "    tl.store(out_ptr + pid, tl.sum(x * y, axis=0))")
CHUNKED = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty(x.shape[0])
        _k[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=256)
        return out
'''


def test_block_reduced_across_lanes_is_left_alone():
    ctx = PortContext(block_sub=32)
    assert subtile_region(kernel_fn(ROW_REDUCTION), "BLOCK") is None
    assert not cap_allowed(kernel_fn(ROW_REDUCTION), "BLOCK")
    assert pass_tile(ROW_REDUCTION, ctx) == ROW_REDUCTION


def test_chunk_loop_block_is_capped_at_the_launch(tmp_path):
    assert subtile_region(kernel_fn(CHUNKED), "BLOCK") is None  # acc is a [BLOCK] tile outside the loop
    out = pass_tile(CHUNKED, PortContext(block_sub=32))
    assert "BLOCK=min(256, 32))" in out
    x = torch.randn(4, 300)
    assert torch.allclose(load(out, tmp_path).ModelNew()(x), x.sum(1), atol=1e-4)


@pytest.mark.parametrize("change", [
    ("acc = tl.zeros([BLOCK], dtype=tl.float32)", "acc = tl.full([BLOCK], 1.0, dtype=tl.float32)"),  # B x 1.0 added
    ("tl.store(out_ptr + row, tl.sum(acc, axis=0))", "tl.store(out_ptr + row, tl.max(acc, axis=0))"),  # op mismatch
    ("        acc += tl.load(", "        acc = acc * 0.5 + tl.load("),  # chunk order matters
    ("for start in range(0, n_cols, BLOCK):", "for start in range(0, n_cols, 256):"),  # not a BLOCK loop
], ids=["nonzero-start", "other-reduction", "decay", "fixed-step"])
def test_chunk_loops_whose_result_depends_on_the_block_are_not_capped(change):
    src = CHUNKED.replace(*change)
    assert src != CHUNKED and not cap_allowed(kernel_fn(src), "BLOCK")


def test_in_place_update_outside_the_block_axis_is_not_sub_tiled():
    src = ELEMENTWISE.replace("    tl.store(out_ptr + offs, x * tl.sigmoid(x) * y, mask=mask)",
                              "    tl.store(out_ptr + offs, x, mask=mask)\n"
                              "    tl.store(y_ptr, tl.load(y_ptr) + 1.0)")  # would run once per sub-block
    assert subtile_region(kernel_fn(src), "BLOCK") is None


# ------------------------------------------------------------------ (d) persistent grids

PERSISTENT_1D = ELEMENTWISE
PERSISTENT_2D = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, out_ptr, lens_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    if tl.load(lens_ptr + row) == 0:
        return
    mask = cols < n_cols
    tl.store(out_ptr + row * stride + cols, tl.load(x_ptr + row * stride + cols, mask=mask) + 1.0, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x, lens):
        out = torch.zeros_like(x)
        grid = (x.shape[0], triton.cdiv(x.shape[1], 16))
        _k[grid](x, out, lens, x.shape[1], x.stride(0), BLOCK=16)
        return out
'''
PERSISTENT_3D = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _k(out_ptr, B: tl.constexpr, C: tl.constexpr):
    a = tl.program_id(0)
    b = tl.program_id(1)
    c = tl.program_id(2)
    tl.store(out_ptr + (a * B + b) * C + c, a * 100 + b * 10 + c)


class ModelNew(torch.nn.Module):
    def forward(self, out):
        _k[(out.shape[0], out.shape[1], out.shape[2])](out, B=out.shape[1], C=out.shape[2])
        return out
'''


def test_1d_grid_loops_over_tasks_on_the_vector_cores(tmp_path):
    out = pass_persistent(PERSISTENT_1D, PortContext(num_vectorcore=2))
    assert "    for pid in range(tl.program_id(0), num_pid0, tl.num_programs(0)):\n        offs = pid * BLOCK" in out
    assert "pid = tl.program_id(0)" not in out  # the loop variable replaces it
    assert "_k[(min(triton.cdiv(x.numel(), BLOCK), NUM_VECTORCORE),)](x, y, out, x.numel(), BLOCK=BLOCK, " \
           "num_pid0=triton.cdiv(x.numel(), BLOCK))" in out
    assert "NUM_VECTORCORE = 2  #" in out
    assert not [f for f in lint(out) if f.rule == "grid-limit"]
    x, y = torch.randn(2000), torch.randn(2000)  # 8 tasks on 2 programs
    assert torch.allclose(load(out, tmp_path).ModelNew()(x, y), x * torch.sigmoid(x) * y)


def test_2d_grid_is_flattened_and_an_early_return_becomes_a_condition(tmp_path):
    out = pass_persistent(PERSISTENT_2D, PortContext(num_vectorcore=3))
    assert ("    for task in range(tl.program_id(0), num_pid0 * num_pid1, tl.num_programs(0)):\n"
            "        pid0 = task // num_pid1\n        pid1 = task % num_pid1\n"
            "        row = pid0.to(tl.int64)\n") in out
    assert "        if not (tl.load(lens_ptr + row) == 0):\n            mask = cols < n_cols\n" in out
    assert not any(isinstance(n, ast.Return) for n in ast.walk(kernel_fn(out)))
    assert "_k[(min(grid[0] * grid[1], NUM_VECTORCORE),)](" in out and "num_pid0=grid[0], num_pid1=grid[1])" in out
    x, lens = torch.randn(5, 40), torch.tensor([1, 0, 2, 0, 3], dtype=torch.int32)
    want = torch.where(lens[:, None] == 0, torch.zeros_like(x), x + 1)
    assert torch.equal(load(out, tmp_path).ModelNew()(x, lens), want)


def test_3d_grid_recovers_every_program_id(tmp_path):
    out = pass_persistent(PERSISTENT_3D, PortContext(num_vectorcore=4))
    assert "pid0 = task // (num_pid1 * num_pid2)" in out and "pid1 = task // num_pid2 % num_pid1" in out
    got = load(out, tmp_path).ModelNew()(torch.zeros(3, 4, 5, dtype=torch.int32))
    a, b, c = torch.meshgrid(torch.arange(3), torch.arange(4), torch.arange(5), indexing="ij")
    assert torch.equal(got, (a * 100 + b * 10 + c).int())


def test_dot_kernels_loop_on_the_ai_cores():
    src = DOT.replace("r = tl.arange(0, N)", "r = tl.arange(0, N) + tl.program_id(0) * 0")
    out = pass_persistent(src, ASCEND)
    assert "_k[(min(1, NUM_AICORE),)]" in out and "NUM_AICORE = 20" in out


@pytest.mark.parametrize("change", [
    ("_k[(triton.cdiv(x.numel(), BLOCK),)]", "_k[lambda meta: (triton.cdiv(x.numel(), meta['BLOCK']),)]"),
    ("    pid = tl.program_id(0)\n", "    pid = tl.program_id(0)\n    n = n + 0 * tl.num_programs(0)\n"),
    ("    tl.store(out_ptr + offs, x * tl.sigmoid(x) * y, mask=mask)",
     "    for i in range(2):\n        if i == 1:\n            return\n        tl.store(out_ptr + offs, x, mask=mask)"),
], ids=["grid-function", "already-persistent", "return-in-loop"])
def test_grids_it_cannot_rewrite_are_left_for_lint(change):
    src = ELEMENTWISE.replace(*change)
    assert src != ELEMENTWISE
    assert pass_persistent(src, ASCEND) == src


def test_program_id_read_in_a_helper_blocks_the_rewrite():
    src = ELEMENTWISE.replace("@triton.jit\ndef _k(", "@triton.jit\ndef _pid():\n    return tl.program_id(0)\n\n\n"
                              "@triton.jit\ndef _k(").replace("pid = tl.program_id(0)", "pid = _pid()")
    assert pass_persistent(src, ASCEND) == src
    assert [f.rule for f in lint(src) if f.rule == "grid-limit"] == ["grid-limit"]


# ------------------------------------------------------------------ port() and the generator


def test_a_failing_pass_is_skipped_not_fatal(monkeypatch):
    def broken(source, ctx):
        raise RuntimeError("bug")

    monkeypatch.setattr(port_pipeline, "PASSES", [("broken", broken), ("launch_options", pass_launch_options)])
    out = port(LAUNCH_OPTIONS)
    assert "num_warps" not in out and out == pass_launch_options(LAUNCH_OPTIONS, ASCEND)


def test_unrelated_source_comes_back_unchanged():
    src = "import torch\n\n\ndef f(x):\n    return x + 1\n"
    assert port(src, ASCEND, passes=["libdevice", "launch_options", "dot", "fp64", "int64", "tile",
                                     "persistent"]) == src


def _context(target: str, device: dict | None = None, seed: int = 0) -> Context:
    path = REPO / "tasks/sglang/fused_softcap_kernel.py"
    return Context(task_code=path.read_text(), op=path.stem, source="sglang", target=target,
                   device=device or {}, rng=random.Random(seed))


def test_seed_is_the_fully_ported_model_for_every_target():
    gen = load_generator("port")
    [ascend] = gen.initial_candidates(_context("ascend", {"num_aicore": 24, "num_vectorcore": 48}))
    assert ascend.generator == "port" and "NUM_VECTORCORE = 48" in ascend.source
    assert static_verdict(ascend.source) == ("", "") and errors(lint(ascend.source)) == []
    [cuda] = gen.initial_candidates(_context("cuda", {"sm_count": 132}))
    assert "NUM_VECTORCORE = 132" in cuda.source and "4 * NUM_VECTORCORE" in cuda.source
    [cpu] = gen.initial_candidates(_context("cpu"))
    assert cpu.source == port(model_as_candidate(_context("cpu").task_code), PortContext())


def test_propose_gives_distinct_variants_that_keep_meaning(tmp_path):
    gen = load_generator("port")
    ctx = _context("ascend")
    [seed] = gen.initial_candidates(ctx)
    parent = Candidate(id="p", source=seed.source, generator="port", verdict="pass")
    proposals = gen.propose(parent, [], ctx, n=4)
    assert 1 <= len(proposals) <= 4 and len({p.source for p in proposals}) == len(proposals)
    assert all(p.source != parent.source and p.note for p in proposals)
    again = gen.propose(parent, [], _context("ascend"), n=4)
    assert [p.source for p in again] == [p.source for p in proposals]  # ctx.rng decides
    path = REPO / "tasks/sglang/fused_softcap_kernel.py"
    for p in proposals:
        assert static_verdict(p.source) == ("", "")
        assert task_check(path, p.source, tmp_path) == [], p.note


def test_propose_ports_an_unported_parent():
    ctx = _context("ascend")
    parent = Candidate(id="m", source=model_as_candidate(ctx.task_code), generator="tune", verdict="pass")
    notes = {p.note for p in load_generator("port").propose(parent, [], ctx, n=8)}
    assert "all port passes" in notes


def test_generator_takes_no_options():
    with pytest.raises(FarmError, match="unknown option"):
        load_generator("port", block=3)


RECAST_STRIDE = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    stride = tl.cast(stride, dtype=tl.int64)
    first = tl.load(x_ptr)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    tl.store(out_ptr + row * stride + cols, tl.load(x_ptr + row * stride + cols, mask=mask) + first, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _k[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=64)
        return out
'''


def test_a_parameter_recast_stays_before_the_task_loop(tmp_path):
    """Inside the loop `stride` would be loop-carried with a new type: a compile error for every
    Triton frontend (found by the triton-ascend frontend check on AKG's moe_sum_reduce_triton).
    A load stays per task: another task may write what it reads."""
    out = pass_persistent(RECAST_STRIDE, PortContext(num_vectorcore=2))
    assert ("    stride = tl.cast(stride, dtype=tl.int64)\n"
            "    for row in range(tl.program_id(0), num_pid0, tl.num_programs(0)):\n"
            "        first = tl.load(x_ptr)\n") in out
    x = torch.randn(5, 40)
    assert torch.allclose(load(out, tmp_path).ModelNew()(x), x + x[0, 0])
