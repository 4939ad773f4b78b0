"""SiluAndMul: the SwiGLU activation of gated MLPs (vLLM ``SiluAndMul.forward_native``).

The input's last dimension holds two halves of width d = x.shape[-1] // 2, the gate
and the up projection, side by side:

    out[..., j] = silu(x[..., j]) * x[..., d + j],   silu(a) = a * sigmoid(a),   0 <= j < d

Output shape is x.shape[:-1] + (d,), same dtype as x. The native forward computes in the
input dtype (PyTorch's CPU/GPU ``F.silu`` upcasts internally for fp16).

Typical shapes: vLLM's activation benchmark and tests use num_tokens x 2*d with d in
{512, 1024, ...}, dtype fp16/bf16; here num_tokens=83 (odd, not a power of two),
d=1024, fp16.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_TOKENS = 83
D = 1024
DTYPE = torch.float16

SMALL_SHAPES = {"NUM_TOKENS": 5, "D": 67}

TAGS = ("elementwise", "activation", "memory-bound")


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


def get_inputs():
    x = torch.randn(NUM_TOKENS, 2 * D).to(DTYPE)
    return [x]


def get_init_inputs():
    return []
