"""Row copies inside a cache, skipping the rows that stay where they are: cache[:, dst[i]] = cache[:, src[i]] for every
pair with src[i] != dst[i], every source read before any destination is written (a row may be both).

Beam search copies each member's GDN state and KV blocks from the beam it continues, every step. On real text most
members continue themselves, yet an index_select + index_copy moves every row. Here a pair whose
source is its destination costs one index load. Two launches: sources gathered into a buffer, then scattered, so
chains (a <- b <- c) read the old rows.
"""
import torch
import triton
import triton.language as tl

from kernels._common import cdiv, check, use_triton


def _validate(cache, src, dst):
    check(cache.dim() >= 2, f"cache must be [L, S, ...], got {tuple(cache.shape)}")
    check(src.dim() == 1 and src.shape == dst.shape,
          f"src and dst must be [P], got {tuple(src.shape)}, {tuple(dst.shape)}")
    check(not src.is_floating_point() and not dst.is_floating_point(), "src and dst must be integer indices")


def copy_rows_ref(cache, src, dst):
    """dst must not repeat (each row gets one source); returns cache, updated in place."""
    _validate(cache, src, dst)
    cache.index_copy_(1, dst, cache.index_select(1, src))
    return cache


@triton.jit
def _copy_rows_kernel(cache_ptr, tmp_ptr, src_ptr, dst_ptr, S, R, TO_BUFFER: tl.constexpr, BLOCK: tl.constexpr):
    """TO_BUFFER: the moved pairs' source rows -> the buffer; else the buffer -> their destination rows."""
    p = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    s = tl.load(src_ptr + p).to(tl.int64)
    d = tl.load(dst_ptr + p).to(tl.int64)
    if s != d:
        offs = tl.program_id(2).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < R
        buf = tmp_ptr + (p * tl.num_programs(1) + layer) * R + offs
        if TO_BUFFER:
            tl.store(buf, tl.load(cache_ptr + (layer * S + s) * R + offs, mask=mask), mask=mask)
        else:
            tl.store(cache_ptr + (layer * S + d) * R + offs, tl.load(buf, mask=mask), mask=mask)


def copy_rows_triton(cache, src, dst, block: int = 2048, num_warps: int = 4):
    _validate(cache, src, dst)
    check(cache.is_contiguous(), "cache must be contiguous")
    L, S, P = cache.shape[0], cache.shape[1], src.shape[0]
    R = cache[0, 0].numel()
    if P == 0 or R == 0:
        return cache
    # the buffer has a row for every pair; only the moved ones are written (and, the allocator's memory being
    # reused, only they cost bandwidth)
    tmp = torch.empty((P, L, R), dtype=cache.dtype, device=cache.device)
    grid = (P, L, cdiv(R, block))
    for to_buffer in (True, False):  # every source read (first launch) before any destination is written
        _copy_rows_kernel[grid](cache, tmp, src, dst, S, R, TO_BUFFER=to_buffer, BLOCK=block, num_warps=num_warps)
    return cache


def copy_rows(cache, src, dst, **launch):
    """cache [L, S, ...]: rows along dim 1 (GDN state slots, KV blocks); src, dst [P] device indices, dst without
    repeats. Updated in place and returned. `launch`: block, num_warps (Triton only)."""
    if use_triton(cache):
        return copy_rows_triton(cache, src, dst, **launch)
    return copy_rows_ref(cache, src, dst)
