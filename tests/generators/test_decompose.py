"""Matmul and convolution as broadcast products and sums (farm.generators.inductor.decompose)
agree with aten's own kernels, for every convolution flavour KernelBench's level 1 has."""

from __future__ import annotations

import pytest
import torch

from farm.generators.inductor.decompose import _addmm, _conv, _mm, _mv


def test_matmul_family():
    torch.manual_seed(0)
    a, b, bias, v = torch.randn(5, 7), torch.randn(7, 3), torch.randn(3), torch.randn(7)
    torch.testing.assert_close(_mm(a, b), a @ b)
    torch.testing.assert_close(_mm(torch.randn(2, 5, 7), torch.randn(2, 7, 3)).shape, torch.Size([2, 5, 3]))
    torch.testing.assert_close(_addmm(bias, a, b, beta=0.5, alpha=2.0), torch.addmm(bias, a, b, beta=0.5, alpha=2.0))
    torch.testing.assert_close(_mv(a, v), a @ v)


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("stride,padding,dilation,groups,transposed,output_padding", [
    (1, 0, 1, 1, False, 0), (2, 1, 2, 2, False, 0), (3, 2, 1, 4, False, 0),
    (1, 0, 1, 1, True, 0), (2, 1, 1, 2, True, 1), (3, 2, 2, 4, True, 0), (2, 0, 3, 1, True, 1),
])
def test_convolution_flavours(nd, stride, padding, dilation, groups, transposed, output_padding):
    torch.manual_seed(nd)
    x = torch.randn(2, 8, *[7] * nd)
    w = torch.randn(8, 12 // groups, *[3] * nd) if transposed else torch.randn(12, 8 // groups, *[3] * nd)
    bias = torch.randn(12)
    args = ([stride] * nd, [padding] * nd, [dilation] * nd, transposed, [output_padding] * nd, groups)
    want = torch.ops.aten.convolution(x, w, bias, *args)
    got = _conv(x, w, bias, *args)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_strided_transposed_convolution_is_functional():
    """Inductor's decompositions run functionalized: no in-place writes (a zero-inserted input
    built by slice assignment failed torch.compile for every strided transposed conv)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3)
    graph = make_fx(lambda x, w: _conv(x, w, None, [2, 2], [1, 1], [1, 1], True, [1, 1], 2))(x, w)
    in_place = [str(n.target) for n in graph.graph.nodes if str(n.target).split(".")[-2:-1] and
                str(n.target).split(".")[-2].endswith("_")]
    assert not in_place
    want = torch.ops.aten.convolution(x, w, None, [2, 2], [1, 1], [1, 1], True, [1, 1], 2)
    torch.testing.assert_close(graph(x, w), want, atol=1e-4, rtol=1e-4)
