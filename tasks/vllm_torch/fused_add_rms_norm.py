"""Fused add + RMSNorm (vLLM ``RMSNorm.forward_native`` with a residual).

For each row (hidden size H), with the addition done in float32:

    r   = x.float() + residual.float()
    residual_out = r.to(x.dtype)
    var = mean_j(r_j^2)
    x_out = (r * rsqrt(var + eps)).to(x.dtype) * w

Returns ``(x_out, residual_out)``, both of x's shape and dtype. (vLLM's CUDA kernel
``fused_add_rms_norm`` writes both results in place into x and residual; the native
forward returns new tensors, which is what this task does.)

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

TAGS = ("norm", "reduction", "elementwise", "memory-bound")


class Model(nn.Module):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
        orig_dtype = x.dtype
        x = x.to(torch.float32)
        x = x + residual.to(torch.float32)
        residual = x.to(orig_dtype)
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        x = x.to(orig_dtype)
        x = x * weight
        return x, residual


def get_inputs():
    x = torch.randn(NUM_TOKENS, HIDDEN).to(DTYPE)
    residual = torch.randn(NUM_TOKENS, HIDDEN).to(DTYPE)
    weight = (1.0 + 0.1 * torch.randn(HIDDEN)).to(DTYPE)
    return [x, residual, weight]


def get_init_inputs():
    return [EPS]
