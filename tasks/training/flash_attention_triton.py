"""FlashAttention-2 in Triton, forward and backward (a training attention layer's own kernels).

Semantics are torch.nn.functional.scaled_dot_product_attention (Reference) with no mask but
the optional causal one, no dropout and the default scale 1/sqrt(D):

    S = Q K^T * scale            (B, H, L, L), never stored
    P = softmax(S, dim=-1)       (causal: S[i, j] = -inf for j > i)
    O = P V                      (B, H, L, D), in the input dtype

Kernels (FlashAttention-2's split of the work):
- forward: one program per (BLOCK_M query rows, batch*head); it walks the key/value blocks
  with an online softmax (running max m and sum l, float32, exp2 with the scale folded into
  log2(e)) and stores O and the row's logsumexp LSE = m + ln(l), the only statistic the
  backward needs;
- backward preprocess: delta_i = sum_d dO[i, d] * O[i, d] (float32), the row term of the
  softmax's gradient;
- backward dK, dV: one program per BLOCK_N key rows; it recomputes P^T = exp(K Q^T * scale -
  LSE) block by block over the query rows that see those keys and accumulates
  dV += P^T dO and dK += dS^T Q * scale with dS = P * (dO V^T - delta);
- backward dQ: one program per BLOCK_M query rows; dQ += dS K * scale over their key blocks.
Every block size is free (powers of two, rows past L masked), so the tune generator may move
each kernel's launch parameters independently.

Training shapes of a 1-2B model: batch 4, 16 heads, sequence 2048, head dim 64, fp16, causal
(decoder self-attention). Gradients of Q, K and V for a stored upstream gradient dO.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl

BATCH = 4
HEADS = 16
SEQ = 2048
HEAD_DIM = 64
DTYPE = torch.float16
CAUSAL = True

# 40 rows: partial blocks at every block size the interpreter uses
SMALL_SHAPES = {"BATCH": 1, "HEADS": 2, "SEQ": 40, "HEAD_DIM": 16}
BACKWARD = True  # gradients of q, k and v
TAGS = ("attention", "training", "compute-bound")

LOG2E = 1.4426950408889634


@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, seq_len, head_dim, qk_scale_log2,
                     CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh * seq_len * head_dim  # q, k, v, o are contiguous (B*H, L, D)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < seq_len
    dim_ok = dims < head_dim
    q = tl.load(q_ptr + base + rows[:, None] * head_dim + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running row max of S * log2(e)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(S * log2(e) - m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # causal: key blocks past this query block's last row contribute nothing
    hi = tl.minimum((pid_m + 1) * BLOCK_M, seq_len) if CAUSAL else seq_len
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < seq_len
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + base + cols[:, None] * head_dim + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + base + cols[:, None] * head_dim + dims[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2
        keep = col_ok[None, :]
        if CAUSAL:
            keep = keep & (rows[:, None] >= cols[None, :])
        s = tl.where(keep, s, float("-inf"))
        # every row keeps key 0 (causal) or any valid key, so m_new is finite
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(o_ptr + base + rows[:, None] * head_dim + dims[None, :], out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])
    # natural-log logsumexp of the scaled scores: (m + log2 l) / log2(e)
    tl.store(lse_ptr + bh * seq_len + rows, (m_i + tl.log2(l_i)) / 1.4426950408889634, mask=row_ok)


@triton.jit
def _attn_bwd_preprocess_kernel(o_ptr, do_ptr, delta_ptr, seq_len, head_dim,
                                BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh * seq_len * head_dim
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    mask = (rows < seq_len)[:, None] & (dims < head_dim)[None, :]
    o = tl.load(o_ptr + base + rows[:, None] * head_dim + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + base + rows[:, None] * head_dim + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + bh * seq_len + rows, tl.sum(o * do, axis=1), mask=rows < seq_len)


@triton.jit
def _attn_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                          seq_len, head_dim, sm_scale,
                          CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr):
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh * seq_len * head_dim
    stat = bh * seq_len
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # this program's key rows
    offs_m = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    col_ok = cols < seq_len
    dim_ok = dims < head_dim
    kv_mask = col_ok[:, None] & dim_ok[None, :]
    k = tl.load(k_ptr + base + cols[:, None] * head_dim + dims[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + base + cols[:, None] * head_dim + dims[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # causal: query rows before this block's first key never see it
    lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for start_m in range(lo, seq_len, BLOCK_M):
        rows = start_m + offs_m
        row_ok = rows < seq_len
        q_mask = row_ok[:, None] & dim_ok[None, :]
        q = tl.load(q_ptr + base + rows[:, None] * head_dim + dims[None, :], mask=q_mask, other=0.0)
        do = tl.load(do_ptr + base + rows[:, None] * head_dim + dims[None, :], mask=q_mask, other=0.0)
        lse = tl.load(lse_ptr + stat + rows, mask=row_ok, other=0.0)
        delta = tl.load(delta_ptr + stat + rows, mask=row_ok, other=0.0)
        # P^T (keys x queries), recomputed from the stored logsumexp
        s_t = tl.dot(k, tl.trans(q)) * sm_scale
        keep = col_ok[:, None] & row_ok[None, :]
        if CAUSAL:
            keep = keep & (rows[None, :] >= cols[:, None])
        p_t = tl.where(keep, tl.exp(s_t - lse[None, :]), 0.0)
        dv += tl.dot(p_t.to(do.dtype), do)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q)

    tl.store(dk_ptr + base + cols[:, None] * head_dim + dims[None, :], (dk * sm_scale).to(dk_ptr.dtype.element_ty),
             mask=kv_mask)
    tl.store(dv_ptr + base + cols[:, None] * head_dim + dims[None, :], dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def _attn_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, seq_len, head_dim, sm_scale,
                        CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh * seq_len * head_dim
    stat = bh * seq_len
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < seq_len
    dim_ok = dims < head_dim
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + base + rows[:, None] * head_dim + dims[None, :], mask=q_mask, other=0.0)
    do = tl.load(do_ptr + base + rows[:, None] * head_dim + dims[None, :], mask=q_mask, other=0.0)
    lse = tl.load(lse_ptr + stat + rows, mask=row_ok, other=0.0)
    delta = tl.load(delta_ptr + stat + rows, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    hi = tl.minimum((pid_m + 1) * BLOCK_M, seq_len) if CAUSAL else seq_len
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < seq_len
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + base + cols[:, None] * head_dim + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + base + cols[:, None] * head_dim + dims[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        keep = row_ok[:, None] & col_ok[None, :]
        if CAUSAL:
            keep = keep & (rows[:, None] >= cols[None, :])
        p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)

    tl.store(dq_ptr + base + rows[:, None] * head_dim + dims[None, :], (dq * sm_scale).to(dq_ptr.dtype.element_ty),
             mask=q_mask)


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        batch, heads, seq_len, head_dim = q.shape
        sm_scale = 1.0 / math.sqrt(head_dim)
        o = torch.empty_like(q)
        lse = torch.empty((batch * heads, seq_len), device=q.device, dtype=torch.float32)
        BLOCK_M = 64
        BLOCK_N = 64
        grid = (triton.cdiv(seq_len, BLOCK_M), batch * heads)
        _attn_fwd_kernel[grid](q, k, v, o, lse, seq_len, head_dim, sm_scale * LOG2E,
                               CAUSAL=causal, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                               BLOCK_D=triton.next_power_of_2(head_dim), num_warps=4, num_stages=2)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        ctx.sm_scale = sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        do = do.contiguous()
        batch, heads, seq_len, head_dim = q.shape
        block_d = triton.next_power_of_2(head_dim)
        delta = torch.empty_like(lse)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        PRE_BLOCK_M = 64
        _attn_bwd_preprocess_kernel[(triton.cdiv(seq_len, PRE_BLOCK_M), batch * heads)](
            o, do, delta, seq_len, head_dim, BLOCK_M=PRE_BLOCK_M, BLOCK_D=block_d, num_warps=4)

        KV_BLOCK_M = 32
        KV_BLOCK_N = 64
        _attn_bwd_dkdv_kernel[(triton.cdiv(seq_len, KV_BLOCK_N), batch * heads)](
            q, k, v, do, lse, delta, dk, dv, seq_len, head_dim, ctx.sm_scale,
            CAUSAL=ctx.causal, BLOCK_M=KV_BLOCK_M, BLOCK_N=KV_BLOCK_N, BLOCK_D=block_d,
            num_warps=4, num_stages=2)

        DQ_BLOCK_M = 64
        DQ_BLOCK_N = 32
        _attn_bwd_dq_kernel[(triton.cdiv(seq_len, DQ_BLOCK_M), batch * heads)](
            q, k, v, do, lse, delta, dq, seq_len, head_dim, ctx.sm_scale,
            CAUSAL=ctx.causal, BLOCK_M=DQ_BLOCK_M, BLOCK_N=DQ_BLOCK_N, BLOCK_D=block_d,
            num_warps=4, num_stages=2)
        return dq, dk, dv, None


class Model(nn.Module):
    def __init__(self, causal: bool = False):
        super().__init__()
        self.causal = bool(causal)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _FlashAttention.apply(q, k, v, self.causal)


class Reference(nn.Module):
    def __init__(self, causal: bool = False):
        super().__init__()
        self.causal = bool(causal)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


def get_inputs():
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    return [torch.randn(shape).to(DTYPE) for _ in range(3)]


def get_init_inputs():
    return [CAUSAL]
