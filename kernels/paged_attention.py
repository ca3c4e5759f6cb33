"""Decode attention over a paged KV cache (GQA), flash-decoding style, plus the cache writer.

Cache layout: k_cache, v_cache [num_blocks, block_size, Hkv, D]; token j of sequence b lives in block
block_tables[b, j // block_size] at offset j % block_size. Query head h reads kv head h // (Hq // Hkv).
context_lens[b] counts valid tokens including the current one (already stored); 0 marks a padding row (output 0).

The Triton path splits each sequence's context into partitions so that a single long sequence still spreads over
many SMs: pass 1 (one program per sequence x kv head x partition, all the group's query heads at once so K/V are read
once) writes a partial softmax state (max, sum, normalised output); pass 2 merges the partitions. When one partition
covers the whole context, pass 1 writes the output directly and pass 2 is skipped.

FP8 KV (engine option kv_cache_dtype "fp8"): the caches hold float8_e4m3fn and each (token, kv head) row its own
fp32 scale, `scales = (k_scale, v_scale)` [num_blocks, block_size, Hkv]: the writer quantizes each row as
kernels/fp8_quant quantizes a token (scale = amax / 448 of the row as the model dtype holds it, round to nearest
even), so K and V keep their per-head ranges and need no calibration; the reader takes the E4M3 values into the
query's dtype (exact) and applies the scales to the scores (K) and to the probabilities (V).
"""
import torch
import triton
import triton.language as tl

from kernels._common import (
    cast_rtne, cdiv, check, next_pow2, output, pdl_enter, pdl_launch, require_last_dim_contiguous, sm_count, use_triton)
from kernels.fp8_quant import quantize_rows_ref, round_to_e4m3
from kernels.quant_linear import FP8

LOG2E = 1.4426950408889634


def _validate_scales(k_cache, scales):
    """An FP8 cache comes with its (k_scale, v_scale) [num_blocks, block_size, Hkv] fp32; any other cache without."""
    if k_cache.dtype != FP8:
        check(scales is None, f"scales are for a float8_e4m3fn cache; this one is {k_cache.dtype}")
        return
    check(scales is not None and len(scales) == 2, "an FP8 cache needs scales=(k_scale, v_scale)")
    for name, t in zip(("k_scale", "v_scale"), scales):
        check(t.shape == k_cache.shape[:3] and t.dtype == torch.float32,
              f"{name} must be fp32 {tuple(k_cache.shape[:3])}, got {t.dtype} {tuple(t.shape)}")
        check(t.stride(-1) == 1, f"{name}: last dimension must be contiguous")


def quantize_kv_ref(x):
    """x [N, H, D] -> (float8_e4m3fn [N, H, D], scale fp32 [N, H]): each (token, head) row quantized as
    kernels/fp8_quant quantizes a token (its own amax / 448), as the FP8 cache stores it."""
    q, scale = quantize_rows_ref(x.reshape(-1, x.shape[-1]))
    return q.view(x.shape), scale.view(x.shape[:-1])


def dequantize_kv_ref(cache, scale, dtype):
    """[..., H, D] FP8 rows times their [..., H] scales, in `dtype`."""
    return (cache.float() * scale[..., None]).to(dtype)


@triton.jit
def store_kv_row(ptr, scale_ptr, x, mask, FP8_CACHE: tl.constexpr):
    """Write one (token, head) row x (fp32, already rounded to the model dtype) to the cache at ptr: as the cache's
    dtype, or FP8 with its scale at scale_ptr (a masked-off row writes nothing)."""
    if FP8_CACHE:
        scale = tl.maximum(tl.max(tl.where(mask, tl.abs(x), 0.0), axis=0), 1e-12) / 448.0
        q = tl.minimum(tl.maximum(tl.div_rn(x, scale), -448.0), 448.0)
        tl.store(ptr, round_to_e4m3(q).to(ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr, scale, mask=tl.max(mask.to(tl.int32), axis=0) > 0)
    else:
        tl.store(ptr, cast_rtne(x, ptr.dtype.element_ty), mask=mask)


def _validate(q, k_cache, v_cache, block_tables, context_lens, scales=None):
    check(q.dim() == 3, f"q must be [B, Hq, D], got {tuple(q.shape)}")
    B, Hq, D = q.shape
    check(k_cache.dim() == 4 and k_cache.shape == v_cache.shape,
          f"k_cache, v_cache must be equal [num_blocks, block_size, Hkv, D], got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    Hkv = k_cache.shape[2]
    check(k_cache.shape[3] == D, f"cache head dim {k_cache.shape[3]} != q head dim {D}")
    check(Hq % Hkv == 0, f"query heads ({Hq}) must be a multiple of kv heads ({Hkv})")
    check(k_cache.dtype == v_cache.dtype and (q.dtype == k_cache.dtype or k_cache.dtype == FP8),
          f"q/k_cache/v_cache dtypes differ: {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    check(block_tables.dim() == 2 and block_tables.shape[0] == B and not block_tables.is_floating_point(),
          f"block_tables must be an integer [B={B}, max_blocks_per_seq] tensor, got {block_tables.dtype} {tuple(block_tables.shape)}")
    check(context_lens.shape == (B,) and not context_lens.is_floating_point(),
          f"context_lens must be an integer tensor of shape [B={B}], got {context_lens.dtype} {tuple(context_lens.shape)}")
    _validate_scales(k_cache, scales)


def gather_kv_ref(cache, block_table_row, n):
    """The first n tokens of one sequence from a paged cache -> [n, Hkv, D]."""
    j = torch.arange(n, device=cache.device)
    return cache[block_table_row[j // cache.shape[1]].long(), j % cache.shape[1]]


def paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale, out=None, scales=None):
    _validate(q, k_cache, v_cache, block_tables, context_lens, scales)
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    block_size = k_cache.shape[1]
    n_max = block_tables.shape[1] * block_size
    # Gather every sequence to the table's full capacity and mask past context_len (no host sync on lengths).
    j = torch.arange(n_max, device=q.device)
    # Table entries past a sequence's length may hold anything (e.g. -1): clamp so the gather stays in bounds.
    blocks = block_tables.long()[:, j // block_size].clamp(0, k_cache.shape[0] - 1)  # [B, n_max]
    k = k_cache[blocks, j % block_size].float()  # [B, n_max, Hkv, D]
    v = v_cache[blocks, j % block_size].float()
    if scales is not None:  # FP8 rows times their scales
        k = k * scales[0][blocks, j % block_size][..., None]
        v = v * scales[1][blocks, j % block_size][..., None]
    k = k.repeat_interleave(Hq // Hkv, dim=2)
    v = v.repeat_interleave(Hq // Hkv, dim=2)
    scores = torch.einsum("bhd,bnhd->bhn", q.float(), k) * scale
    valid = j[None, :] < context_lens[:, None].long()  # [B, n_max]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-masked (padding) rows -> 0
    out = output(out, q.shape, q.dtype, q.device)
    out.copy_(torch.einsum("bhn,bnhd->bhd", probs, v))
    return out


@triton.jit
def _paged_decode_partition_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr,
    qk_scale, M_TILES,
    sq_b, sq_h, sk_blk, sk_off, sk_h, sv_blk, sv_off, sv_h, ss_blk, ss_off, sbt_b,
    so_b, so_h, so_p, sml_b, sml_h,
    D: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PARTITION: tl.constexpr,
    SINGLE: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, PDL: tl.constexpr,
    FP8_CACHE: tl.constexpr,
):
    # One program = (sequence x tile of its query rows, kv head, partition). A sequence owns ROWS consecutive query
    # rows (1 when decoding, the block when verifying) that share its block table; the program's tile holds
    # BLOCK_M of the sequence's ROWS x GROUP (row, query head) pairs, so each K/V tile it loads serves all of them.
    pdl_enter(PDL)
    b = tl.program_id(0) // M_TILES
    hk = tl.program_id(1)
    p = tl.program_id(2)
    if ROWS == 1:  # decoding: one row, its group's heads (kept apart: per-row masks cost registers)
        offs_m = tl.arange(0, BLOCK_M)
        mask_m = offs_m < GROUP
        rows = b + tl.zeros([BLOCK_M], tl.int32)
        heads = hk * GROUP + offs_m
        ctx = tl.load(lens_ptr + b)
        end = tl.minimum(p * PARTITION + PARTITION, ctx)
    else:
        offs_m = (tl.program_id(0) % M_TILES) * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < ROWS * GROUP
        rows = b * ROWS + offs_m // GROUP  # each pair's query row
        heads = hk * GROUP + offs_m % GROUP
        ctx_m = tl.load(lens_ptr + rows, mask=mask_m, other=0)  # per row: keys past it are masked
        end = tl.minimum(p * PARTITION + PARTITION, tl.max(ctx_m, axis=0))
    start = p * PARTITION

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    q = tl.load(q_ptr + rows[:, None] * sq_b + heads[:, None] * sq_h + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    if UPCAST_DOT:  # the CPU interpreter multiplies bf16 tiles as raw integers: feed it fp32
        q = q.to(tl.float32)
    table = bt_ptr + (b * ROWS).to(tl.int64) * sbt_b  # the sequence's block table (its first row's)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        blk = tl.load(table + offs_n // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
        off = offs_n % BLOCK_SIZE
        mask_kv = mask_n[:, None] & mask_d[None, :]
        # Issue both loads before any math: the loop is not software-pipelined, so this doubles the bytes in flight.
        k = tl.load(k_ptr + blk[:, None] * sk_blk + off[:, None] * sk_off + hk * sk_h + offs_d[None, :], mask=mask_kv, other=0.0)
        v = tl.load(v_ptr + blk[:, None] * sv_blk + off[:, None] * sv_off + hk * sv_h + offs_d[None, :], mask=mask_kv, other=0.0)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        elif FP8_CACHE:
            k = k.to(q.dtype)  # E4M3 values are exact in bf16 / fp16
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
        if FP8_CACHE:  # each key's scale on its scores; each value's on its probabilities below
            row_s = blk * ss_blk + off * ss_off + hk
            s = s * tl.load(ks_ptr + row_s, mask=mask_n, other=0.0)[None, :]
            v_scale = tl.load(vs_ptr + row_s, mask=mask_n, other=0.0)
        if ROWS == 1:
            s = tl.where(mask_n[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = m_new
        else:
            s = tl.where(offs_n[None, :] < ctx_m[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # a row with no key yet: nothing to rescale
        alpha = tl.exp2(m_i - m_safe)
        prob = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(prob, axis=1)
        if FP8_CACHE:
            prob = prob * v_scale[None, :]
            v = v.to(q.dtype)
        prob = cast_rtne(prob, v.dtype)  # P @ V runs in the cache dtype (FP8: the query's), as on tensor cores
        if UPCAST_DOT:
            prob = prob.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(prob, v, input_precision=DOT_PRECISION)
        m_i = m_new

    # Empty partition (or padding row): l_i == 0 -> output 0, and pass 2 gives it zero weight.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    mask_out = mask_m[:, None] & mask_d[None, :]
    if SINGLE:
        tl.store(out_ptr + rows[:, None] * so_b + heads[:, None] * so_h + offs_d[None, :],
                 cast_rtne(out, out_ptr.dtype.element_ty), mask=mask_out)
    else:
        tl.store(out_ptr + rows[:, None] * so_b + heads[:, None] * so_h + p * so_p + offs_d[None, :], out,
                 mask=mask_out)
        tl.store(m_ptr + rows * sml_b + heads * sml_h + p, m_i, mask=mask_m)
        tl.store(l_ptr + rows * sml_b + heads * sml_h + p, l_i, mask=mask_m)


@triton.jit
def _paged_decode_reduce_kernel(
    part_ptr, m_ptr, l_ptr, out_ptr,
    num_parts,
    sp_b, sp_h, sp_p, sml_b, sml_h, so_b, so_h,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    ml_base = b * sml_b + h * sml_h

    m_run = tl.full([BLOCK_P], float("-inf"), tl.float32)
    for p0 in range(0, num_parts, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        m_run = tl.maximum(m_run, tl.load(m_ptr + ml_base + offs_p, mask=offs_p < num_parts, other=float("-inf")))
    m_all = tl.maximum(tl.max(m_run, axis=0), -1e30)  # finite even for padding rows, so exp2(m - m_all) is never NaN

    num = tl.zeros([BLOCK_P, BLOCK_D], tl.float32)
    den = tl.zeros([BLOCK_P], tl.float32)
    for p0 in range(0, num_parts, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        mask_p = offs_p < num_parts
        m = tl.load(m_ptr + ml_base + offs_p, mask=mask_p, other=float("-inf"))
        l = tl.load(l_ptr + ml_base + offs_p, mask=mask_p, other=0.0)
        w = tl.where(l > 0, l * tl.exp2(m - m_all), 0.0)
        part = tl.load(part_ptr + b * sp_b + h * sp_h + offs_p[:, None] * sp_p + offs_d[None, :],
                       mask=mask_p[:, None] & mask_d[None, :], other=0.0)
        num += w[:, None] * part
        den += w
    total = tl.sum(den, axis=0)
    out = tl.sum(num, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * so_b + h * so_h + offs_d, cast_rtne(out, out_ptr.dtype.element_ty), mask=mask_d)


def pick_partition_size(batch: int, kv_heads: int, max_len: int, block_n: int, sm_count: int) -> int:
    """One partition (no reduce pass) once batch x kv heads alone fills the SMs; otherwise a power-of-two partition
    (>= 2*block_n) giving about two programs per SM."""
    if batch * kv_heads >= sm_count:
        return max(next_pow2(max_len), 2 * block_n)
    parts_wanted = cdiv(2 * sm_count, batch * kv_heads)
    part = next_pow2(cdiv(max_len, parts_wanted))
    return max(part, 2 * block_n)


def block_m(rows_per_seq: int, group: int, max_rows: int = 64) -> int:
    """(query row, head) pairs per program, at least 16 (tl.dot's smallest side): decoding (one row), the whole
    group, as the decode kernel always held it; a block, all of a sequence's pairs up to max_rows."""
    if rows_per_seq == 1:
        return max(16, next_pow2(group))
    return max(16, min(next_pow2(rows_per_seq * group), max_rows))


def paged_decode_attention_triton(q, k_cache, v_cache, block_tables, context_lens, scale, out=None,
                                  max_context_len=None, partition_size=None, block_n=None, num_warps=None,
                                  num_stages=None, pdl=False, rows_per_seq=1, max_tile_rows=None, scales=None):
    """max_context_len: host-known bound on context_lens (default: the block table's capacity); it only sizes the
    launch grid. partition_size must be a multiple of block_n. pdl: programmatic dependent launch, both passes.
    rows_per_seq: q's rows come in runs of this many per sequence (a speculative block), each run using its first
    row's block table; one program serves up to max_tile_rows (row, query head) pairs of a run (default 64 for
    head_dim <= 128, else 32: at head_dim 256 a 32-pair tile takes 128 registers at 8 warps, a 64-pair one 193, see
    kernels/compile_check.py), so a run's K/V are read cdiv(rows x group, tile) times, not rows times.
    num_warps default: 4, or 8 for tiles of >= 8192 (pair, dim) elements. scales: an FP8 cache's (module docstring)."""
    _validate(q, k_cache, v_cache, block_tables, context_lens, scales)
    pdl_args = pdl_launch(pdl)
    require_last_dim_contiguous("q", q)
    require_last_dim_contiguous("k_cache", k_cache)
    require_last_dim_contiguous("v_cache", v_cache)
    B, Hq, D = q.shape
    check(rows_per_seq >= 1 and B % rows_per_seq == 0, f"q's {B} rows must be runs of rows_per_seq={rows_per_seq}")
    S = B // rows_per_seq
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    group = Hq // Hkv
    BLOCK_D = max(16, next_pow2(D))
    BLOCK_M = block_m(rows_per_seq, group, max_tile_rows or (64 if BLOCK_D <= 128 else 32))
    m_tiles = cdiv(rows_per_seq * group, BLOCK_M)
    max_len = max_context_len or block_tables.shape[1] * block_size
    BLOCK_N = block_n or (32 if BLOCK_D >= 256 else 64)  # D=256: 32 keeps 4 warps at ~245 registers, no spills
    part = partition_size or pick_partition_size(S * m_tiles, Hkv, max_len, BLOCK_N, sm_count(q.device))
    check(part % BLOCK_N == 0 and BLOCK_N >= 16, f"partition_size ({part}) must be a multiple of block_n ({BLOCK_N}) >= 16")
    num_parts = max(1, cdiv(max_len, part))
    single = num_parts == 1
    out = output(out, q.shape, q.dtype, q.device)
    require_last_dim_contiguous("out", out)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if single:
        part_out, m, l = out, out, out
        so = (out.stride(0), out.stride(1), 0)
        sml = (0, 0)
    else:
        part_out = torch.empty(B, Hq, num_parts, D, dtype=torch.float32, device=q.device)
        m = torch.empty(B, Hq, num_parts, dtype=torch.float32, device=q.device)
        l = torch.empty_like(m)
        so = part_out.stride()[:3]
        sml = m.stride()[:2]
    ks, vs = scales if scales is not None else (q, q)
    _paged_decode_partition_kernel[(S * m_tiles, Hkv, num_parts)](
        q, k_cache, v_cache, ks, vs, block_tables, context_lens, part_out, m, l,
        scale * LOG2E, m_tiles,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
        *(ks.stride()[:2] if scales is not None else (0, 0)), block_tables.stride(0),
        *so, *sml,
        D=D, BLOCK_D=BLOCK_D, GROUP=group, ROWS=rows_per_seq, BLOCK_M=BLOCK_M, BLOCK_SIZE=block_size,
        BLOCK_N=BLOCK_N, PARTITION=part, SINGLE=single, DOT_PRECISION=precision, UPCAST_DOT=not q.is_cuda,
        FP8_CACHE=scales is not None, **pdl_args, num_warps=num_warps or (8 if BLOCK_M * BLOCK_D >= 8192 else 4), num_stages=num_stages or 2,
    )
    if not single:
        _paged_decode_reduce_kernel[(B, Hq)](
            part_out, m, l, out, num_parts,
            *part_out.stride()[:3], *m.stride()[:2], out.stride(0), out.stride(1),
            D=D, BLOCK_D=BLOCK_D, BLOCK_P=min(16, next_pow2(num_parts)), **pdl_args,
            num_warps=4,
        )
    return out


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, out=None, scales=None, **launch):
    """o [B, Hq, D] (q.dtype, written to `out` if given). Each row attends to its own first context_lens[b] keys.
    `launch` (Triton only): max_context_len, partition_size, block_n, num_warps, num_stages, pdl, rows_per_seq
    (runs of rows sharing one sequence's block table read its K/V together), max_tile_rows. scales: an FP8 cache's
    (k_scale, v_scale)."""
    if use_triton(q):
        return paged_decode_attention_triton(q, k_cache, v_cache, block_tables, context_lens, scale, out,
                                             scales=scales, **launch)
    return paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale, out, scales)


# ----------------------------------------------------------------------------------------------- cache writer

def _validate_store(k, v, k_cache, v_cache, slot_mapping, scales=None):
    check(k.dim() == 3 and k.shape == v.shape, f"k, v must be equal [N, Hkv, D], got {tuple(k.shape)}, {tuple(v.shape)}")
    check(k_cache.dim() == 4 and k_cache.shape == v_cache.shape and k_cache.shape[2:] == k.shape[1:],
          f"caches must be [num_blocks, block_size, {k.shape[1]}, {k.shape[2]}], got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    check(slot_mapping.shape == (k.shape[0],) and not slot_mapping.is_floating_point(),
          f"slot_mapping must be an integer tensor of shape [N={k.shape[0]}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    _validate_scales(k_cache, scales)


def store_kvcache_ref(k, v, k_cache, v_cache, slot_mapping, scales=None):
    _validate_store(k, v, k_cache, v_cache, slot_mapping, scales)
    live = slot_mapping >= 0
    slots = slot_mapping[live].long()
    bs = k_cache.shape[1]
    at = (slots // bs, slots % bs)
    for x, cache, i in ((k, k_cache, 0), (v, v_cache, 1)):
        if scales is None:
            cache[at] = x[live].to(cache.dtype)
        else:
            cache[at], scales[i][at] = quantize_kv_ref(x[live])


@triton.jit
def _store_kvcache_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, slot_ptr,
    block_size,
    sk_n, sk_h, sv_n, sv_h, skc_blk, skc_off, skc_h, svc_blk, svc_off, svc_h, ss_blk, ss_off,
    D: tl.constexpr, BLOCK_D: tl.constexpr, FP8_CACHE: tl.constexpr,
):
    # One program = (token, kv head): an FP8 row's scale needs the whole row.
    n = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + n).to(tl.int64)
    blk = tl.maximum(slot, 0) // block_size
    off = tl.maximum(slot, 0) % block_size
    offs_d = tl.arange(0, BLOCK_D)
    mask = offs_d < D
    store_mask = mask & (slot >= 0)
    k = tl.load(k_ptr + n * sk_n + h * sk_h + offs_d, mask=mask, other=0.0).to(tl.float32)
    store_kv_row(kc_ptr + blk * skc_blk + off * skc_off + h * skc_h + offs_d, ks_ptr + blk * ss_blk + off * ss_off + h,
                 k, store_mask, FP8_CACHE)
    v = tl.load(v_ptr + n * sv_n + h * sv_h + offs_d, mask=mask, other=0.0).to(tl.float32)
    store_kv_row(vc_ptr + blk * svc_blk + off * svc_off + h * svc_h + offs_d, vs_ptr + blk * ss_blk + off * ss_off + h,
                 v, store_mask, FP8_CACHE)


def store_kvcache_triton(k, v, k_cache, v_cache, slot_mapping, scales=None):
    _validate_store(k, v, k_cache, v_cache, slot_mapping, scales)
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        require_last_dim_contiguous(name, t)
    N, H, D = k.shape
    if N == 0:
        return
    ks, vs = scales if scales is not None else (k, k)
    _store_kvcache_kernel[(N, H)](
        k, v, k_cache, v_cache, ks, vs, slot_mapping, k_cache.shape[1],
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], *(ks.stride()[:2] if scales is not None else (0, 0)),
        D=D, BLOCK_D=next_pow2(D), FP8_CACHE=scales is not None, num_warps=2 if D <= 256 else 4,
    )


def store_kvcache(k, v, k_cache, v_cache, slot_mapping, scales=None):
    """Write k, v [N, Hkv, D] into the caches at flat slots (block * block_size + offset); slot < 0 is skipped.
    scales: an FP8 cache's (k_scale, v_scale), written with its rows (module docstring)."""
    if use_triton(k):
        return store_kvcache_triton(k, v, k_cache, v_cache, slot_mapping, scales)
    return store_kvcache_ref(k, v, k_cache, v_cache, slot_mapping, scales)
