"""Merge two partial attention states by their log-sum-exp (SGLang merge_state_triton).

Split attention (e.g. prefix over a cached KV part + suffix over the new tokens, or two
KV splits) produces for every token t and head h a partial output v[t,h,:] (already
normalised by its own softmax denominator) and its log-sum-exp s[t,h] = log sum_j exp(q.k_j).
Two such states (a, b) are merged exactly:

    s_a' = -inf if s_a == +inf else s_a        (same for s_b; a +inf LSE, which FA2
                                                 reports for an empty KV range, counts
                                                 as "no keys")
    m    = max(s_a', s_b')
    w_a  = exp(s_a' - m),  w_b = exp(s_b' - m)
    out  = (v_a * w_a + v_b * w_b) / (w_a + w_b)          -> dtype of v
    s    = m + log(w_a + w_b)                             -> float32

Returns (out [T,H,D], s_merged [T,H]). Natural log / exp throughout. The case where both
LSEs are -inf (no keys on either side) is undefined (NaN), as in the original.

Kernel layout (as in the original): grid (T, H), one program per (token, head); it
loads the two scalar LSEs, computes the weights in float32, then loads the two head
vectors with one BLOCK_D = next_power_of_2(D) block (masked), combines in float32 and
stores in v's dtype. All strides are passed explicitly.

Benchmark shapes: T=128 tokens, H=32 heads, D=128 head dim; v float16, LSE float32
(a typical chunked-prefill / cascade merge for a Llama-style model). Inputs: about 2% of
s_a entries are +inf to exercise the empty-range convention (s_b is always finite).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

T = 128
H = 32
D = 128
DTYPE = torch.float16

SMALL_SHAPES = {"T": 5, "H": 3, "D": 72}
TAGS = ("attention", "reduction", "memory-bound")


@triton.jit
def merge_state_kernel(
    out_ptr, out_lse_ptr,
    va_ptr, sa_ptr, vb_ptr, sb_ptr,
    stride_va_t, stride_va_h,
    stride_vb_t, stride_vb_h,
    stride_o_t, stride_o_h,
    stride_sa_t, stride_sa_h,
    stride_sb_t, stride_sb_h,
    stride_os_t, stride_os_h,
    head_size,
    BLOCK_D: tl.constexpr,
    OUTPUT_LSE: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)

    sa = tl.load(sa_ptr + t * stride_sa_t + h * stride_sa_h).to(tl.float32)
    sb = tl.load(sb_ptr + t * stride_sb_t + h * stride_sb_h).to(tl.float32)
    sa = tl.where(sa == float("inf"), float("-inf"), sa)
    sb = tl.where(sb == float("inf"), float("-inf"), sb)
    m = tl.maximum(sa, sb)
    wa = tl.exp(sa - m)
    wb = tl.exp(sb - m)
    denom = wa + wb
    if OUTPUT_LSE:
        tl.store(out_lse_ptr + t * stride_os_t + h * stride_os_h, tl.log(denom) + m)

    scale_a = wa / denom
    scale_b = wb / denom
    d = tl.arange(0, BLOCK_D)
    mask = d < head_size
    va = tl.load(va_ptr + t * stride_va_t + h * stride_va_h + d, mask=mask, other=0.0).to(tl.float32)
    vb = tl.load(vb_ptr + t * stride_vb_t + h * stride_vb_h + d, mask=mask, other=0.0).to(tl.float32)
    o = va * scale_a + vb * scale_b
    tl.store(out_ptr + t * stride_o_t + h * stride_o_h + d, o.to(out_ptr.dtype.element_ty), mask=mask)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, v_a, s_a, v_b, s_b):
        assert v_a.stride(-1) == 1 and v_b.stride(-1) == 1
        n_tok, n_head, head_size = v_a.shape
        out = torch.empty_like(v_a)
        out_lse = torch.empty((n_tok, n_head), dtype=torch.float32, device=v_a.device)
        grid = (n_tok, n_head)
        merge_state_kernel[grid](
            out, out_lse, v_a, s_a, v_b, s_b,
            v_a.stride(0), v_a.stride(1),
            v_b.stride(0), v_b.stride(1),
            out.stride(0), out.stride(1),
            s_a.stride(0), s_a.stride(1),
            s_b.stride(0), s_b.stride(1),
            out_lse.stride(0), out_lse.stride(1),
            head_size,
            BLOCK_D=triton.next_power_of_2(head_size),
            OUTPUT_LSE=True,
        )
        return out, out_lse


class Reference(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, v_a, s_a, v_b, s_b):
        inf = float("inf")
        sa = s_a.float().masked_fill(s_a == inf, -inf)
        sb = s_b.float().masked_fill(s_b == inf, -inf)
        m = torch.maximum(sa, sb)
        wa = torch.exp(sa - m)
        wb = torch.exp(sb - m)
        denom = wa + wb
        out = (v_a.float() * (wa / denom).unsqueeze(-1) + v_b.float() * (wb / denom).unsqueeze(-1))
        return out.to(v_a.dtype), torch.log(denom) + m


def get_inputs():
    v_a = torch.randn(T, H, D, dtype=torch.float32).to(DTYPE)
    v_b = torch.randn(T, H, D, dtype=torch.float32).to(DTYPE)
    s_a = torch.randn(T, H, dtype=torch.float32) * 3.0 + 5.0
    s_b = torch.randn(T, H, dtype=torch.float32) * 3.0 + 5.0
    empty = torch.rand(T, H) < 0.02
    empty[0, 0] = True  # at least one +inf entry at any size
    s_a = s_a.masked_fill(empty, float("inf"))
    return [v_a, s_a, v_b, s_b]


def get_init_inputs():
    return []
