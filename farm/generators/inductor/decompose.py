"""Matmul and convolution as Triton reductions, so that inductor calls no external library.

Inductor hands `mm`, `bmm`, `addmm`, `convolution` (and what decomposes to them: linear,
matmul, SDPA's math path) to extern kernels (BLAS, oneDNN, cuDNN); a candidate built on
those launches no Triton for the heavy part. Registered as decompositions in the capture
child, each op becomes a broadcast product and a sum, which inductor fuses into one Triton
reduction kernel (the product is never materialised):

    mm(a, b)[m, n]               = sum_k a[m, k] * b[k, n]
    conv(x, w)[n, g, o, *s]      = sum_{c, *k} x_padded[n, g, c, *(s*stride + k*dilation)] * w[g, o, c, *k]
    conv_transpose(x, w)         = conv(zero-inserted x, flipped w), stride 1

The windows are views (`unfold` plus a dilation slice), so the reduction reads the input in
place. This is correct everywhere and the simplest Triton that computes these ops; it is
not a tensor-core kernel (no `tl.dot`): on cuda the max-autotune mode uses inductor's own
Triton templates for mm instead (docs/inductor.md), and the search's tune/llm generators
start from either. Sums run in fp32 for half types (inductor's reductions accumulate in
fp32), in a different order than BLAS: differences are rounding-level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _mm(a, b):
    return (a.unsqueeze(-1) * b.unsqueeze(-3)).sum(-2)


def _addmm(bias, a, b, beta=1, alpha=1):
    out = _mm(a, b)
    if alpha != 1:
        out = out * alpha
    if beta == 0:
        return out
    return out + (bias if beta == 1 else bias * beta)


def _mv(a, v):
    return (a * v.unsqueeze(0)).sum(-1)


def _dot(a, b):
    return (a * b).sum()


def _conv(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    import torch

    nd = w.dim() - 2
    stride, padding, dilation = (_expand(v, nd) for v in (stride, padding, dilation))
    if transposed:
        x, w, padding, stride = _as_direct(x, w, stride, padding, dilation, _expand(output_padding, nd), groups)
    batch, channels = x.shape[0], x.shape[1]
    pads = []
    for p in reversed(padding):
        pads += [p, p]
    if any(pads):
        x = torch.constant_pad_nd(x, pads, 0.0)
    for i in range(nd):
        window = dilation[i] * (w.shape[2 + i] - 1) + 1
        x = x.unfold(2 + i, window, stride[i])
    if any(d != 1 for d in dilation):
        strided = (Ellipsis, *[slice(None, None, d) for d in dilation])
        x = x[strided]
    # x: [N, C, *out, *k] -> [N, g, 1, C/g, *out, *k]
    out_sizes = list(x.shape[2:2 + nd])
    x = x.reshape(batch, groups, 1, channels // groups, *out_sizes, *w.shape[2:])
    out_ch = w.shape[0]
    # w: [O, C/g, *k] -> [1, g, O/g, C/g, *1, *k]
    wv = w.reshape(1, groups, out_ch // groups, w.shape[1], *([1] * nd), *w.shape[2:])
    reduce_dims = [3] + [4 + nd + i for i in range(nd)]
    out = (x * wv).sum(reduce_dims).reshape(batch, out_ch, *out_sizes)
    if bias is not None:
        out = out + bias.reshape(1, out_ch, *([1] * nd))
    return out


def _as_direct(x, w, stride, padding, dilation, output_padding, groups):
    """conv_transpose(x, w) as (zero-inserted x, weight for a direct conv, padding, stride 1)."""
    import torch

    nd = w.dim() - 2
    for i, s in enumerate(stride):
        if s != 1:
            # zero insertion, functionally (a decomposition may not write in place): each
            # element followed by s-1 zeros along the axis, the trailing zeros cut off
            d = 2 + i
            zeros = list(x.shape)
            zeros.insert(d + 1, s - 1)
            x = torch.cat([x.unsqueeze(d + 1), x.new_zeros(zeros)], dim=d + 1)
            merged = list(x.shape[:d]) + [x.shape[d] * s] + list(x.shape[d + 2:])
            x = x.reshape(merged).narrow(d, 0, (merged[d] // s - 1) * s + 1)
    pads = []
    for i in reversed(range(nd)):
        edge = dilation[i] * (w.shape[2 + i] - 1) - padding[i]
        pads += [edge, edge + output_padding[i]]
    x = torch.constant_pad_nd(x, pads, 0.0)  # negative edges crop
    # w: [C_in, O/g, *k] -> [O, C_in/g, *k], kernel flipped
    c_in, o_per = w.shape[0], w.shape[1]
    w = w.reshape(groups, c_in // groups, o_per, *w.shape[2:]).transpose(1, 2)
    w = w.reshape(groups * o_per, c_in // groups, *w.shape[3:]).flip(list(range(2, 2 + nd)))
    return x, w, [0] * nd, [1] * nd


def _expand(value, n: int) -> list[int]:
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    return value * n if len(value) == 1 else value


def table(matmul: bool = True) -> dict:
    """aten overload -> decomposition, for the inductor capture child."""
    import torch

    aten = torch.ops.aten
    out: dict[Any, Callable] = {aten.convolution.default: _conv}
    if matmul:
        out.update({aten.mm.default: _mm, aten.bmm.default: _mm, aten.addmm.default: _addmm, aten.mv.default: _mv,
                    aten.dot.default: _dot})
    return out


def install(matmul: bool = True) -> None:
    """Make inductor's decomposition table use these (the capture child only: it is global)."""
    from torch._inductor import decomposition

    decomposition.decompositions.update(table(matmul))
    if hasattr(decomposition, "select_decomp_table") and hasattr(decomposition.select_decomp_table, "cache_clear"):
        decomposition.select_decomp_table.cache_clear()
