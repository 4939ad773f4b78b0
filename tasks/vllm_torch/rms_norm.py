"""RMSNorm (vLLM ``RMSNorm.forward_native``, no residual).

For each row x of the last dimension (hidden size H):

    var = mean_j(x_j^2)                       (in float32)
    y   = (x * rsqrt(var + eps)).to(x.dtype) * w

The input is upcast to float32, the variance and normalisation are computed in float32,
the normalised value is cast back to the input dtype and then multiplied by the weight
(in the input dtype), as the native forward does. Output: same shape/dtype as x.

Typical shapes: vLLM's layernorm tests/benchmarks use num_tokens in {7, 83, 4096} and
hidden sizes {768, 2048, 5120, 8192}, fp16/bf16; here 83 x 2048, fp16, eps=1e-6.
"""
import torch
import torch.nn as nn

NUM_TOKENS = 83
HIDDEN = 2048
DTYPE = torch.float16
EPS = 1e-6

SMALL_SHAPES = {"NUM_TOKENS": 5, "HIDDEN": 131}

TAGS = ("norm", "reduction", "memory-bound")


class Model(nn.Module):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        orig_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        x = x.to(orig_dtype)
        return x * weight


def get_inputs():
    x = torch.randn(NUM_TOKENS, HIDDEN).to(DTYPE)
    weight = (1.0 + 0.1 * torch.randn(HIDDEN)).to(DTYPE)
    return [x, weight]


def get_init_inputs():
    return [EPS]
