"""LayerNorm over the last dimension, forward and backward (torch.nn.functional.layer_norm).

    mean = mean_j(x_j), var = mean_j((x_j - mean)^2)      (float32)
    y    = ((x - mean) * rsqrt(var + eps) * w + b).to(x.dtype)

Gradients of x, w and b for a stored upstream gradient. A transformer block's norm at
training shapes: 8192 tokens x hidden 4096, bf16.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 8192
HIDDEN = 4096
DTYPE = torch.bfloat16
EPS = 1e-5

SMALL_SHAPES = {"TOKENS": 6, "HIDDEN": 96}
BACKWARD = True
TAGS = ("norm", "reduction", "training", "memory-bound")


class Model(nn.Module):
    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), self.eps)
        return y.to(x.dtype)


def get_inputs():
    x = torch.randn(TOKENS, HIDDEN).to(DTYPE)
    weight = (1.0 + 0.1 * torch.randn(HIDDEN)).to(DTYPE)
    bias = (0.1 * torch.randn(HIDDEN)).to(DTYPE)
    return [x, weight, bias]


def get_init_inputs():
    return [EPS]
