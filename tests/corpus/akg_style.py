"""Task files in the style of AKG's benchmark folders, written here (never copied from AKG):
a Triton `Model` beside a comparison class named the way AKG names it."""

TRITON_HEAD = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

N = 48


@triton.jit
def _twice_plus_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        y = torch.empty_like(x)
        _twice_plus_one[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
        return y


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
'''

# the comparison class is plain PyTorch: it serves as Reference
PURE_SGLANG = TRITON_HEAD + '''

class ModelSglang(nn.Module):
    """PyTorch equivalent"""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2.0 + 1.0
'''

# attention_kernels/ names its PyTorch comparison class ModelTorch
PURE_TORCH = PURE_SGLANG.replace("class ModelSglang(", "class ModelTorch(")

# the comparison class calls vLLM: reference-data mode
VLLM_CLASS = TRITON_HEAD + '''

class ModelVLLM(nn.Module):
    def __init__(self):
        super().__init__()
        from vllm.model_executor.layers.activation import TwicePlusOne
        self.layer = TwicePlusOne()

    def forward(self, x):
        return self.layer(x)
'''

# vllm/torch_ops: Model is vLLM's forward_native, plain PyTorch, its own truth
TORCH_MODEL = '''
import torch
import torch.nn as nn

N = 48


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
'''

# the framework import hides in a helper that forward calls: only trying it tells
HIDDEN_SGLANG = TRITON_HEAD + '''

def _sglang_op(x):
    import sglang.srt.layers.twice as twice
    return twice.twice_plus_one(x)


class ModelSGLang(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _sglang_op(x)
'''

# an output buffer made with torch.empty in get_inputs, filled in place by the kernel
EMPTY_BUFFER = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

N = 40


@triton.jit
def _copy_scaled(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0, mask=mask)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, out, idx):
        _copy_scaled[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
        return out


class ModelVLLM(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, out, idx):
        from vllm import _custom_ops
        return _custom_ops.scale(x, out)


def get_inputs():
    x = torch.randn(N)
    out = torch.empty(N)
    idx = torch.empty(N, dtype=torch.int32)
    return [x, out, idx]


def get_init_inputs():
    return []

INPLACE_ARGS = (1,)
'''

# no task at all: kernels only, and sglang imported at module level
HELPER_ONLY = '''
import triton
import triton.language as tl
from sglang.srt.utils import is_hip


@triton.jit
def fmix(x):
    return x ^ (x >> 16)
'''
