"""Logit soft-capping, flat 1-D Triton kernel (SGLang fused_softcap).

Semantics: out = c * tanh(x / c), elementwise, with the cap c (e.g. 30.0 for Gemma-2 /
Grok final logits) a constructor argument. The input is the logits tensor in the model
dtype; the output is float32 (logits are handed to sampling in float32), same shape.

Kernel layout: the logits are viewed as a flat array; each program handles BLOCK_SIZE
consecutive elements (masked tail), converts to float32, computes
    tanh(y) = sign(y) * (1 - e^{-2|y|}) / (1 + e^{-2|y|}),  y = x / c
with tl.exp (overflow-free form, no libdevice), multiplies by c and stores float32.

Benchmark shapes: x bfloat16 [128, 32000] (128 tokens x a Llama-sized 32000 vocabulary),
c = 30.0 from get_init_inputs(). Logits are drawn as 20 * randn so a good share of values
lie in the saturating part of the curve.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

T = 128
VOCAB = 32000
DTYPE = torch.bfloat16
SOFTCAP = 30.0
BLOCK = 1024

SMALL_SHAPES = {"T": 5, "VOCAB": 333}
TAGS = ("elementwise", "activation", "memory-bound")


@triton.jit
def fused_softcap_kernel(x_ptr, out_ptr, n_elements, softcap, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x / softcap
    t = tl.exp(-2.0 * tl.abs(y))
    th = (1.0 - t) / (1.0 + t)
    th = tl.where(y < 0, -th, th)
    tl.store(out_ptr + offs, th * softcap, mask=mask)


class Model(nn.Module):
    def __init__(self, softcap):
        super().__init__()
        self.softcap = softcap

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        n = x.numel()
        grid = (triton.cdiv(n, BLOCK),)
        fused_softcap_kernel[grid](x, out, n, self.softcap, BLOCK_SIZE=BLOCK, num_warps=4)
        return out


class Reference(nn.Module):
    def __init__(self, softcap):
        super().__init__()
        self.softcap = softcap

    def forward(self, x):
        return self.softcap * torch.tanh(x.float() / self.softcap)


def get_inputs():
    x = (20.0 * torch.randn(T, VOCAB, dtype=torch.float32)).to(DTYPE)
    return [x]


def get_init_inputs():
    return [SOFTCAP]
