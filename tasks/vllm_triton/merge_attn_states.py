"""Merge two partial attention results by their log-sum-exp (vLLM's Triton
merge_attn_states, used by cascade / chunked-prefill attention to combine the
attention over a shared prefix with the attention over the suffix).

Inputs (vLLM layout): prefix_output, suffix_output [T, H, D]; prefix_lse,
suffix_lse [H, T] float32 (note the head-major LSE layout). For every token t
and head h, with p = prefix_lse[h, t] and s = suffix_lse[h, t], where an LSE of
+inf is read as -inf (FlashAttention-2 reports +inf for an empty sequence,
FlashAttention-3 reports -inf; both mean "no keys"):

    m          = max(p, s)
    se         = exp(p - m) + exp(s - m)
    output_lse = log(se) + m                                  [H, T] float32
    output     = prefix_output * exp(p - m) / se
               + suffix_output * exp(s - m) / se              [T, H, D]

computed in float32 and stored in the output dtype. The kernel runs one
program per (token, head); it handles the head dim with a power-of-two
padded block and a mask.

Benchmark shape: T = 4096 tokens (vLLM's tests and benchmarks use
T = 128..4096), H = 32 query heads, D = 128, bfloat16 (vLLM also runs fp16 and
fp32). Inputs are random partial outputs and random LSEs (log of a sum of
exponentials is typically a few units); a few prefix LSEs are +inf and a few
suffix LSEs are -inf, to exercise the empty-side paths. No (token, head) has
both sides empty (the result would be NaN there, in the original as here).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

NUM_TOKENS = 4096
NUM_HEADS = 32
HEAD_SIZE = 128
DTYPE = torch.bfloat16

SMALL_SHAPES = {"NUM_TOKENS": 13, "NUM_HEADS": 3, "HEAD_SIZE": 40}

TAGS = ("attention", "elementwise", "memory-bound")


@triton.jit
def _merge_attn_states_kernel(
    out_ptr,
    out_lse_ptr,
    prefix_out_ptr,
    prefix_lse_ptr,
    suffix_out_ptr,
    suffix_lse_ptr,
    num_tokens,
    out_stride_t,
    out_stride_h,
    p_stride_t,
    p_stride_h,
    s_stride_t,
    s_stride_h,
    HEAD_SIZE: tl.constexpr,
    PADDED_HEAD_SIZE: tl.constexpr,
    OUTPUT_LSE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)

    # LSE layout is [H, T]
    p_lse = tl.load(prefix_lse_ptr + head * num_tokens + token)
    s_lse = tl.load(suffix_lse_ptr + head * num_tokens + token)
    # +inf (FA2 "empty") means the same as -inf (FA3 "empty")
    p_lse = tl.where(p_lse == float("inf"), float("-inf"), p_lse)
    s_lse = tl.where(s_lse == float("inf"), float("-inf"), s_lse)

    max_lse = tl.maximum(p_lse, s_lse)
    p_lse = p_lse - max_lse
    s_lse = s_lse - max_lse
    p_se = tl.exp(p_lse)
    s_se = tl.exp(s_lse)
    out_se = p_se + s_se

    if OUTPUT_LSE:
        out_lse = tl.log(out_se) + max_lse
        tl.store(out_lse_ptr + head * num_tokens + token, out_lse)

    offs = tl.arange(0, PADDED_HEAD_SIZE)
    mask = offs < HEAD_SIZE
    p_out = tl.load(
        prefix_out_ptr + token * p_stride_t + head * p_stride_h + offs, mask=mask, other=0.0
    ).to(tl.float32)
    s_out = tl.load(
        suffix_out_ptr + token * s_stride_t + head * s_stride_h + offs, mask=mask, other=0.0
    ).to(tl.float32)

    p_scale = p_se / out_se
    s_scale = s_se / out_se
    out = p_out * p_scale + s_out * s_scale
    tl.store(
        out_ptr + token * out_stride_t + head * out_stride_h + offs,
        out.to(out_ptr.dtype.element_ty),
        mask=mask,
    )


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, prefix_output, prefix_lse, suffix_output, suffix_lse):
        num_tokens, num_heads, head_size = prefix_output.shape
        assert prefix_output.stride(-1) == 1 and suffix_output.stride(-1) == 1
        prefix_lse = prefix_lse.contiguous()
        suffix_lse = suffix_lse.contiguous()
        output = torch.empty_like(prefix_output)
        output_lse = torch.empty(
            (num_heads, num_tokens), dtype=torch.float32, device=prefix_output.device
        )
        grid = (num_tokens, num_heads)
        _merge_attn_states_kernel[grid](
            output,
            output_lse,
            prefix_output,
            prefix_lse,
            suffix_output,
            suffix_lse,
            num_tokens,
            output.stride(0),
            output.stride(1),
            prefix_output.stride(0),
            prefix_output.stride(1),
            suffix_output.stride(0),
            suffix_output.stride(1),
            HEAD_SIZE=head_size,
            PADDED_HEAD_SIZE=triton.next_power_of_2(head_size),
            OUTPUT_LSE=True,
        )
        return output, output_lse


class Reference(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, prefix_output, prefix_lse, suffix_output, suffix_lse):
        inf = float("inf")
        p = prefix_lse.float()
        s = suffix_lse.float()
        p = torch.where(p == inf, torch.full_like(p, -inf), p)
        s = torch.where(s == inf, torch.full_like(s, -inf), s)
        m = torch.maximum(p, s)
        p_se = torch.exp(p - m)
        s_se = torch.exp(s - m)
        se = p_se + s_se
        output_lse = torch.log(se) + m  # [H, T]
        p_scale = (p_se / se).transpose(0, 1).unsqueeze(-1)  # [T, H, 1]
        s_scale = (s_se / se).transpose(0, 1).unsqueeze(-1)
        out = prefix_output.float() * p_scale + suffix_output.float() * s_scale
        return out.to(prefix_output.dtype), output_lse


def get_inputs():
    T, H, D = NUM_TOKENS, NUM_HEADS, HEAD_SIZE
    prefix_output = torch.randn(T, H, D, dtype=torch.float32).to(DTYPE)
    suffix_output = torch.randn(T, H, D, dtype=torch.float32).to(DTYPE)
    prefix_lse = 4.0 + 2.0 * torch.randn(H, T, dtype=torch.float32)
    suffix_lse = 4.0 + 2.0 * torch.randn(H, T, dtype=torch.float32)
    # empty sides: prefix marks them +inf (FA2 style), suffix -inf (FA3 style);
    # never both for the same (head, token)
    empty = torch.randint(0, 16, (H, T))
    prefix_lse[empty == 0] = float("inf")
    suffix_lse[empty == 1] = float("-inf")
    return [prefix_output, prefix_lse, suffix_output, suffix_lse]


def get_init_inputs():
    return []
