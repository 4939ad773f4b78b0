"""RMSNorm, one Triton program per row (SGLang fused_rmsnorm).

Semantics, for every row x of length N (the hidden size):

    rms = sqrt( (1/N) * sum_i x_i^2 + eps )
    out_i = (x_i / rms) * w_i

Accumulation and the normalisation are in float32; the result is cast once to x's dtype.

Kernel layout (as in the original): grid (num_rows,), program r loads the whole row with a
single BLOCK_SIZE = next_power_of_2(N) block (masked), reduces the sum of squares in
float32, scales by rsqrt(mean + eps) and the weight, and stores the row. num_warps grows
with the block size (BLOCK_SIZE // 256, clamped to [1, 8]), the usual GPU choice for a
row-per-program reduction. Row strides are passed explicitly; the last dim is contiguous.

Benchmark shapes: x float16 [32, 4096] (32 decode tokens of a Llama-7B/8B-width hidden
state), w float16 [4096]; eps = 1e-6 from get_init_inputs().
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

T = 32
HIDDEN = 4096
DTYPE = torch.float16
EPS = 1e-6

SMALL_SHAPES = {"T": 5, "HIDDEN": 97}
TAGS = ("norm", "reduction", "memory-bound")


@triton.jit
def fused_rmsnorm_kernel(
    out_ptr, x_ptr, w_ptr,
    stride_x_row, stride_out_row,
    n_cols, eps,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    rrms = tl.rsqrt(var + eps)
    y = x * rrms * w
    tl.store(out_ptr + row * stride_out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


class Model(nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def forward(self, x, w):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        n_rows, n_cols = x2.shape
        out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        block = triton.next_power_of_2(n_cols)
        num_warps = min(max(block // 256, 1), 8)
        fused_rmsnorm_kernel[(n_rows,)](
            out, x2, w,
            x2.stride(0), out.stride(0),
            n_cols, self.eps,
            BLOCK_SIZE=block, num_warps=num_warps,
        )
        return out.view(shape)


class Reference(nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def forward(self, x, w):
        xf = x.float()
        var = xf.pow(2).mean(dim=-1, keepdim=True)
        y = xf * torch.rsqrt(var + self.eps) * w.float()
        return y.to(x.dtype)


def get_inputs():
    x = torch.randn(T, HIDDEN, dtype=torch.float32).to(DTYPE)
    w = (1.0 + 0.1 * torch.randn(HIDDEN, dtype=torch.float32)).to(DTYPE)
    return [x, w]


def get_init_inputs():
    return [EPS]
