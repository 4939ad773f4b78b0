"""Demo: scaled vector add.

    out[i] = (x[i] + y[i]) * alpha

x, y float32 [N] (contiguous), alpha a Python float given to the constructor. Output
float32 [N]. A deliberately simple, untuned Triton kernel: one program per fixed block
of 256 elements, default num_warps; a search can tune BLOCK / num_warps.

Benchmark: N = 1 << 20, fp32. Small (interpreter): N = 1000 (not a multiple of BLOCK,
so the tail mask is exercised).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

N = 1 << 20
DTYPE = torch.float32
ALPHA = 0.75

SMALL_SHAPES = {"N": 1000}

TAGS = ("elementwise", "memory-bound")


@triton.jit
def _add_scale_kernel(x_ptr, y_ptr, out_ptr, n_elements, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    out = (x + y) * alpha
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


class Model(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        BLOCK = 256
        grid = (triton.cdiv(n, BLOCK),)
        _add_scale_kernel[grid](x, y, out, n, self.alpha, BLOCK=BLOCK)
        return out


class Reference(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((x.float() + y.float()) * self.alpha).to(x.dtype)


def get_inputs():
    x = torch.randn(N).to(DTYPE)
    y = torch.randn(N).to(DTYPE)
    return [x, y]


def get_init_inputs():
    return [ALPHA]
