"""SGLang `compute_position` (Triton path `compute_position_triton` / `compute_position_kernel`
of ForwardBatch for extend/prefill batches): token positions and per-request start offsets.

Inputs: extend_prefix_lens int32 [B] (tokens already cached per request), extend_seq_lens
int32 [B] (new tokens per request, >= 1), extend_seq_lens_sum (their total, known on the host).
Outputs:
  positions        int64 [sum extend_seq_lens]:  positions[start_i + j] = prefix_len_i + j,
                   j < extend_len_i  (the new tokens' absolute positions, requests concatenated)
  extend_start_loc int32 [B]:  start_i = sum_{r < i} extend_len_r (exclusive cumsum)

One program per request (BLOCK_SIZE=512 chunks, masked tail).  Like the original, each
program recomputes its own start by summing extend_seq_lens[0:pid] in a scalar loop (no
cross-program communication); HAS_PREFIX is a constexpr that is False when extend_prefix_lens
is empty (no prefix cache), in which case positions start at 0.

Benchmark: a prefill batch of B=128 requests, extend lengths uniform in [1, 512], cached
prefix lengths uniform in [0, 4096].
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

BATCH = 128
MAX_EXTEND_LEN = 512
MAX_PREFIX_LEN = 4096

SMALL_SHAPES = {"BATCH": 7, "MAX_EXTEND_LEN": 1100, "MAX_PREFIX_LEN": 300}
TAGS = ("index", "memory-bound")


@triton.jit
def compute_position_kernel(
    positions_ptr,
    extend_start_loc_ptr,
    extend_prefix_lens_ptr,
    extend_seq_lens_ptr,
    HAS_PREFIX: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)

    prefix_len = 0
    if HAS_PREFIX:
        prefix_len = tl.load(extend_prefix_lens_ptr + pid).to(tl.int64)
    seq_len = tl.load(extend_seq_lens_ptr + pid)

    start = tl.zeros((), dtype=tl.int64)
    for i in range(pid):
        start += tl.load(extend_seq_lens_ptr + i).to(tl.int64)

    num_loop = tl.cdiv(seq_len, BLOCK_SIZE)
    for i in range(num_loop):
        offs = i * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        tl.store(
            positions_ptr + start + offs,
            prefix_len + offs.to(tl.int64),
            mask=offs < seq_len,
        )
    tl.store(extend_start_loc_ptr + pid, start.to(tl.int32))


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, extend_prefix_lens, extend_seq_lens, extend_seq_lens_sum):
        batch_size = extend_seq_lens.shape[0]
        has_prefix = extend_prefix_lens.shape[0] == batch_size
        positions = torch.empty(extend_seq_lens_sum, dtype=torch.int64,
                                device=extend_seq_lens.device)
        extend_start_loc = torch.empty(batch_size, dtype=torch.int32,
                                       device=extend_seq_lens.device)
        compute_position_kernel[(batch_size,)](
            positions,
            extend_start_loc,
            extend_prefix_lens,
            extend_seq_lens,
            HAS_PREFIX=has_prefix,
            BLOCK_SIZE=512,
        )
        return positions, extend_start_loc


class Reference(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, extend_prefix_lens, extend_seq_lens, extend_seq_lens_sum):
        batch_size = extend_seq_lens.shape[0]
        lens = extend_seq_lens.long()
        if extend_prefix_lens.shape[0] == batch_size:
            prefix = extend_prefix_lens.long()
        else:
            prefix = torch.zeros_like(lens)
        start = torch.cumsum(lens, 0) - lens
        token_req = torch.repeat_interleave(
            torch.arange(batch_size, device=lens.device), lens, output_size=extend_seq_lens_sum
        )
        token_idx = torch.arange(extend_seq_lens_sum, device=lens.device)
        positions = prefix[token_req] + (token_idx - start[token_req])
        return positions, start.to(torch.int32)


def get_inputs():
    extend_prefix_lens = torch.randint(0, MAX_PREFIX_LEN + 1, (BATCH,), dtype=torch.int32)
    extend_seq_lens = torch.randint(1, MAX_EXTEND_LEN + 1, (BATCH,), dtype=torch.int32)
    extend_seq_lens_sum = int(extend_seq_lens.sum())
    return [extend_prefix_lens, extend_seq_lens, extend_seq_lens_sum]


def get_init_inputs():
    return []
