"""farm lint: each rule on crafted sources, at the right line; the ported corpus has no errors; the CLI."""

import json
import re
import textwrap
from pathlib import Path

import pytest

from farm.ascend.lint import GRID_LIMIT, errors, lint
from farm.ascend.port import PortContext, port
from farm.errors import FarmError
from farm.generators.base import model_as_candidate

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted(p for s in ("sglang", "vllm_triton", "demo") for p in (REPO / "tasks" / s).glob("*.py"))

# every line that must be reported says so: `# expect: rule[/severity], ...`
BAD = '''
import torch  # expect: torch-npu-import/info
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice  # expect: libdevice-cuda

DEVICE = triton.runtime.driver.active.get_active_torch_device()  # expect: cuda-device
BIG = 8192


@triton.jit
def _k(x_ptr, y_ptr, idx_ptr, n, stride, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + pid * stride + offs).to(tl.float64)  # expect: fp64, int32-offset/warning
    y = tl.extra.cuda.libdevice.tanh(x)  # expect: libdevice-cuda
    z = tl.dot(x, y, out_dtype=tl.bfloat16, input_precision="tf32")  # expect: dot-out-dtype, dot-precision
    w = tl.dot(x, y, allow_tf32=True)  # expect: dot-precision
    v = x.to(tl.float8e4nv)  # expect: fp8
    s = tl.sort(x)  # expect: sort
    t = tl.permute(z, (2, 1, 0))  # expect: permute
    u = tl.trans(z, 1, 0)
    a = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)  # expect: inline-asm
    for i in range(4):
        tl.atomic_xchg(idx_ptr + i, 1)  # expect: atomic-in-loop
    tl.atomic_add(idx_ptr, pid.to(tl.int64))  # expect: atomic-dtype/warning
    tl.atomic_max(idx_ptr, 1, sem="relaxed")  # expect: atomic-sem/info
    tl.device_print("x", x)  # expect: device-print/info
    tl.store(y_ptr + offs, y)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty(x.shape, device="cuda")  # expect: cuda-device
        sms = torch.cuda.get_device_properties(0).multi_processor_count  # expect: torch-cuda, device-props
        torch.cuda.synchronize()  # expect: torch-cuda
        on_gpu = x.device.type == "cuda"  # expect: cuda-device/warning
        _k[(70000,)](x, y, y, x.numel(), x.stride(0), BLOCK=BIG, num_warps=8)  # expect: grid-limit, ub-overflow, launch-options/warning
        _k[(x.shape[0], 4)](x, y, y, x.numel(), x.stride(0), BLOCK=256, num_stages=2)  # expect: grid-limit/warning, launch-options/warning
        _k[lambda meta: (1,)](x, y, y, x.numel(), x.stride(0), BLOCK=256)  # expect: grid-limit/warning
        assert x.is_cuda, "CUDA only"  # expect: cuda-device
        if x.is_cuda:  # expect: cuda-device/warning
            return y.cuda()  # expect: cuda-device
        return y
'''


def expected(source: str) -> set[tuple[int, str, str]]:
    found = set()
    for line, text in enumerate(source.splitlines(), 1):
        match = re.search(r"# expect: (.*)$", text)
        for item in (match.group(1).split(", ") if match else []):
            rule, _, severity = item.partition("/")
            found.add((line, rule, severity or "error"))
    return found


def test_every_rule_is_found_at_its_line_with_its_severity():
    got = {(f.line, f.rule, f.severity) for f in lint(BAD)}
    assert got == expected(BAD)


def test_unified_buffer_estimate_uses_launch_constexprs_and_dtypes():
    [ub] = [f for f in lint(BAD) if f.rule == "ub-overflow"]
    # x and y are fp64 (8 B) [8192] tiles, offs int32, v fp8 (unknown: 4 B): 64 + 64 + 32 + 32 KB
    assert "about 192 KB of live tiles (x 64 KB, y 64 KB" in ub.message and "> 96 KB" in ub.message


ROW = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _row(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, tl.sum(x * x, axis=0))


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty(x.shape[0], device=x.device)
        _row[(min(x.shape[0], 40),)](x, out, x.shape[1], BLOCK=BLOCK_VALUE)
        return out
'''


@pytest.mark.parametrize("value, severity, text", [
    ("1024", None, None),  # cols (int32) 4 KB + x (fp32) 4 KB: fits
    ("32768", "error", "about 256 KB of live tiles (cols 128 KB, x 128 KB)"),
    ("triton.next_power_of_2(x.shape[1])", "warning", "8 B live per unit of BLOCK, so BLOCK > 12288 overflows"),
    ("min(triton.next_power_of_2(x.shape[1]), 2048)", None, None),  # bounded by min()
])
def test_unified_buffer_severity_follows_what_is_known(value, severity, text):
    found = [f for f in lint(ROW.replace("BLOCK_VALUE", value)) if f.rule == "ub-overflow"]
    assert [f.severity for f in found] == ([severity] if severity else [])
    assert all(f.line == 18 and text in f.message for f in found)


def test_autotune_configs_give_the_largest_block():
    src = ROW.replace("@triton.jit", "@triton.autotune(configs=[triton.Config({'BLOCK': 1024}), "
                      "triton.Config({'BLOCK': 32768})], key=['n'])\n@triton.jit").replace(", BLOCK=BLOCK_VALUE", "")
    [ub] = [f for f in lint(src) if f.rule == "ub-overflow"]
    assert ub.severity == "error" and "about 256 KB" in ub.message


def test_grids_bounded_by_constants_are_fine():
    src = ROW.replace("BLOCK_VALUE", "1024")
    assert not [f for f in lint(src) if f.rule == "grid-limit"]
    src = src.replace("(min(x.shape[0], 40),)", f"({GRID_LIMIT + 1},)")
    assert [(f.line, f.severity) for f in lint(src) if f.rule == "grid-limit"] == [(18, "error")]


@pytest.mark.parametrize("dims, bad", [("(1, 0)", False), ("(0, 2, 1)", False), ("(2, 1, 0)", True),
                                       ("(1, 2, 0)", True), ("(0, 1, 2)", False)])
def test_permute_of_non_adjacent_axes(dims, bad):
    src = f"import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef _k(x):\n    y = tl.permute(x, {dims})\n"
    assert [f.line for f in lint(src) if f.rule == "permute"] == ([7] if bad else [])


def test_cast_index_and_constexpr_products_are_not_int32_offsets():
    src = textwrap.dedent('''
        import triton
        import triton.language as tl


        @triton.jit
        def _k(x_ptr, stride, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            a = tl.load(x_ptr + pid.to(tl.int64) * stride)
            b = tl.load(x_ptr + pid * BLOCK)
            row = tl.program_id(0).to(tl.int64)
            c = tl.load(x_ptr + row * stride)
            d = tl.load(x_ptr + pid * stride)
    ''')
    assert [f.line for f in lint(src) if f.rule == "int32-offset"] == [13]


def test_atomics_outside_loops_and_adds_inside_are_allowed():
    src = textwrap.dedent('''
        import triton
        import triton.language as tl


        @triton.jit
        def _k(p):
            tl.atomic_or(p, 1)
            for i in range(3):
                tl.atomic_add(p + i, 1)
    ''')
    assert not [f for f in lint(src) if f.rule.startswith("atomic")]


def test_cuda_target_flags_ascend_only_extras():
    src = textwrap.dedent('''
        import triton
        import triton.language as tl
        from triton.language.extra.ascend import libdevice
        try:
            from triton.language.extra.ascend import libdevice
        except ImportError:
            from triton.language.extra import libdevice


        @triton.jit
        def _k(p, BLOCK: tl.constexpr):
            x = tl.load(p + tl.arange(0, BLOCK), care_padding=False)
            tl.compile_hint(x, "hint")
    ''')
    assert [(f.line, f.rule) for f in lint(src, "cuda")] == [(4, "ascend-only"), (13, "ascend-only"), (14, "ascend-only")]
    assert not [f for f in lint(src, "ascend") if f.rule == "ascend-only"]


def test_syntax_errors_and_unknown_targets():
    assert [(f.line, f.rule) for f in lint("x = (\n")] == [(1, "syntax")]
    with pytest.raises(FarmError, match="unknown lint target 'tpu'"):
        lint("x = 1\n", "tpu")


# ------------------------------------------------------------------ after porting


@pytest.mark.parametrize("path", CORPUS, ids=[f"{p.parent.name}/{p.stem}" for p in CORPUS])
def test_ported_corpus_has_no_errors(path):
    before = lint(model_as_candidate(path.read_text()))
    after = lint(port(model_as_candidate(path.read_text()), PortContext(num_vectorcore=40, num_aicore=20)))
    assert errors(after) == []
    # what is left is a UB warning for tiles sized from the input that cannot be sub-tiled (whole-row
    # reductions, or a second data-dependent dim); everything else the passes fix
    assert {f.rule for f in after if f.severity == "warning"} <= {"ub-overflow"}
    assert {f.rule for f in before} >= {"grid-limit", "torch-npu-import"}


def test_ported_bad_source_keeps_only_what_no_pass_can_fix():
    after = {(f.rule, f.severity) for f in lint(port(BAD))}
    fixed = {"libdevice-cuda", "torch-cuda", "device-props", "dot-out-dtype", "dot-precision", "fp64",
             "int32-offset", "launch-options", "torch-npu-import"}
    assert not {rule for rule, _ in after} & fixed
    assert ("cuda-device", "warning") in after  # x.is_cuda is reported, not rewritten
    assert {rule for rule, sev in after if sev == "error"} == {  # cuda-device: `assert x.is_cuda`
        "fp8", "sort", "permute", "inline-asm", "atomic-in-loop", "grid-limit", "ub-overflow", "cuda-device"}


# ------------------------------------------------------------------ farm lint


def test_cli_table_and_exit_1_on_errors(cli, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(BAD)
    result = cli("lint", "--target", "ascend", bad)
    assert result.exit_code == 1
    assert "bad.py" in result.stdout and "libdevice-cuda" in result.stdout and "error(s)" in result.stderr


def test_cli_json_and_exit_0_with_warnings_only(cli, tmp_path):
    ok = tmp_path / "row.py"
    ok.write_text(ROW.replace("BLOCK_VALUE", "triton.next_power_of_2(x.shape[1])"))
    result = cli("lint", ok, ok, "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["target"] == "ascend" and data["files"] == [str(ok), str(ok)]
    assert {(f["file"], f["line"], f["rule"], f["severity"]) for f in data["findings"]} == {
        (str(ok), 18, "ub-overflow", "warning"), (str(ok), 2, "torch-npu-import", "info")}


def test_cli_missing_file_and_unknown_target_are_usage_errors(cli, tmp_path):
    result = cli("lint", tmp_path / "nope.py")
    assert result.exit_code == 2 and "nope.py: no such file" in result.stderr and "Traceback" not in result.output
    result = cli("lint", "--target", "tpu", tmp_path / "nope.py")
    assert result.exit_code == 2 and "unknown lint target 'tpu'" in result.stderr
