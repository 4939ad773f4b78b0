"""SGLang `experts_combine_kernel` (behind `experts_combine_triton`, used by Grok's
residual-MoE decoder layer): combine the MoE branch and the dense-MLP branch of a layer.

    out[t, :] = (sum_{k < K} moe_out[t, k, :] + mlp_out[t, :]) / sqrt(2)

moe_out is [T, K, H] (K partial expert outputs per token; K=1 when already combined, given as
[T, H]), mlp_out is [T, H]; out has mlp_out's shape and dtype.  Here the sum is accumulated in
float32 and the result cast to the output dtype.

One program per token row; the whole hidden dim is one block, BLOCK_SIZE =
next_power_of_2(H) (masked), the K partials are loaded as a [K, BLOCK_SIZE] tile (K must be a
power of two, as tl.arange requires) and reduced with tl.sum; num_warps =
clamp(next_power_of_2(cdiv(H, 1024)), 4, 8), as the original's launch config.

Benchmark: Grok-2-like hidden size, bf16 activations: moe_out [T=1024, K=2, H=8192],
mlp_out [1024, 8192].
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

TOKENS = 1024
COMBINE_K = 2
HIDDEN = 8192
DTYPE = torch.bfloat16

SMALL_SHAPES = {"TOKENS": 7, "HIDDEN": 97}
TAGS = ("moe", "elementwise", "reduction", "memory-bound")


@triton.jit
def experts_combine_kernel(
    out_ptr,
    moe_ptr,
    mlp_ptr,
    stride_moe_t,
    stride_moe_k,
    stride_mlp_t,
    stride_out_t,
    hidden_dim,
    COMBINE_K: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < hidden_dim
    offs_k = tl.arange(0, COMBINE_K)

    moe_x = tl.load(
        moe_ptr + pid * stride_moe_t + offs_k[:, None] * stride_moe_k + offs[None, :],
        mask=mask[None, :],
        other=0.0,
    ).to(tl.float32)
    moe_x = tl.sum(moe_x, axis=0)
    mlp_x = tl.load(mlp_ptr + pid * stride_mlp_t + offs, mask=mask, other=0.0).to(tl.float32)
    combined = (moe_x + mlp_x) / 1.4142135623730951
    tl.store(out_ptr + pid * stride_out_t + offs, combined.to(out_ptr.dtype.element_ty), mask=mask)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, moe_hidden_states: torch.Tensor, mlp_hidden_states: torch.Tensor):
        assert moe_hidden_states.is_contiguous()
        assert mlp_hidden_states.is_contiguous()
        bs, hidden_dim = mlp_hidden_states.shape
        if moe_hidden_states.dim() == 2:
            moe = moe_hidden_states.view(bs, 1, hidden_dim)  # pre-combined
        else:
            moe = moe_hidden_states
        combine_k = moe.shape[1]
        out = torch.empty_like(mlp_hidden_states)
        BLOCK_SIZE = triton.next_power_of_2(hidden_dim)
        num_warps = max(min(triton.next_power_of_2(triton.cdiv(hidden_dim, 1024)), 8), 4)
        experts_combine_kernel[(bs,)](
            out,
            moe,
            mlp_hidden_states,
            moe.stride(0),
            moe.stride(1),
            mlp_hidden_states.stride(0),
            out.stride(0),
            hidden_dim,
            COMBINE_K=combine_k,
            BLOCK_SIZE=BLOCK_SIZE,
            num_warps=num_warps,
        )
        return out


class Reference(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, moe_hidden_states: torch.Tensor, mlp_hidden_states: torch.Tensor):
        bs, hidden_dim = mlp_hidden_states.shape
        moe = moe_hidden_states.float().reshape(bs, -1, hidden_dim).sum(dim=1)
        out = (moe + mlp_hidden_states.float()) / 1.4142135623730951
        return out.to(mlp_hidden_states.dtype)


def get_inputs():
    moe_out = torch.randn(TOKENS, COMBINE_K, HIDDEN).to(DTYPE)
    mlp_out = torch.randn(TOKENS, HIDDEN).to(DTYPE)
    return [moe_out, mlp_out]


def get_init_inputs():
    return []
