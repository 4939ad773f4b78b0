"""Fused Linear + GELU: y = gelu(x W^T + b), forward and backward.

The layer owns W and b (nn.Linear parameters, initialised under the farm's seed), so the
gradients checked are those of x and of the parameters. An MLP up-projection at training
shapes: 4096 tokens, 4096 -> 11008, bf16 (fp32 accumulation).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 4096
IN_FEATURES = 4096
OUT_FEATURES = 11008
DTYPE = torch.bfloat16

SMALL_SHAPES = {"TOKENS": 8, "IN_FEATURES": 32, "OUT_FEATURES": 48}
BACKWARD = True
TAGS = ("matmul", "training", "compute-bound")


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features).to(DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x).float()).to(x.dtype)


def get_inputs():
    return [torch.randn(TOKENS, IN_FEATURES).to(DTYPE)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
