"""RMSNorm followed by a fused scale + bias + residual add, forward and backward.

    n = x * rsqrt(mean_j(x_j^2) + eps) * w          (float32)
    y = (n * scale + bias + residual).to(x.dtype)

scale and bias are per-channel (an adaptive-norm / LayerScale pattern). Gradients of x, w,
scale, bias and residual. 8192 tokens x hidden 4096, bf16.
"""
import torch
import torch.nn as nn

TOKENS = 8192
HIDDEN = 4096
DTYPE = torch.bfloat16
EPS = 1e-6

SMALL_SHAPES = {"TOKENS": 5, "HIDDEN": 64}
BACKWARD = True
TAGS = ("norm", "elementwise", "training", "memory-bound")


class Model(nn.Module):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x, weight, scale, bias, residual):
        xf = x.float()
        n = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps) * weight.float()
        return (n * scale.float() + bias.float() + residual.float()).to(x.dtype)


def get_inputs():
    x = torch.randn(TOKENS, HIDDEN).to(DTYPE)
    weight = (1.0 + 0.1 * torch.randn(HIDDEN)).to(DTYPE)
    scale = (1.0 + 0.1 * torch.randn(HIDDEN)).to(DTYPE)
    bias = (0.1 * torch.randn(HIDDEN)).to(DTYPE)
    residual = torch.randn(TOKENS, HIDDEN).to(DTYPE)
    return [x, weight, scale, bias, residual]


def get_init_inputs():
    return [EPS]
