"""FlashAttention, causal (decoder self-attention), forward and backward (a training attention layer's core).

    S = Q K^T * scale, with S[i, j] = -inf for j > i   (B, H, L, L), in float32
    P = softmax(S, dim=-1)
    O = P V                    (B, H, L, D), in the input dtype

Semantics are torch.nn.functional.scaled_dot_product_attention with is_causal=True and no dropout.
Gradients of Q, K and V for a stored upstream gradient dO. Training shapes of a 1-2B model:
batch 4, 16 heads, sequence 2048, head dim 64, fp16.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4
HEADS = 16
SEQ = 2048
HEAD_DIM = 64
DTYPE = torch.float16

SMALL_SHAPES = {"BATCH": 1, "HEADS": 2, "SEQ": 32, "HEAD_DIM": 16}
BACKWARD = True  # gradients of every floating-point input (q, k, v)
TAGS = ("attention", "training", "compute-bound")


class Model(nn.Module):
    def __init__(self, causal: bool = False):
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


def get_inputs():
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    return [torch.randn(shape).to(DTYPE) for _ in range(3)]


def get_init_inputs():
    return [True]
