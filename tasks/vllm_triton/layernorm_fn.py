"""LayerNorm forward with weight and bias and an optional residual add first
(the Triton layer_norm_fn forward used by vLLM's Mamba / linear-attention
layers, in the FlashAttention / mamba_ssm one-pass style).

Inputs: x, residual [M, N] (same dtype), weight, bias [N]. Constructor:
eps and residual_in_fp32. Per row, in float32:

    s            = x + residual                    (s = x if residual is None)
    residual_out = s, stored in float32 if residual_in_fp32 else in x's dtype
    mean         = sum_j s_j / N
    var          = sum_j (s_j - mean)^2 / N        (biased)
    out          = (s - mean) * rsqrt(var + eps) * weight + bias, stored in x's dtype

The normalization uses the float32 sum, not the rounded residual_out. Returns
(out, residual_out). The kernel runs one program per row with the whole row in
one power-of-two BLOCK_N (the original supports rows up to 64 KB), num_warps
= min(max(BLOCK_N // 256, 1), 8).

Benchmark shape: x, residual bfloat16 [4096, 2048] (4096 tokens, hidden 2048,
as in Mamba-1.4B / Mamba2-1.3B-class models), eps = 1e-5,
residual_in_fp32 = True (as Mamba blocks run it).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

NUM_TOKENS = 4096
HIDDEN = 2048
DTYPE = torch.bfloat16
EPS = 1e-5
RESIDUAL_IN_FP32 = True

SMALL_SHAPES = {"NUM_TOKENS": 5, "HIDDEN": 300}

TAGS = ("norm", "reduction", "memory-bound")


@triton.jit
def _layer_norm_fwd_1pass_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    res_out_ptr,
    x_row_stride,
    res_row_stride,
    out_row_stride,
    res_out_row_stride,
    N,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    STORE_RESIDUAL_OUT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N

    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        x += r
    if STORE_RESIDUAL_OUT:
        tl.store(
            res_out_ptr + row * res_out_row_stride + cols,
            x.to(res_out_ptr.dtype.element_ty),
            mask=mask,
        )

    mean = tl.sum(x, axis=0) / N
    xbar = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xbar * xbar, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)

    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = xbar * rstd * w
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y += b
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


class Model(nn.Module):
    def __init__(self, eps: float, residual_in_fp32: bool):
        super().__init__()
        self.eps = eps
        self.residual_in_fp32 = residual_in_fp32

    def forward(self, x, residual, weight, bias):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        M, N = x2.shape
        has_residual = residual is not None
        if has_residual:
            res2 = residual.reshape(-1, N)
            if res2.stride(-1) != 1:
                res2 = res2.contiguous()
        else:
            res2 = x2  # dummy, never read
        res_dtype = torch.float32 if self.residual_in_fp32 else x.dtype
        store_res = has_residual or res_dtype != x.dtype
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
        res_out = torch.empty((M, N), dtype=res_dtype, device=x.device) if store_res else x2

        MAX_FUSED_SIZE = 65536 // x2.element_size()
        BLOCK_N = min(MAX_FUSED_SIZE, triton.next_power_of_2(N))
        if N > BLOCK_N:
            raise RuntimeError("This layer norm doesn't support feature dim >= 64KB.")
        num_warps = min(max(BLOCK_N // 256, 1), 8)
        _layer_norm_fwd_1pass_kernel[(M,)](
            x2,
            res2,
            weight,
            bias if bias is not None else weight,
            out,
            res_out,
            x2.stride(0),
            res2.stride(0),
            out.stride(0),
            res_out.stride(0),
            N,
            self.eps,
            HAS_RESIDUAL=has_residual,
            STORE_RESIDUAL_OUT=store_res,
            HAS_BIAS=bias is not None,
            BLOCK_N=BLOCK_N,
            num_warps=num_warps,
        )
        return out.view(shape), res_out.view(shape)


class Reference(nn.Module):
    def __init__(self, eps: float, residual_in_fp32: bool):
        super().__init__()
        self.eps = eps
        self.residual_in_fp32 = residual_in_fp32

    def forward(self, x, residual, weight, bias):
        s = x.float()
        if residual is not None:
            s = s + residual.float()
        res_dtype = torch.float32 if self.residual_in_fp32 else x.dtype
        residual_out = s.to(res_dtype)
        mean = s.mean(dim=-1, keepdim=True)
        var = (s - mean).pow(2).mean(dim=-1, keepdim=True)
        y = (s - mean) * torch.rsqrt(var + self.eps) * weight.float()
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype), residual_out


def get_inputs():
    x = torch.randn(NUM_TOKENS, HIDDEN, dtype=torch.float32).to(DTYPE)
    residual = (0.5 + torch.randn(NUM_TOKENS, HIDDEN, dtype=torch.float32)).to(DTYPE)
    weight = (1.0 + 0.1 * torch.randn(HIDDEN, dtype=torch.float32)).to(DTYPE)
    bias = (0.1 * torch.randn(HIDDEN, dtype=torch.float32)).to(DTYPE)
    return [x, residual, weight, bias]


def get_init_inputs():
    return [EPS, RESIDUAL_IN_FP32]
