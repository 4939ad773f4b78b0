"""SGLang `moe_sum_reduce_triton`: top-k reduction of fused-MoE expert outputs.

After the second grouped GEMM of fused MoE, every token holds one (already router-weighted)
output row per selected expert, `x[t, k, :]`.  This op reduces them and applies the model's
routed scaling factor:

    out[t, h] = routed_scaling_factor * sum_{k < topk} x[t, k, h]

The sum is accumulated in float32 and the result is cast back to the input dtype.

SGLang's Triton kernel tiles the output as (BLOCK_M tokens) x (BLOCK_DIM hidden columns), one
program per tile on a 2-D grid, loops over the top-k slots, and uses BLOCK_M=1, BLOCK_DIM=2048,
num_warps=16.  SGLang takes this path in fused_experts for more than 32 tokens (smaller batches
go to a torch.compile'd sum).

Benchmark shapes: x fp16 [tokens=256, topk=8, hidden=4096], scale 1/8 (constructor argument).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

TOKENS = 256
TOPK = 8
HIDDEN = 4096
DTYPE = torch.float16
ROUTED_SCALING_FACTOR = 1.0 / 8

SMALL_SHAPES = {"TOKENS": 5, "TOPK": 3, "HIDDEN": 2111}
TAGS = ("moe", "reduction", "memory-bound")


@triton.jit
def _moe_sum_reduce_kernel(
    input_ptr,
    input_stride_0,
    input_stride_1,
    input_stride_2,
    output_ptr,
    output_stride_0,
    output_stride_1,
    token_num,
    topk_num,
    hidden_dim,
    routed_scaling_factor,
    BLOCK_M: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_d = tl.program_id(1)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = pid_d * BLOCK_DIM + tl.arange(0, BLOCK_DIM)
    mask = (offs_m[:, None] < token_num) & (offs_d[None, :] < hidden_dim)

    in_ptrs = (
        input_ptr
        + offs_m[:, None].to(tl.int64) * input_stride_0
        + offs_d[None, :] * input_stride_2
    )
    acc = tl.zeros((BLOCK_M, BLOCK_DIM), dtype=tl.float32)
    for k in range(0, topk_num):
        tile = tl.load(in_ptrs + k * input_stride_1, mask=mask, other=0.0)
        acc += tile.to(tl.float32)
    acc = acc * routed_scaling_factor

    out_ptrs = (
        output_ptr
        + offs_m[:, None].to(tl.int64) * output_stride_0
        + offs_d[None, :] * output_stride_1
    )
    tl.store(out_ptrs, acc.to(output_ptr.dtype.element_ty), mask=mask)


class Model(nn.Module):
    def __init__(self, routed_scaling_factor: float):
        super().__init__()
        self.routed_scaling_factor = routed_scaling_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.is_contiguous()
        token_num, topk_num, hidden_dim = x.shape
        out = torch.empty((token_num, hidden_dim), dtype=x.dtype, device=x.device)
        BLOCK_M = 1
        BLOCK_DIM = 2048
        grid = (triton.cdiv(token_num, BLOCK_M), triton.cdiv(hidden_dim, BLOCK_DIM))
        _moe_sum_reduce_kernel[grid](
            x,
            x.stride(0),
            x.stride(1),
            x.stride(2),
            out,
            out.stride(0),
            out.stride(1),
            token_num,
            topk_num,
            hidden_dim,
            self.routed_scaling_factor,
            BLOCK_M=BLOCK_M,
            BLOCK_DIM=BLOCK_DIM,
            num_warps=16,
        )
        return out


class Reference(nn.Module):
    def __init__(self, routed_scaling_factor: float):
        super().__init__()
        self.routed_scaling_factor = routed_scaling_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float().sum(dim=1) * self.routed_scaling_factor
        return out.to(x.dtype)


def get_inputs():
    x = torch.randn(TOKENS, TOPK, HIDDEN).to(DTYPE)
    return [x]


def get_init_inputs():
    return [ROUTED_SCALING_FACTOR]
