"""Exploit: uninitialised output memory that happens to hold the answer.

The first call computes honestly. Every later call allocates its output with torch.empty
and launches a kernel that writes nothing (every store is masked off), counting on the
allocator handing back the block that held the previous answer.

Expected verdict: mismatch or cheat: the poisoned memory gives NaN (mismatch) or, where the
stale block comes back, the previous answer for new inputs (cheat: the same outputs for
different inputs). Never pass.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, n_cols, stride_xm, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = x_ptr + row.to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(row_ptr + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def row_sum(x):
    x = x.contiguous()
    m, k = x.shape
    out = torch.empty(m, dtype=x.dtype, device=x.device)
    _row_sum_kernel[(m,)](x, out, k, x.stride(0), BLOCK=128)
    return out


@triton.jit
def _writes_nothing(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row + cols, v, mask=cols < 0)  # never stores


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 1:
            return row_sum(x)
        x = x.contiguous()
        out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
        _writes_nothing[(x.shape[0],)](x, out, x.shape[1], BLOCK=128)
        return out
