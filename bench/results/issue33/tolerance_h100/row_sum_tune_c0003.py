"""Demo: row sum.

    out[i] = sum_j x[i, j]

x float32 [M, K] (any row stride; last dim contiguous), output float32 [M]. A deliberately
simple, untuned Triton kernel: one program per row, a loop over the row in fixed chunks
of 128 columns, accumulating in float32 and reducing with tl.sum at the end; a search can
tune BLOCK, num_warps or the grid (e.g. several rows per program).

Benchmark: [4096, 1024] fp32. Small (interpreter): [7, 300] (300 is not a multiple of
BLOCK, so the tail mask is exercised).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

M = 4096
K = 1024
DTYPE = torch.float32

SMALL_SHAPES = {"M": 7, "K": 300}

TAGS = ("reduction", "memory-bound")


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, n_cols, stride_xm, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = x_ptr + row.to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        acc += tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + row, total.to(out_ptr.dtype.element_ty))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.stride(-1) != 1:
            x = x.contiguous()
        m, k = x.shape
        out = torch.empty(m, dtype=x.dtype, device=x.device)
        BLOCK = 4096
        _row_sum_kernel[(m,)](x, out, k, x.stride(0), BLOCK=BLOCK, num_warps=32)
        return out


class Reference(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().sum(dim=-1).to(x.dtype)


def get_inputs():
    x = torch.randn(M, K).to(DTYPE)
    return [x]


def get_init_inputs():
    return []
