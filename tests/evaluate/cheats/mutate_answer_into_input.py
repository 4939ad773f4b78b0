"""Exploit: input mutation. The kernel writes its answer into the input and returns a view.

The row sums are stored in column 0 of x, in place, and the output is that column: no
output allocation, and x is left changed.

Expected verdict: cheat (forward modified input 0).
"""
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _row_sum_into_input(x_ptr, n_cols, stride_xm, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = x_ptr + row.to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(row_ptr + cols, mask=cols < n_cols, other=0.0)
    tl.store(row_ptr, tl.sum(acc, axis=0))


class ModelNew(nn.Module):
    def forward(self, x):
        m, k = x.shape
        _row_sum_into_input[(m,)](x, k, x.stride(0), BLOCK=128)
        return x[:, 0].contiguous()

