"""Write new keys/values into the paged KV cache, FlashAttention cache layout
(vLLM's Triton reshape_and_cache_flash, "auto" kv-cache dtype: the cache has
the key/value dtype, no fp8 quantization).

Inputs: key, value [T, Hk, D]; key_cache, value_cache
[num_blocks, block_size, Hk, D]; slot_mapping int64 [T]. For every token t
with slot = slot_mapping[t] >= 0:

    key_cache[slot // block_size, slot % block_size, :, :]   = key[t]
    value_cache[slot // block_size, slot % block_size, :, :] = value[t]

Tokens with slot -1 (padding) are skipped. The caches are updated in place and
returned as (key_cache, value_cache). The kernel runs a 2-D grid: one program
per (token, tile of Hk*D elements), TILE_SIZE a power of two (at most 2048)
covering the flattened head x head-dim row of a token; it reads the slot,
returns early on -1, and copies the tile of key and of value.

Benchmark shape (AKG's benchmark for this op): T = 42 tokens, Hk = 8 KV heads,
D = 64, num_blocks = 1024, block_size = 16, bfloat16. slot_mapping is a
random subset of distinct slots (a valid mapping never writes one slot twice)
with about 1/8 of the entries set to -1.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

NUM_TOKENS = 42
NUM_KV_HEADS = 8
HEAD_SIZE = 64
NUM_BLOCKS = 1024
BLOCK_SIZE = 16
DTYPE = torch.bfloat16

SMALL_SHAPES = {
    "NUM_TOKENS": 11,
    "NUM_KV_HEADS": 3,
    "HEAD_SIZE": 40,
    "NUM_BLOCKS": 7,
    "BLOCK_SIZE": 5,
}

INPLACE_ARGS = (2, 3)
TAGS = ("cache", "index", "memory-bound")


@triton.jit
def _reshape_and_cache_flash_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    key_stride_t,
    value_stride_t,
    kc_block_stride,
    kc_page_stride,
    vc_block_stride,
    vc_page_stride,
    n_elems,  # num_kv_heads * head_size
    block_size,
    TILE_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return

    block_idx = slot // block_size
    block_off = slot % block_size

    offs = tile * TILE_SIZE + tl.arange(0, TILE_SIZE)
    mask = offs < n_elems

    k = tl.load(key_ptr + token * key_stride_t + offs, mask=mask)
    tl.store(
        key_cache_ptr + block_idx * kc_block_stride + block_off * kc_page_stride + offs,
        k,
        mask=mask,
    )
    v = tl.load(value_ptr + token * value_stride_t + offs, mask=mask)
    tl.store(
        value_cache_ptr + block_idx * vc_block_stride + block_off * vc_page_stride + offs,
        v,
        mask=mask,
    )


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, key, value, key_cache, value_cache, slot_mapping):
        num_tokens, num_heads, head_size = key.shape
        block_size = key_cache.shape[1]
        n_elems = num_heads * head_size
        # the (head, dim) row of a token and of a cache slot must be contiguous
        assert key.stride(2) == 1 and key.stride(1) == head_size
        assert value.stride(2) == 1 and value.stride(1) == head_size
        assert key_cache.stride(3) == 1 and key_cache.stride(2) == head_size
        assert value_cache.stride(3) == 1 and value_cache.stride(2) == head_size
        tile_size = min(2048, triton.next_power_of_2(n_elems))
        grid = (num_tokens, triton.cdiv(n_elems, tile_size))
        _reshape_and_cache_flash_kernel[grid](
            key,
            value,
            key_cache,
            value_cache,
            slot_mapping,
            key.stride(0),
            value.stride(0),
            key_cache.stride(0),
            key_cache.stride(1),
            value_cache.stride(0),
            value_cache.stride(1),
            n_elems,
            block_size,
            TILE_SIZE=tile_size,
            num_warps=4,
        )
        return key_cache, value_cache


class Reference(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, key, value, key_cache, value_cache, slot_mapping):
        block_size = key_cache.shape[1]
        valid = slot_mapping >= 0
        slots = slot_mapping[valid]
        blk = slots // block_size
        off = slots % block_size
        key_cache[blk, off] = key[valid]
        value_cache[blk, off] = value[valid]
        return key_cache, value_cache


def get_inputs():
    T, H, D = NUM_TOKENS, NUM_KV_HEADS, HEAD_SIZE
    key = torch.randn(T, H, D, dtype=torch.float32).to(DTYPE)
    value = torch.randn(T, H, D, dtype=torch.float32).to(DTYPE)
    key_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, H, D, dtype=torch.float32).to(DTYPE)
    value_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, H, D, dtype=torch.float32).to(DTYPE)
    num_slots = NUM_BLOCKS * BLOCK_SIZE
    assert T <= num_slots
    slot_mapping = torch.randperm(num_slots)[:T].to(torch.int64)
    # padding tokens: about 1/8 of them (at least one) skip the write
    skip = torch.randperm(T)[: max(1, T // 8)]
    slot_mapping[skip] = -1
    return [key, value, key_cache, value_cache, slot_mapping]


def get_init_inputs():
    return []
