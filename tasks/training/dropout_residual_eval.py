"""Fused dropout + residual add, eval mode: dropout is the identity, y = x + residual.

The eval-mode path of the training op (dropout_residual), verified exactly like any other
op; no noise input. Gradients of x and residual. 8192 tokens x hidden 4096, bf16.
"""
import torch
import torch.nn as nn

TOKENS = 8192
HIDDEN = 4096
DTYPE = torch.bfloat16

SMALL_SHAPES = {"TOKENS": 6, "HIDDEN": 80}
BACKWARD = True
TAGS = ("elementwise", "training", "memory-bound")


class Model(nn.Module):
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return (x.float() + residual.float()).to(x.dtype)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN).to(DTYPE), torch.randn(TOKENS, HIDDEN).to(DTYPE)]


def get_init_inputs():
    return []
