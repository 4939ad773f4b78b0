"""Demo: SwiGLU with separate gate and up tensors.

    out[i, j] = silu(gate[i, j]) * up[i, j],   silu(a) = a * sigmoid(a)

gate, up fp16 [M, N] (last dim contiguous, row strides passed explicitly); computed in
float32 and cast back to fp16 on store. A deliberately simple, untuned Triton kernel: a
2-D grid of (row, 256-column block) programs, default num_warps; a search can tune BLOCK,
num_warps or fuse rows per program.

Benchmark: [2048, 1408] fp16 (1408 = a Qwen/DeepSeek-style MoE intermediate size).
Small (interpreter): [5, 130] (130 is not a multiple of BLOCK, so masks are exercised).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl

M = 2048
N = 1408
DTYPE = torch.float16

SMALL_SHAPES = {"M": 5, "N": 130}

TAGS = ("elementwise", "activation", "memory-bound")


@triton.jit
def _swiglu_kernel(gate_ptr, up_ptr, out_ptr, n_cols,
                   stride_gm, stride_um, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(gate_ptr + row * stride_gm + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * stride_um + cols, mask=mask, other=0.0).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(out_ptr + row * stride_om + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if gate.stride(-1) != 1:
            gate = gate.contiguous()
        if up.stride(-1) != 1:
            up = up.contiguous()
        m, n = gate.shape
        out = torch.empty((m, n), dtype=gate.dtype, device=gate.device)
        BLOCK = 256
        grid = (m, triton.cdiv(n, BLOCK))
        _swiglu_kernel[grid](gate, up, out, n, gate.stride(0), up.stride(0), out.stride(0),
                             BLOCK=BLOCK)
        return out


class Reference(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return (F.silu(gate.float()) * up.float()).to(gate.dtype)


def get_inputs():
    gate = torch.randn(M, N).to(DTYPE)
    up = torch.randn(M, N).to(DTYPE)
    return [gate, up]


def get_init_inputs():
    return []
