"""Decode-time attention inputs in one launch: from the fused qkv projection output
    qkv [N, nh*2*hd + 2*nkv*hd]   (per query head [q_h | gate_h], then k, then v)
compute q = rope(rmsnorm(q_h) * (1 + q_norm_w)) -> q_out [N, nh, hd], k likewise with k_norm_w, and write k and v
straight into the paged caches at slot_mapping[n] (slot < 0: padding, nothing stored). The output gate stays a view
of qkv. Replaces the q/k norm + rotary glue, its copies and store_kvcache (1 kernel instead of 2-4 per layer).

Rotary: rotate-half pairing on the first rd = cos.shape[-1] dims, the rest passed through. Rounding: the normalised
value is rounded to qkv.dtype (as the zero-centred RMSNorm returns it), the rotation is done in fp32 and rounded once.
"""
import torch
import triton
import triton.language as tl

from kernels._common import (
    cast_rtne, check, next_pow2, output, pdl_enter, pdl_launch, require_last_dim_contiguous, use_triton)
from kernels.paged_attention import _validate_scales, store_kv_row, store_kvcache_ref
from kernels.rmsnorm import rmsnorm_ref


def _validate(qkv, q_norm_w, k_norm_w, cos, sin, nh, nkv, hd, k_cache, v_cache, slot_mapping):
    check(qkv.dim() == 2 and qkv.shape[1] == (2 * nh + 2 * nkv) * hd,
          f"qkv must be [N, (2*nh + 2*nkv)*hd] = [N, {(2 * nh + 2 * nkv) * hd}], got {tuple(qkv.shape)}")
    N = qkv.shape[0]
    check(q_norm_w.shape == (hd,) and k_norm_w.shape == (hd,),
          f"q/k norm weights must be [hd={hd}], got {tuple(q_norm_w.shape)}, {tuple(k_norm_w.shape)}")
    check(cos.dim() == 2 and cos.shape == sin.shape and cos.shape[0] == N and cos.shape[1] % 2 == 0
          and cos.shape[1] <= hd, f"cos, sin must be equal [N={N}, even rd <= {hd}], got {tuple(cos.shape)}, "
          f"{tuple(sin.shape)}")
    check(k_cache.dim() == 4 and k_cache.shape == v_cache.shape and k_cache.shape[2:] == (nkv, hd),
          f"caches must be [num_blocks, block_size, {nkv}, {hd}], got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    check(slot_mapping.shape == (N,) and not slot_mapping.is_floating_point(),
          f"slot_mapping must be an integer tensor of shape [N={N}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")


def _rotate(x, cos, sin):
    rd = cos.shape[-1]
    xr = x[..., :rd].float()
    rotated = torch.cat([-xr[..., rd // 2:], xr[..., :rd // 2]], dim=-1)
    out = (xr * cos[:, None, :].float() + rotated * sin[:, None, :].float()).to(x.dtype)
    return torch.cat([out, x[..., rd:]], dim=-1)


def fused_attn_decode_inputs_ref(qkv, q_norm_w, k_norm_w, cos, sin, eps, nh, nkv, hd, k_cache, v_cache,
                                 slot_mapping, out=None, scales=None):
    """The reference ops in sequence: per-head rmsnorm_ref, rotary, store_kvcache_ref. Returns q [N, nh, hd]."""
    _validate(qkv, q_norm_w, k_norm_w, cos, sin, nh, nkv, hd, k_cache, v_cache, slot_mapping)
    _validate_scales(k_cache, scales)
    N = qkv.shape[0]
    qg, k, v = qkv.split([nh * 2 * hd, nkv * hd, nkv * hd], dim=-1)
    q = _rotate(rmsnorm_ref(qg.reshape(N, nh, 2 * hd)[..., :hd], q_norm_w, eps), cos, sin)
    k = _rotate(rmsnorm_ref(k.reshape(N, nkv, hd), k_norm_w, eps), cos, sin)
    store_kvcache_ref(k, v.reshape(N, nkv, hd), k_cache, v_cache, slot_mapping, scales)
    out = output(out, (N, nh, hd), qkv.dtype, qkv.device)
    out.copy_(q)
    return out


@triton.jit
def _fused_attn_inputs_kernel(
    qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, slot_ptr,
    block_size, eps,
    s_qkv, s_cos, s_sin, sq_n, sq_h, skc_blk, skc_off, skc_h, svc_blk, svc_off, svc_h, ss_blk, ss_off,
    NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, RD: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr, FP8_CACHE: tl.constexpr,
):
    pdl_enter(PDL)
    # One program = (token, head); heads [0, NH) are query heads, [NH, NH + NKV) key/value heads.
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    is_q = h < NH
    is_kv = h >= NH
    kh = h - NH
    col = tl.where(is_q, h * 2 * HD, 2 * NH * HD + kh * HD)  # first column of this head's q or k
    offs = tl.arange(0, BLOCK_D)
    mask = offs < HD
    half: tl.constexpr = RD // 2
    rot = offs < RD
    partner = tl.where(offs < half, offs + half, offs - half)  # rotate-half partner within the rotary dims
    sign = tl.where(offs < half, -1.0, 1.0)

    row = qkv_ptr + n * s_qkv + col
    x = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(row + partner, mask=mask & rot, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / HD + eps)
    # the q or k norm weight: two masked loads rather than a select between pointers
    w = (tl.load(qw_ptr + offs, mask=mask & is_q, other=0.0).to(tl.float32)
         + tl.load(kw_ptr + offs, mask=mask & is_kv, other=0.0).to(tl.float32))
    wp = (tl.load(qw_ptr + partner, mask=mask & rot & is_q, other=0.0).to(tl.float32)
          + tl.load(kw_ptr + partner, mask=mask & rot & is_kv, other=0.0).to(tl.float32))
    dt = qkv_ptr.dtype.element_ty
    xn = cast_rtne(x * rstd * (1.0 + w), dt).to(tl.float32)
    xpn = cast_rtne(xp * rstd * (1.0 + wp), dt).to(tl.float32)
    c = tl.load(cos_ptr + n * s_cos + offs, mask=rot, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + n * s_sin + offs, mask=rot, other=0.0).to(tl.float32)
    y = tl.where(rot, xn * c + sign * xpn * s, xn)

    if is_q:
        tl.store(q_ptr + n * sq_n + h * sq_h + offs, cast_rtne(y, q_ptr.dtype.element_ty), mask=mask)
    else:
        slot = tl.load(slot_ptr + n).to(tl.int64)
        blk = tl.maximum(slot, 0) // block_size
        off = tl.maximum(slot, 0) % block_size
        store = mask & (slot >= 0)
        row_s = blk * ss_blk + off * ss_off + kh
        # k as the model dtype holds it (what store_kvcache would be given), then in the cache's format
        store_kv_row(kc_ptr + blk * skc_blk + off * skc_off + kh * skc_h + offs, ks_ptr + row_s,
                     cast_rtne(y, dt).to(tl.float32), store, FP8_CACHE)
        v = tl.load(qkv_ptr + n * s_qkv + 2 * NH * HD + NKV * HD + kh * HD + offs, mask=mask, other=0.0)
        store_kv_row(vc_ptr + blk * svc_blk + off * svc_off + kh * svc_h + offs, vs_ptr + row_s, v.to(tl.float32),
                     store, FP8_CACHE)


def fused_attn_decode_inputs_triton(qkv, q_norm_w, k_norm_w, cos, sin, eps, nh, nkv, hd, k_cache, v_cache,
                                    slot_mapping, out=None, num_warps=None, pdl=False, scales=None):
    _validate(qkv, q_norm_w, k_norm_w, cos, sin, nh, nkv, hd, k_cache, v_cache, slot_mapping)
    _validate_scales(k_cache, scales)
    pdl_args = pdl_launch(pdl)
    for name, t in (("qkv", qkv), ("cos", cos), ("sin", sin), ("q_norm_w", q_norm_w), ("k_norm_w", k_norm_w),
                    ("k_cache", k_cache), ("v_cache", v_cache)):
        require_last_dim_contiguous(name, t)
    N = qkv.shape[0]
    q = output(out, (N, nh, hd), qkv.dtype, qkv.device)
    require_last_dim_contiguous("out", q)
    if N == 0:
        return q
    ks, vs = scales if scales is not None else (q, q)
    _fused_attn_inputs_kernel[(N, nh + nkv)](
        qkv, q_norm_w, k_norm_w, cos, sin, q, k_cache, v_cache, ks, vs, slot_mapping,
        k_cache.shape[1], float(eps),
        qkv.stride(0), cos.stride(0), sin.stride(0), q.stride(0), q.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], *(ks.stride()[:2] if scales is not None else (0, 0)),
        NH=nh, NKV=nkv, HD=hd, RD=cos.shape[1], BLOCK_D=next_pow2(hd), **pdl_args, FP8_CACHE=scales is not None,
        num_warps=num_warps or 4,
    )
    return q


def fused_attn_decode_inputs(qkv, q_norm_w, k_norm_w, cos, sin, eps, nh, nkv, hd, k_cache, v_cache, slot_mapping,
                             out=None, scales=None, **launch):
    """q [N, nh, hd] in qkv.dtype (normed + rotated; written to `out` if given); k (normed + rotated) and v are
    written into k_cache / v_cache at slot_mapping (an FP8 cache with its scales, kernels/paged_attention).
    `launch`: num_warps, pdl (Triton only)."""
    if use_triton(qkv):
        return fused_attn_decode_inputs_triton(qkv, q_norm_w, k_norm_w, cos, sin, eps, nh, nkv, hd, k_cache,
                                               v_cache, slot_mapping, out, scales=scales, **launch)
    return fused_attn_decode_inputs_ref(qkv, q_norm_w, k_norm_w, cos, sin, eps, nh, nkv, hd, k_cache, v_cache,
                                        slot_mapping, out, scales)
