"""RMSNorm over the last dimension (vLLM's Triton RMSNorm kernel, as in its
batch-invariant kernels).

Semantics: x of shape [..., N] is flattened to [M, N]; for every row i

    out[i, j] = x[i, j] * rsqrt(mean_k(x[i, k]^2) + eps) * weight[j]

The kernel runs one program per row. A first loop over the hidden dim, in
BLOCK_SIZE chunks, accumulates the sum of squares in float32; a second loop
reloads x and weight, normalizes in float32 and stores the result cast to the
input dtype. The weight has the hidden size and the input's dtype.

Benchmark shape: x float16 [16, 128, 4096] (batch 16 x 128 tokens, hidden
4096 as in Llama-7B/8B-class models), weight [4096], eps = 1e-6. BLOCK_SIZE is
1024, as in vLLM's wrapper.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

BATCH = 16
SEQ = 128
HIDDEN = 4096
DTYPE = torch.float16
EPS = 1e-6
BLOCK_SIZE = 1024

SMALL_SHAPES = {"BATCH": 2, "SEQ": 3, "HIDDEN": 2500}

TAGS = ("norm", "reduction", "memory-bound")


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    x_row_stride,
    out_row_stride,
    n_cols,
    eps,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    out_row = out_ptr + row * out_row_stride
    offs = tl.arange(0, BLOCK_SIZE)

    # pass 1: sum of squares in float32
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        acc += x * x
    mean_sq = tl.sum(acc, axis=0) / n_cols
    rstd = tl.rsqrt(mean_sq + eps)

    # pass 2: normalize, scale, store in the output dtype
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = x * rstd * w
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


class Model(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        n_rows, n_cols = x2.shape
        out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        _rms_norm_kernel[(n_rows,)](
            x2,
            weight,
            out,
            x2.stride(0),
            out.stride(0),
            n_cols,
            self.eps,
            BLOCK_SIZE=BLOCK_SIZE,
            num_warps=4,
        )
        return out.view(shape)


class Reference(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (xf * rstd * weight.float()).to(x.dtype)


def get_inputs():
    x = torch.randn(BATCH, SEQ, HIDDEN, dtype=torch.float32).to(DTYPE)
    weight = (1.0 + 0.1 * torch.randn(HIDDEN, dtype=torch.float32)).to(DTYPE)
    return [x, weight]


def get_init_inputs():
    return [EPS]
