"""Multimodal rotary position embedding, M-RoPE (vLLM's Triton mrope kernel
for Qwen2-VL / Qwen2.5-VL style models), neox (rotate-half) style, applied in
place to q and k.

Inputs: q [T, Hq*D], k [T, Hk*D] (fp16); cos, sin float32 [3, T, R/2] where
R = rotary_dim and the three rows are the temporal, height and width position
streams (cos/sin of position * inv_freq already gathered per token);
mrope_section = (s_t, s_h, s_w) with s_t + s_h + s_w = R/2. Frequency index
i in [0, R/2) takes its cos/sin from stream t if i < s_t, from stream h if
s_t <= i < s_t + s_h, else from stream w:

    c[t, i] = cos[stream(i), t, i],  s[t, i] = sin[stream(i), t, i]

For every head of q and of k, with x1 = x[..., :R/2], x2 = x[..., R/2:R]:

    x[..., :R/2]  = x1 * c - x2 * s
    x[..., R/2:R] = x2 * c + x1 * s

(dims R..D, if R < D, are left untouched), computed in float32 and stored in
the q/k dtype. Returns (q, k), the mutated inputs. The kernel runs one program
per token and handles all heads of q and of k as a [pad(H), pad(D)/2] tile.

Benchmark shape: T = 128 tokens, Hq = 32, Hk = 8, D = R = 128,
mrope_section = (16, 24, 24) (Qwen2-VL), q/k float16, cos/sin float32 built
from random (t, h, w) positions and theta = 1e6 inverse frequencies.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

NUM_TOKENS = 128
NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
HEAD_SIZE = 128
MROPE_SECTION = (16, 24, 24)  # sums to rotary_dim / 2
ROPE_THETA = 1000000.0
MAX_POSITION = 4096
DTYPE = torch.float16

# small: partial rotary (R = 16 < D = 20), non-power-of-two heads and head dim
SMALL_SHAPES = {
    "NUM_TOKENS": 7,
    "NUM_Q_HEADS": 5,
    "NUM_KV_HEADS": 3,
    "HEAD_SIZE": 20,
    "MROPE_SECTION": (2, 3, 3),
}

INPLACE_ARGS = (0, 1)
TAGS = ("rope", "elementwise", "memory-bound")


@triton.jit
def _triton_mrope_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    num_tokens,
    q_stride_t,
    k_stride_t,
    n_qh: tl.constexpr,
    n_kh: tl.constexpr,
    hd: tl.constexpr,
    rd: tl.constexpr,
    pad_n_qh: tl.constexpr,
    pad_n_kh: tl.constexpr,
    pad_hd: tl.constexpr,
    section_t: tl.constexpr,
    section_h: tl.constexpr,
    section_w: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    q_row = q_ptr + pid * q_stride_t
    k_row = k_ptr + pid * k_stride_t
    half_rd: tl.constexpr = rd // 2

    # cos/sin are [3, T, rd/2]: rows for the t, h, w position streams
    t_cos = cos_ptr + pid * half_rd
    h_cos = t_cos + num_tokens * half_rd
    w_cos = h_cos + num_tokens * half_rd
    t_sin = sin_ptr + pid * half_rd
    h_sin = t_sin + num_tokens * half_rd
    w_sin = h_sin + num_tokens * half_rd

    # pick, per frequency index, the stream given by mrope_section
    offs = tl.arange(0, pad_hd // 2)
    t_end: tl.constexpr = section_t
    h_end: tl.constexpr = section_t + section_h
    t_mask = offs < t_end
    h_mask = (offs >= t_end) & (offs < h_end)
    w_mask = (offs >= h_end) & (offs < half_rd)
    cos_row = (
        tl.load(t_cos + offs, mask=t_mask, other=0.0)
        + tl.load(h_cos + offs, mask=h_mask, other=0.0)
        + tl.load(w_cos + offs, mask=w_mask, other=0.0)
    ).to(tl.float32)
    sin_row = (
        tl.load(t_sin + offs, mask=t_mask, other=0.0)
        + tl.load(h_sin + offs, mask=h_mask, other=0.0)
        + tl.load(w_sin + offs, mask=w_mask, other=0.0)
    ).to(tl.float32)
    cos_row = cos_row[None, :]
    sin_row = sin_row[None, :]

    # q: [pad_n_qh, pad_hd/2] tile, first and second rotary halves
    qh = tl.arange(0, pad_n_qh)[:, None]
    q_off1 = qh * hd + offs[None, :]
    q_mask = (qh < n_qh) & (offs[None, :] < half_rd)
    q_off2 = q_off1 + half_rd
    q1 = tl.load(q_row + q_off1, mask=q_mask, other=0.0).to(tl.float32)
    q2 = tl.load(q_row + q_off2, mask=q_mask, other=0.0).to(tl.float32)
    new_q1 = q1 * cos_row - q2 * sin_row
    new_q2 = q2 * cos_row + q1 * sin_row
    tl.store(q_row + q_off1, new_q1.to(q_ptr.dtype.element_ty), mask=q_mask)
    tl.store(q_row + q_off2, new_q2.to(q_ptr.dtype.element_ty), mask=q_mask)

    # k: [pad_n_kh, pad_hd/2] tile
    kh = tl.arange(0, pad_n_kh)[:, None]
    k_off1 = kh * hd + offs[None, :]
    k_mask = (kh < n_kh) & (offs[None, :] < half_rd)
    k_off2 = k_off1 + half_rd
    k1 = tl.load(k_row + k_off1, mask=k_mask, other=0.0).to(tl.float32)
    k2 = tl.load(k_row + k_off2, mask=k_mask, other=0.0).to(tl.float32)
    new_k1 = k1 * cos_row - k2 * sin_row
    new_k2 = k2 * cos_row + k1 * sin_row
    tl.store(k_row + k_off1, new_k1.to(k_ptr.dtype.element_ty), mask=k_mask)
    tl.store(k_row + k_off2, new_k2.to(k_ptr.dtype.element_ty), mask=k_mask)


class Model(nn.Module):
    def __init__(self, head_size: int, section_t: int, section_h: int, section_w: int):
        super().__init__()
        self.head_size = head_size
        self.section = (section_t, section_h, section_w)

    def forward(self, q, k, cos, sin):
        num_tokens = q.shape[0]
        hd = self.head_size
        n_qh = q.shape[1] // hd
        n_kh = k.shape[1] // hd
        rd = 2 * cos.shape[-1]
        assert sum(self.section) == rd // 2 and rd <= hd
        assert q.stride(1) == 1 and k.stride(1) == 1
        cos = cos.contiguous()
        sin = sin.contiguous()
        _triton_mrope_kernel[(num_tokens,)](
            q,
            k,
            cos,
            sin,
            num_tokens,
            q.stride(0),
            k.stride(0),
            n_qh,
            n_kh,
            hd,
            rd,
            triton.next_power_of_2(n_qh),
            triton.next_power_of_2(n_kh),
            triton.next_power_of_2(hd),
            self.section[0],
            self.section[1],
            self.section[2],
            num_warps=4,
        )
        return q, k


class Reference(nn.Module):
    def __init__(self, head_size: int, section_t: int, section_h: int, section_w: int):
        super().__init__()
        self.head_size = head_size
        self.section = (section_t, section_h, section_w)

    def forward(self, q, k, cos, sin):
        hd = self.head_size
        half = cos.shape[-1]
        rd = 2 * half
        # per frequency index, which stream (0 = t, 1 = h, 2 = w)
        stream = torch.cat(
            [torch.full((n,), i, dtype=torch.long) for i, n in enumerate(self.section)]
        ).to(cos.device)
        idx = torch.arange(half, device=cos.device)
        c = cos.float()[stream, :, idx].transpose(0, 1)[:, None, :]  # [T, 1, half]
        s = sin.float()[stream, :, idx].transpose(0, 1)[:, None, :]
        for x in (q, k):
            xv = x.view(x.shape[0], -1, hd)
            x1 = xv[..., :half].float()
            x2 = xv[..., half:rd].float()
            o1 = x1 * c - x2 * s
            o2 = x2 * c + x1 * s
            xv[..., :half] = o1.to(x.dtype)
            xv[..., half:rd] = o2.to(x.dtype)
        return q, k


def get_inputs():
    T, hd = NUM_TOKENS, HEAD_SIZE
    half = sum(MROPE_SECTION)
    rd = 2 * half
    q = torch.randn(T, NUM_Q_HEADS * hd, dtype=torch.float32).to(DTYPE)
    k = torch.randn(T, NUM_KV_HEADS * hd, dtype=torch.float32).to(DTYPE)
    # (t, h, w) positions per token and rope frequencies -> cos/sin [3, T, rd/2]
    positions = torch.randint(0, MAX_POSITION, (3, T)).to(torch.float32)
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    freqs = positions[:, :, None] * inv_freq[None, None, :]
    cos = torch.cos(freqs)
    sin = torch.sin(freqs)
    return [q, k, cos, sin]


def get_init_inputs():
    return [HEAD_SIZE, *MROPE_SECTION]
