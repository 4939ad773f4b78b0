"""Rotary positional embedding, neox style (vLLM ``RotaryEmbedding.forward_native``).

Inputs: ``positions`` int64 [T]; ``query`` [T, num_heads * head_size] and ``key``
[T, num_kv_heads * head_size]; ``cos_sin_cache`` [max_position, rotary_dim] whose row p
is ``cat(cos(p * inv_freq), sin(p * inv_freq))`` with
``inv_freq[i] = base^(-2i / rotary_dim)``, i < rotary_dim / 2 (built in get_inputs with
base 10000, in float32).

For each token t and head, on the first ``rotary_dim`` elements of the head
(the rest passes through unchanged), with h = rotary_dim / 2,
cos = cache[pos_t, :h], sin = cache[pos_t, h:] (cast to the input dtype):

  neox style (halves):  x1 = x[:h], x2 = x[h:rotary_dim]
      out[:h] = x1 * cos - x2 * sin
      out[h:rotary_dim] = x2 * cos + x1 * sin
  GPT-J style (interleaved, is_neox_style=False): x1 = x[0::2], x2 = x[1::2], same
      formulas, results interleaved back.

Returns ``(query, key)`` rotated, same shapes/dtypes as the inputs (the native forward
returns new tensors; vLLM's CUDA kernel rotates in place).

Typical shapes: vLLM's rotary benchmark/tests use num_tokens up to a few thousand,
head_size 64..256, rotary_dim = head_size, max_position 8192, base 10000, fp16/bf16.
Here T=8192 tokens, 4 heads of 128 for both query and key (512 columns each),
rotary_dim=128, max_position=8192, fp16.
"""
import torch
import torch.nn as nn

NUM_TOKENS = 8192
NUM_HEADS = 4
NUM_KV_HEADS = 4
HEAD_SIZE = 128
ROTARY_DIM = 128
MAX_POSITION = 8192
BASE = 10000.0
IS_NEOX_STYLE = True
DTYPE = torch.float16

# Small: partial rotary (rotary_dim < head_size) so the pass-through path is exercised.
SMALL_SHAPES = {"NUM_TOKENS": 7, "NUM_HEADS": 3, "NUM_KV_HEADS": 1, "HEAD_SIZE": 48,
                "ROTARY_DIM": 32, "MAX_POSITION": 37}

TAGS = ("rope", "elementwise", "index", "memory-bound")


def _apply_rotary_emb(x, cos, sin, is_neox_style):
    # x: [T, heads, rotary_dim]; cos/sin: [T, rotary_dim // 2]
    cos = cos.unsqueeze(-2).to(x.dtype)
    sin = sin.unsqueeze(-2).to(x.dtype)
    if is_neox_style:
        x1, x2 = torch.chunk(x, 2, dim=-1)
    else:
        x1 = x[..., ::2]
        x2 = x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox_style:
        return torch.cat((o1, o2), dim=-1)
    return torch.stack((o1, o2), dim=-1).flatten(-2)


class Model(nn.Module):
    def __init__(self, head_size: int, rotary_dim: int, is_neox_style: bool = True):
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.is_neox_style = is_neox_style

    def _rotate(self, x, cos, sin):
        shape = x.shape
        num_tokens = cos.shape[0]
        x = x.view(num_tokens, -1, self.head_size)
        x_rot = x[..., : self.rotary_dim]
        x_pass = x[..., self.rotary_dim:]
        x_rot = _apply_rotary_emb(x_rot, cos, sin, self.is_neox_style)
        return torch.cat((x_rot, x_pass), dim=-1).reshape(shape)

    def forward(self, positions, query, key, cos_sin_cache):
        positions = positions.flatten()
        cos_sin = cos_sin_cache.index_select(0, positions)
        cos, sin = cos_sin.chunk(2, dim=-1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)


def _cos_sin_cache(max_position, rotary_dim, base):
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    t = torch.arange(max_position, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def get_inputs():
    positions = torch.randint(0, MAX_POSITION, (NUM_TOKENS,), dtype=torch.int64)
    query = torch.randn(NUM_TOKENS, NUM_HEADS * HEAD_SIZE).to(DTYPE)
    key = torch.randn(NUM_TOKENS, NUM_KV_HEADS * HEAD_SIZE).to(DTYPE)
    cos_sin_cache = _cos_sin_cache(MAX_POSITION, ROTARY_DIM, BASE)
    return [positions, query, key, cos_sin_cache]


def get_init_inputs():
    return [HEAD_SIZE, ROTARY_DIM, IS_NEOX_STYLE]
