"""Fused dropout + residual add, training mode, forward and backward.

Randomness is an input, so the result verifies exactly: `noise` holds uniform numbers in
[0, 1) drawn by get_inputs, and an element is kept where noise >= p:

    y = where(noise >= p, x / (1 - p), 0) + residual

The backward must use the same mask: dx = where(noise >= p, dy / (1 - p), 0), dresidual = dy.
A kernel that draws its own random numbers, or that ignores the mask in backward, fails
verification. Gradients of x and residual. After attention at training shapes: 8192 tokens x
hidden 4096, bf16, p = 0.1.
"""
import torch
import torch.nn as nn

TOKENS = 8192
HIDDEN = 4096
DTYPE = torch.bfloat16
P = 0.1

SMALL_SHAPES = {"TOKENS": 6, "HIDDEN": 80}
BACKWARD = True
GRAD_INPUTS = (0, 1)  # x and residual; the noise is data
TAGS = ("elementwise", "random", "training", "memory-bound")


class Model(nn.Module):
    def __init__(self, p: float = 0.1):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor, residual: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        keep = noise >= self.p
        dropped = torch.where(keep, x.float() / (1.0 - self.p), torch.zeros((), dtype=torch.float32))
        return (dropped + residual.float()).to(x.dtype)


def get_inputs():
    x = torch.randn(TOKENS, HIDDEN).to(DTYPE)
    residual = torch.randn(TOKENS, HIDDEN).to(DTYPE)
    noise = torch.rand(TOKENS, HIDDEN)
    return [x, residual, noise]


def get_init_inputs():
    return [P]
