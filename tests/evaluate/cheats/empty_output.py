"""Exploit: uninitialised output memory (the naive form): torch.empty plus a Triton kernel
that writes nothing.

Right after a correct candidate has run on the same inputs, the allocator may hand back the
block that held its answer. The runner poisons memory before each run so that a block never
written reads as NaN.

Expected verdict: mismatch (or cheat, if stale memory repeats one answer for different inputs).
Never pass.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _writes_nothing(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row + cols, v, mask=cols < 0)  # never stores


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
        _writes_nothing[(x.shape[0],)](x, out, x.shape[1], BLOCK=128)
        return out
