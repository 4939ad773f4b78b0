"""Test task for the inductor generator: reductions whose Triton uses triton_helpers (max2,
maximum, welford) and libdevice.tanh, so copying helpers and the interpreter shims are exercised."""
import torch
import torch.nn as nn

M = 6
N = 50
SMALL_SHAPES = {"M": 5, "N": 37}


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1), x.amax(dim=-1), torch.tanh(x).var(dim=-1)


def get_inputs():
    return [torch.randn(M, N)]


def get_init_inputs():
    return []
