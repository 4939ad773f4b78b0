"""Fused SiLU (x * sigmoid(x)), forward and backward.

torch.nn.functional.silu(x) in float32, cast back to the input dtype.
Gradient of x. An MLP activation at training shapes: 8192 tokens x 16384 (4 x hidden 4096), bf16.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 8192
WIDTH = 16384
DTYPE = torch.bfloat16

SMALL_SHAPES = {"TOKENS": 4, "WIDTH": 100}
BACKWARD = True
TAGS = ("elementwise", "training", "memory-bound")


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x.float()).to(x.dtype)


def get_inputs():
    return [torch.randn(TOKENS, WIDTH).to(DTYPE)]


def get_init_inputs():
    return []
