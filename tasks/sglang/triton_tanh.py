"""Elementwise hyperbolic tangent, as a flat 1-D Triton kernel.

Semantics: out = tanh(x) = (e^x - e^-x) / (e^x + e^-x), same shape and dtype as x.

The kernel is the usual CUDA-GPU elementwise layout: the tensor is viewed as a flat
array of N elements, each program handles BLOCK_SIZE consecutive elements (masked at
the tail), loads them, computes in float32 and stores in the input dtype. tanh is
written with tl.exp in the overflow-free form
    tanh(x) = sign(x) * (1 - e^{-2|x|}) / (1 + e^{-2|x|})
(no libdevice, so the same kernel runs in the CPU Triton interpreter).

Benchmark shape: x float32 [4, 32, 512, 512] (33.5 M elements, 128 MiB), the size used
by AKG's elementwise tanh benchmark.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

SHAPE = (4, 32, 512, 512)
DTYPE = torch.float32
BLOCK = 1024

SMALL_SHAPES = {"SHAPE": (3, 5, 7, 11)}
TAGS = ("elementwise", "activation", "memory-bound")


@triton.jit
def tanh_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    y = tl.where(x < 0, -y, y)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        grid = (triton.cdiv(n, BLOCK),)
        tanh_kernel[grid](x, out, n, BLOCK_SIZE=BLOCK, num_warps=4)
        return out


class Reference(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.tanh(x.float()).to(x.dtype)


def get_inputs():
    x = torch.randn(*SHAPE, dtype=torch.float32) * 2.0
    return [x.to(DTYPE)]


def get_init_inputs():
    return []
