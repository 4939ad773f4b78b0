"""Hand-written best-effort kernels for bench/bandwidth_gpu.py: measured ceilings, not candidates.

Each reads every input once and writes every output once, with wide tiles, for the benchmark
shape of one task (power-of-two head sizes, token counts divisible by the tile). They bound
what a kernel can reach at that shape on the device; the search never sees them.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _log_softmax_row(x_ptr, out_ptr, stride, n_cols, BLOCK: tl.constexpr):
    # the whole row in registers: one read of x, one write of out
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=float("-inf"), eviction_policy="evict_first")
    x = x.to(tl.float32)
    m = tl.max(x, axis=0)
    s = tl.sum(tl.exp(x - m), axis=0)
    y = x - m - tl.log(s)
    tl.store(out_ptr + row * stride + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def log_softmax_one_pass(x, warps):
    x2 = x.reshape(-1, x.shape[-1])
    out = torch.empty_like(x2)
    _log_softmax_row[(x2.shape[0],)](x2, out, x2.stride(0), x2.shape[1],
                                     BLOCK=triton.next_power_of_2(x2.shape[1]), num_warps=warps)
    return out.view(x.shape)


@triton.jit
def _merge_tokens(out_ptr, out_lse_ptr, p_ptr, p_lse_ptr, s_ptr, s_lse_ptr, T,
                  H: tl.constexpr, D: tl.constexpr, TOKENS: tl.constexpr):
    # TOKENS tokens per program, all heads of a token as one [H, D] tile
    h = tl.arange(0, H)
    d = tl.arange(0, D)
    for i in tl.static_range(TOKENS):
        t = (tl.program_id(0) * TOKENS + i).to(tl.int64)
        p_lse = tl.load(p_lse_ptr + h * T + t)
        s_lse = tl.load(s_lse_ptr + h * T + t)
        p_lse = tl.where(p_lse == float("inf"), float("-inf"), p_lse)
        s_lse = tl.where(s_lse == float("inf"), float("-inf"), s_lse)
        m = tl.maximum(p_lse, s_lse)
        p_se = tl.exp(p_lse - m)
        s_se = tl.exp(s_lse - m)
        se = p_se + s_se
        tl.store(out_lse_ptr + h * T + t, tl.log(se) + m)
        offs = t * H * D + h[:, None] * D + d[None, :]
        p = tl.load(p_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        s = tl.load(s_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        o = p * (p_se / se)[:, None] + s * (s_se / se)[:, None]
        tl.store(out_ptr + offs, o.to(out_ptr.dtype.element_ty))


def merge_per_token(prefix_output, prefix_lse, suffix_output, suffix_lse, tokens, warps):
    T, H, D = prefix_output.shape
    out = torch.empty_like(prefix_output)
    out_lse = torch.empty((H, T), dtype=torch.float32, device=prefix_output.device)
    _merge_tokens[(T // tokens,)](out, out_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, T,
                                  H=H, D=D, TOKENS=tokens, num_warps=warps)
    return out, out_lse


@triton.jit
def _rope_neox(pos_ptr, q_ptr, k_ptr, cache_ptr, qo_ptr, ko_ptr,
               NQ: tl.constexpr, NK: tl.constexpr, HALF: tl.constexpr, BT: tl.constexpr):
    # BT tokens per program: cos/sin gathered once per token, applied to every q and k head
    t = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)
    j = tl.arange(0, HALF)
    pos = tl.load(pos_ptr + t)
    cs = cache_ptr + pos[:, None] * (2 * HALF) + j[None, :]
    cos = tl.load(cs)
    sin = tl.load(cs + HALF)
    for h in tl.static_range(NQ):
        base = t[:, None] * (NQ * 2 * HALF) + h * 2 * HALF + j[None, :]
        x1 = tl.load(q_ptr + base).to(tl.float32)
        x2 = tl.load(q_ptr + base + HALF).to(tl.float32)
        tl.store(qo_ptr + base, (x1 * cos - x2 * sin).to(qo_ptr.dtype.element_ty))
        tl.store(qo_ptr + base + HALF, (x2 * cos + x1 * sin).to(qo_ptr.dtype.element_ty))
    for h in tl.static_range(NK):
        base = t[:, None] * (NK * 2 * HALF) + h * 2 * HALF + j[None, :]
        x1 = tl.load(k_ptr + base).to(tl.float32)
        x2 = tl.load(k_ptr + base + HALF).to(tl.float32)
        tl.store(ko_ptr + base, (x1 * cos - x2 * sin).to(ko_ptr.dtype.element_ty))
        tl.store(ko_ptr + base + HALF, (x2 * cos + x1 * sin).to(ko_ptr.dtype.element_ty))


def rope_neox(positions, query, key, cos_sin_cache, block_t, warps, head_size=128):
    # the task's shape: rotary_dim == head_size, neox style
    T = positions.numel()
    half = cos_sin_cache.shape[1] // 2
    qo, ko = torch.empty_like(query), torch.empty_like(key)
    _rope_neox[(T // block_t,)](positions, query, key, cos_sin_cache, qo, ko,
                                NQ=query.shape[1] // head_size, NK=key.shape[1] // head_size, HALF=half,
                                BT=block_t, num_warps=warps)
    return qo, ko
