"""One decode step of a Gated DeltaNet mixer in one launch, from the in_proj output to the gated-normed output:

    qkv -> causal conv1d update + SiLU (conv_state shifted in place) -> q, k [Hk, dk], v [Hv, dv]
    g = -exp(A_log) * softplus(a + dt_bias),  beta = sigmoid(b)
    gated delta rule step on ssm_state (l2-normed q, k; q scaled)  -> o [Hv, dv]
    y = gated RMSNorm(o, z) with norm_weight

It replaces four launches (gate math, conv1d update, recurrence, gated RMSNorm) per GDN layer. Each program owns one
(sequence, key head): it reads and writes the conv state of that key head's q/k channels and of the v channels of the
Hv // Hk value heads sharing it, so no two programs touch the same state. Each value head's whole [dk, dv] recurrent
state is held at once, which lets the RMSNorm over dv run in the epilogue. Rounding points follow the unfused ops
(conv output, beta, o, normalised o and its weight product are rounded to the activation dtype).
A negative state_idx marks a padding row: no state is touched and its output is zero.

It is slower than the four kernels it replaces at the 4B shape (bench/results/h200_kernels.json): one program per
(sequence, key head) is 16 programs at batch 1 for 132 SMs, each walking two 64 KB states: too little parallelism. Splitting dv across programs would need the RMSNorm's sum
of squares reduced across them. The engine keeps it off by default.
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import cast_rtne, check, next_pow2, output, require_last_dim_contiguous, use_triton
from kernels.conv1d_update import _weight_2d, causal_conv1d_update_ref
from kernels.gated_rmsnorm import gated_rmsnorm_ref
from kernels.gdn_recurrent import FUSED_REDUCTIONS, gates_from_raw_tl, gdn_recurrent_ref, step_and_output


def _dims(qkv, z, ssm_state):
    """(Hk, Hv, dk, dv) from the tensor shapes."""
    Hv, dv, dk = z.shape[1], z.shape[2], ssm_state.shape[2]
    return (qkv.shape[1] - Hv * dv) // (2 * dk), Hv, dk, dv


def _validate(qkv, z, b, a, conv_state, conv_weight, A_log, dt_bias, norm_weight, ssm_state, state_idx):
    check(qkv.dim() == 2, f"qkv must be [B, 2*Hk*dk + Hv*dv], got {tuple(qkv.shape)}")
    B = qkv.shape[0]
    check(z.dim() == 3 and z.shape[0] == B, f"z must be [B={B}, Hv, dv], got {tuple(z.shape)}")
    check(ssm_state.dim() == 4 and ssm_state.shape[1] == z.shape[1] and ssm_state.shape[3] == z.shape[2],
          f"ssm_state must be [num_slots, Hv={z.shape[1]}, dk, dv={z.shape[2]}], got {tuple(ssm_state.shape)}")
    check(ssm_state.dtype == torch.float32, f"ssm_state must be float32, got {ssm_state.dtype}")
    Hk, Hv, dk, dv = _dims(qkv, z, ssm_state)
    check(Hk >= 1 and qkv.shape[1] == 2 * Hk * dk + Hv * dv and Hv % Hk == 0,
          f"qkv width {qkv.shape[1]} is not 2*Hk*dk + Hv*dv with dk={dk}, Hv={Hv}, dv={dv} and Hv a multiple of Hk")
    C = qkv.shape[1]
    check(conv_weight.dim() == 2 and conv_weight.shape[0] == C and conv_weight.shape[1] >= 2,
          f"conv weight must be [C={C}, K>=2], got {tuple(conv_weight.shape)}")
    K = conv_weight.shape[1]
    check(conv_state.dim() == 3 and conv_state.shape[1:] == (C, K - 1),
          f"conv_state must be [num_slots, C={C}, K-1={K - 1}], got {tuple(conv_state.shape)}")
    for name, t in (("b", b), ("a", a)):
        check(t.shape == (B, Hv), f"{name} must be [B={B}, Hv={Hv}], got {tuple(t.shape)}")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        check(t.shape == (Hv,), f"{name} must be [Hv={Hv}], got {tuple(t.shape)}")
    check(norm_weight.shape == (dv,), f"norm_weight must be [dv={dv}], got {tuple(norm_weight.shape)}")
    check(state_idx.shape == (B,) and not state_idx.is_floating_point(),
          f"state_idx must be an integer tensor of shape [B={B}], got {state_idx.dtype} {tuple(state_idx.shape)}")


def fused_gdn_decode_ref(qkv, z, b, a, conv_state, conv_weight, A_log, dt_bias, norm_weight, ssm_state, state_idx,
                         eps, scale=None, out=None):
    """The reference ops in sequence: gate math, causal_conv1d_update_ref, gdn_recurrent_ref, gated_rmsnorm_ref."""
    conv_weight = _weight_2d(conv_weight)
    _validate(qkv, z, b, a, conv_state, conv_weight, A_log, dt_bias, norm_weight, ssm_state, state_idx)
    Hk, Hv, dk, dv = _dims(qkv, z, ssm_state)
    B = qkv.shape[0]
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b)
    y = causal_conv1d_update_ref(qkv, conv_state, conv_weight, state_idx, "silu")
    q, k, v = y.split([Hk * dk, Hk * dk, Hv * dv], dim=-1)
    o = gdn_recurrent_ref(q.reshape(B, 1, Hk, dk), k.reshape(B, 1, Hk, dk), v.reshape(B, 1, Hv, dv), g[:, None],
                          beta[:, None], ssm_state, state_idx, scale)[:, 0]
    return gated_rmsnorm_ref(o, z, norm_weight, eps, out)


@triton.jit
def _conv_silu_update(x_row, state_base, w_ptr, ss_c, sw_c, chans, mask_c, live,
                      K: tl.constexpr, BT: tl.constexpr):
    """Causal conv over [state | x] for `chans`, SiLU, rounded to x's dtype (returned in fp32); shifts x into the
    state (skipped for padding rows). The shift is done on the register tile, so no re-read of the state."""
    offs_t = tl.arange(0, BT)
    x = tl.load(x_row + chans, mask=mask_c, other=0.0).to(tl.float32)
    s_ptrs = state_base + chans[:, None] * ss_c + offs_t[None, :]
    hist_mask = mask_c[:, None] & (offs_t[None, :] < K - 1) & live
    window = tl.load(s_ptrs, mask=hist_mask, other=0.0).to(tl.float32)
    window = tl.where(offs_t[None, :] == K - 1, x[:, None], window)
    w = tl.load(w_ptr + chans[:, None] * sw_c + offs_t[None, :], mask=mask_c[:, None] & (offs_t[None, :] < K),
                other=0.0).to(tl.float32)
    y = tl.sum(window * w, axis=1)
    y = cast_rtne(y * tl.sigmoid(y), x_row.dtype.element_ty).to(tl.float32)
    # new state column j = window column j + 1: a 0/1 selection summed over the (tiny) tap axis
    select = (offs_t[None, :, None] + 1 == offs_t[None, None, :]).to(tl.float32)  # [1, BT (j), BT (t)]
    shifted = tl.sum(window[:, None, :] * select, axis=2)
    tl.store(s_ptrs, cast_rtne(shifted, state_base.dtype.element_ty), mask=hist_mask)
    return y


@triton.jit
def _fused_gdn_decode_kernel(
    qkv_ptr, z_ptr, b_ptr, a_ptr, cs_ptr, cw_ptr, alog_ptr, dtb_ptr, nw_ptr, ss_ptr, idx_ptr, y_ptr,
    scale, eps,
    s_qkv, sz_n, sz_h, s_b, s_a, scs_n, scs_c, scw_c, sss_n, sss_h, sss_k, sy_n, sy_h,
    HK: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, K: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, ROUND_PRODUCT: tl.constexpr, FUSED: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    hk = tl.program_id(1)
    slot = tl.load(idx_ptr + n).to(tl.int64)
    live = slot >= 0
    slot = tl.maximum(slot, 0)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    x_row = qkv_ptr + n * s_qkv
    cs_base = cs_ptr + slot * scs_n
    dt = qkv_ptr.dtype.element_ty

    q = _conv_silu_update(x_row, cs_base, cw_ptr, scs_c, scw_c, hk * DK + offs_k, mask_k, live, K, BT)
    k = _conv_silu_update(x_row, cs_base, cw_ptr, scs_c, scw_c, (HK + hk) * DK + offs_k, mask_k, live, K, BT)
    q = q * (tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale)  # l2norm eps as kernels.gdn_recurrent
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    nw = tl.load(nw_ptr + offs_v, mask=mask_v, other=0.0).to(tl.float32)

    for j in range(GROUP):
        hv = hk * GROUP + j
        v = _conv_silu_update(x_row, cs_base, cw_ptr, scs_c, scw_c, 2 * HK * DK + hv * DV + offs_v, mask_v, live,
                              K, BT)
        g, beta = gates_from_raw_tl(tl.load(a_ptr + n * s_a + hv), tl.load(b_ptr + n * s_b + hv),
                                    -tl.exp(tl.load(alog_ptr + hv).to(tl.float32)),
                                    tl.load(dtb_ptr + hv).to(tl.float32))

        mask_s = mask_k[:, None] & mask_v[None, :] & live
        s_ptrs = ss_ptr + slot * sss_n + hv * sss_h + offs_k[:, None] * sss_k + offs_v[None, :]
        S = tl.load(s_ptrs, mask=mask_s, other=0.0)
        S, _, o = step_and_output(S, k, q, v, g, beta, FUSED)
        tl.store(s_ptrs, S, mask=mask_s)
        o = cast_rtne(tl.where(live, o, 0.0), dt).to(tl.float32)

        # gated RMSNorm epilogue over the whole dv row
        rstd = tl.rsqrt(tl.sum(o * o, axis=0) / DV + eps)
        y = cast_rtne(o * rstd, dt).to(tl.float32) * nw
        if ROUND_PRODUCT:
            y = cast_rtne(y, dt).to(tl.float32)
        zf = tl.load(z_ptr + n * sz_n + hv * sz_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        y = y * (zf * tl.sigmoid(zf))
        tl.store(y_ptr + n * sy_n + hv * sy_h + offs_v, cast_rtne(y, y_ptr.dtype.element_ty), mask=mask_v)


def fused_gdn_decode_triton(qkv, z, b, a, conv_state, conv_weight, A_log, dt_bias, norm_weight, ssm_state, state_idx,
                            eps, scale=None, out=None, num_warps=None, fused_reductions=FUSED_REDUCTIONS):
    conv_weight = _weight_2d(conv_weight)
    _validate(qkv, z, b, a, conv_state, conv_weight, A_log, dt_bias, norm_weight, ssm_state, state_idx)
    for name, t in (("qkv", qkv), ("z", z), ("conv_state", conv_state), ("conv_weight", conv_weight),
                    ("norm_weight", norm_weight), ("ssm_state", ssm_state), ("A_log", A_log), ("dt_bias", dt_bias)):
        require_last_dim_contiguous(name, t)
    for name, t in (("b", b), ("a", a)):
        require_last_dim_contiguous(name, t)
    Hk, Hv, dk, dv = _dims(qkv, z, ssm_state)
    B = qkv.shape[0]
    scale = dk ** -0.5 if scale is None else float(scale)
    y = output(out, z.shape, qkv.dtype, qkv.device)
    require_last_dim_contiguous("out", y)
    if B == 0:
        return y
    BK, BV = next_pow2(dk), next_pow2(dv)
    product_dtype = torch.promote_types(qkv.dtype, norm_weight.dtype)
    _fused_gdn_decode_kernel[(B, Hk)](
        qkv, z, b, a, conv_state, conv_weight, A_log, dt_bias, norm_weight, ssm_state, state_idx, y,
        scale, float(eps),
        qkv.stride(0), z.stride(0), z.stride(1), b.stride(0), a.stride(0), conv_state.stride(0), conv_state.stride(1),
        conv_weight.stride(0), *ssm_state.stride()[:3], y.stride(0), y.stride(1),
        HK=Hk, GROUP=Hv // Hk, DK=dk, DV=dv, K=conv_weight.shape[1], BK=BK, BV=BV,
        BT=next_pow2(conv_weight.shape[1]), ROUND_PRODUCT=product_dtype != torch.float32, FUSED=fused_reductions,
        # the [dk, dv] fp32 state tile is spread over all threads: 128x128 at 16 warps is 32 registers per thread
        num_warps=num_warps or max(4, min(16, BK * BV // 1024)),
    )
    return y


def fused_gdn_decode(qkv, z, b, a, conv_state, conv_weight, A_log, dt_bias, norm_weight, ssm_state, state_idx, eps,
                     scale=None, out=None, **launch):
    """y [B, Hv, dv] in qkv.dtype (written to `out` if given); updates conv_state and ssm_state rows state_idx in
    place. qkv [B, 2*Hk*dk + Hv*dv], z [B, Hv, dv], b, a [B, Hv] (raw projections, rows may be strided views of one
    fused projection). `launch`: num_warps, fused_reductions (the token step's form, as kernels/gdn_recurrent; Triton
    only)."""
    if use_triton(qkv):
        return fused_gdn_decode_triton(qkv, z, b, a, conv_state, conv_weight, A_log, dt_bias, norm_weight, ssm_state,
                                       state_idx, eps, scale, out, **launch)
    return fused_gdn_decode_ref(qkv, z, b, a, conv_state, conv_weight, A_log, dt_bias, norm_weight, ssm_state,
                                state_idx, eps, scale, out)
