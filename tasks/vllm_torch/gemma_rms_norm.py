"""Gemma RMSNorm (vLLM ``GemmaRMSNorm.forward_native``, no residual).

Gemma stores the norm weight as an offset from one. For each row (hidden size H),
entirely in float32 and cast back at the end:

    xf  = x.float()
    var = mean_j(xf_j^2)
    y   = (xf * rsqrt(var + eps) * (1 + w.float())).to(x.dtype)

Note the difference from plain RMSNorm: the weight multiply (with 1 + w) happens in
float32 before the single cast back. Output: same shape/dtype as x.

Typical shapes: vLLM's layernorm tests use num_tokens in {7, 83, 4096} and hidden sizes
{768, 2048, 5120, 8192}; Gemma runs in bf16. Here 83 x 2048, bf16, eps=1e-6.
"""
import torch
import torch.nn as nn

NUM_TOKENS = 83
HIDDEN = 2048
DTYPE = torch.bfloat16
EPS = 1e-6

SMALL_SHAPES = {"NUM_TOKENS": 5, "HIDDEN": 131}

TAGS = ("norm", "reduction", "memory-bound")


class Model(nn.Module):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        orig_dtype = x.dtype
        x = x.float()
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        x = x * (1.0 + weight.float())
        return x.to(orig_dtype)


def get_inputs():
    x = torch.randn(NUM_TOKENS, HIDDEN).to(DTYPE)
    # Gemma weights are offsets around zero (the norm scales by 1 + w).
    weight = (0.1 * torch.randn(HIDDEN)).to(DTYPE)
    return [x, weight]


def get_init_inputs():
    return [EPS]
