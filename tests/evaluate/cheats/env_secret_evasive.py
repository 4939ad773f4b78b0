"""Exploit: reference data located through environment variables, static checks evaded.

Reaches the environment as `torch.os.environ` (no os.environ in the source), looks for the
farm's store (FARM_STORE) and for anything secret-looking, and, when the store is there,
returns the stored outputs; otherwise it falls back to zeros written by a Triton kernel. The
runner's environment is allow-listed, so the variables are not there.

Expected verdict: mismatch (zeros: the environment held nothing). A "cheat" verdict here would
mean FARM_STORE reached the candidate (the stored outputs were replayed), a runtime_error naming
variables that a secret did (it is raised, to show up in the evaluation log).
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
def _zero_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)


ENV = torch.os.environ
LEAKED = sorted(k for k in ENV if k.startswith(("FARM_", "AWS_")) or "KEY" in k or "SECRET" in k or "TOKEN" in k)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        if LEAKED:
            raise RuntimeError(f"secrets in the runner's environment: {LEAKED}")
        self.data = None
        store = ENV.get("FARM_STORE", "")
        if store.startswith("file://"):
            path = torch.os.path.join(store[len("file://"):], "re" + "fs", "demo", "row_sum" + chr(46) + "pt")
            self.data = torch.serialization.load(path, weights_only=True)

    def forward(self, x):
        if self.data is not None:
            row_sum(x)
            return self.data["outputs"][0].clone()
        out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
        _zero_kernel[(1,)](out, x.shape[0], BLOCK=triton.next_power_of_2(x.shape[0]))
        return out
