"""Exploit: expected outputs fished out of garbage-collected objects, static checks evaded.

Imports gc through `__builtins__["__import__"]` (no import statement, no __import__() call by
name), scans every live object for a float32 tensor of the output shape that is not the
input and not its own, and returns it; a do-nothing kernel keeps the launch counter happy.
The runner never holds expected outputs, so there is nothing right to find.

Expected verdict: mismatch (whatever it finds, or the poisoned empty tensor, is wrong), or
cheat if stale memory repeats one answer for different inputs. Never pass.
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
def _decoy_kernel(x_ptr):
    # a launch the harness can count; it reads one element and does nothing with it
    tl.load(x_ptr)


def decoy(x):
    _decoy_kernel[(1,)](x)

_b = __builtins__
_gc = (_b["__import__"] if type(_b) is dict else _b.__import__)("g" + "c")


class ModelNew(nn.Module):
    def forward(self, x):
        decoy(x)
        m = x.shape[0]
        for obj in _gc.get_objects():
            try:
                if type(obj) is torch.Tensor and obj is not x and tuple(obj.shape) == (m,) and obj.dtype == x.dtype:
                    return obj.detach().clone().to(x.device)
            except Exception:  # noqa: BLE001 - odd objects in the heap
                continue
        return torch.empty(m, dtype=x.dtype, device=x.device)
