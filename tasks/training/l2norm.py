"""L2Norm over the last dimension, forward and backward (as FLA's / sglang's l2norm).

    y = x * rsqrt(sum_j x_j^2 + eps)        (float32 inside, input dtype out)

Gradient of x. Query/key normalisation of a linear-attention layer: 8192 tokens x 32 heads
x 128 = 4096 wide rows of 128, bf16.
"""
import torch
import torch.nn as nn

ROWS = 8192 * 32
DIM = 128
DTYPE = torch.bfloat16
EPS = 1e-6

SMALL_SHAPES = {"ROWS": 9, "DIM": 32}
BACKWARD = True
TAGS = ("norm", "reduction", "training", "memory-bound")


class Model(nn.Module):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt((xf * xf).sum(dim=-1, keepdim=True) + self.eps)).to(x.dtype)


def get_inputs():
    return [torch.randn(ROWS, DIM).to(DTYPE)]


def get_init_inputs():
    return [EPS]
