"""Row-wise log_softmax over the last dimension (vLLM's Triton log_softmax
kernel, as in its batch-invariant kernels; used on logits for sampling /
logprobs).

Semantics: x of shape [..., N] is flattened to [M, N]; for every row i

    out[i, j] = x[i, j] - max_k x[i, k] - log(sum_k exp(x[i, k] - max_k x[i, k]))

computed in float32, stored in the input dtype. The kernel runs one program
per row with a BLOCK_SIZE loop over the columns: a first pass keeps an online
(running) max and rescaled sum of exponentials in float32, a second pass
reloads x and writes x - max - log(sum).

Benchmark shape: x float16 [32, 128, 32000] (32 sequences x 128 positions
over a 32000-token vocabulary, Llama-2 size), about 262 MB of input.
BLOCK_SIZE is 1024, as in vLLM's wrapper.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

BATCH = 32
SEQ = 128
VOCAB = 32000
DTYPE = torch.float16
BLOCK_SIZE = 1024

SMALL_SHAPES = {"BATCH": 2, "SEQ": 3, "VOCAB": 2500}

TAGS = ("reduction", "memory-bound")


@triton.jit
def _log_softmax_kernel(
    x_ptr,
    out_ptr,
    x_row_stride,
    out_row_stride,
    n_cols,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    out_row = out_ptr + row * out_row_stride
    offs = tl.arange(0, BLOCK_SIZE)

    # pass 1: online max and sum of exp(x - max), float32
    m_i = tl.full([1], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([1], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_i, tl.max(x, axis=0))
        l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m_i = m_new
    lse = m_i + tl.log(l_i)

    # pass 2: write x - logsumexp
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        y = x - lse
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        n_rows, n_cols = x2.shape
        out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        _log_softmax_kernel[(n_rows,)](
            x2,
            out,
            x2.stride(0),
            out.stride(0),
            n_cols,
            BLOCK_SIZE=BLOCK_SIZE,
            num_warps=4,
        )
        return out.view(shape)


class Reference(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x.float(), dim=-1).to(x.dtype)


def get_inputs():
    # logits-like spread (std 3)
    x = (3.0 * torch.randn(BATCH, SEQ, VOCAB, dtype=torch.float32)).to(DTYPE)
    return [x]


def get_init_inputs():
    return []
