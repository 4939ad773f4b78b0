"""A training op for the export tests, written here: SwiGLU with a Triton forward and backward,
a declared shape space over tokens and two dtypes, and a PyTorch Reference."""

SWIGLU_TASK = '''"""SwiGLU with a Triton forward and backward: silu(gate) * up."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

TOKENS = 6
WIDTH = 40
DTYPE = torch.float32
SHAPE_SPACE = {"TOKENS": (1, 48), "DTYPE": ("float32", "float16")}
BACKWARD = True


@triton.jit
def _fwd(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd(g_ptr, u_ptr, dy_ptr, dg_ptr, du_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    s = tl.sigmoid(g)
    tl.store(dg_ptr + offs, (dy * u * s * (1.0 + g * (1.0 - s))).to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + offs, (dy * g * s).to(du_ptr.dtype.element_ty), mask=mask)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        gate, up = gate.contiguous(), up.contiguous()
        y = torch.empty_like(gate)
        n = gate.numel()
        _fwd[(triton.cdiv(n, 256),)](gate, up, y, n, BLOCK=256)
        ctx.save_for_backward(gate, up)
        return y

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        dg, du = torch.empty_like(gate), torch.empty_like(up)
        n = gate.numel()
        _bwd[(triton.cdiv(n, 256),)](gate, up, dy.contiguous(), dg, du, n, BLOCK=256)
        return dg, du


class Model(nn.Module):
    def forward(self, gate, up):
        return _SwiGLU.apply(gate, up)


class Reference(nn.Module):
    def forward(self, gate, up):
        return (torch.nn.functional.silu(gate.float()) * up.float()).to(gate.dtype)


def get_inputs():
    return [torch.randn(TOKENS, WIDTH).to(DTYPE), torch.randn(TOKENS, WIDTH).to(DTYPE)]


def get_init_inputs():
    return []
'''
