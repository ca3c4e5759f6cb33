"""Gated delta rule, recurrent form, for T >= 1 new tokens per sequence (decode, speculative verification).

Per value head, with the key head shared by Hv // Hk consecutive value heads:
    q, k <- l2norm(q), l2norm(k) in fp32;  q <- q * scale
    S <- exp(g) * S;  delta = beta * (v - S^T k);  S <- S + k delta^T;  o = S^T q
The state S [dk, dv] lives in a pool `state[num_slots, Hv, dk, dv]` of fp32 or bf16 (half the bytes a decode step
moves for it; engine option gdn_state_dtype); row `state_idx[b]` is read and written back in place, stepped in fp32
in between (a bf16 pool is rounded once per step, to nearest even). A negative state_idx marks a padding row: its state is left untouched and its output is zero.

raw_gates=(A_log, dt_bias): g and beta are passed as the raw projections a and b, and the gates are computed on load
(g = -exp(A_log) * softplus(a + dt_bias) in fp32, beta = sigmoid(b) rounded to b's dtype), as the model's glue would
(engine/models/glue.gdn_gates): at decode this saves the glue's kernels in every GDN layer.
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import (
    cast_rtne, cdiv, check, next_pow2, output, pdl_enter, pdl_launch, require_last_dim_contiguous, use_triton)

L2NORM_EPS = 1e-6
STATE_DTYPES = (torch.float32, torch.bfloat16)
# Launch defaults from the graph-timed sweep at the 4B shape (docs/decisions.md): one warp per (sequence, value head,
# 32-wide dv tile) keeps each token's reductions over dk inside a warp, and the fused step takes both from one pass
# over the tile. The verify and fold kernels (kernels/gdn_verify.py) step the same way: plain and speculative decoding
# must round alike.
DECODE_BLOCK_V, DECODE_WARPS = 32, 1


def _validate(q, k, v, g, beta, state, state_idx):
    check(q.dim() == 4 and k.shape == q.shape, f"q, k must be [B, T, Hk, dk] and equal, got {tuple(q.shape)}, {tuple(k.shape)}")
    B, T, Hk, dk = q.shape
    check(v.dim() == 4 and v.shape[:2] == (B, T), f"v must be [B={B}, T={T}, Hv, dv], got {tuple(v.shape)}")
    Hv, dv = v.shape[2], v.shape[3]
    check(Hv % Hk == 0, f"value heads ({Hv}) must be a multiple of key heads ({Hk})")
    check(g.shape == (B, T, Hv), f"g must be [B, T, Hv] = {(B, T, Hv)}, got {tuple(g.shape)}")
    check(beta.shape == (B, T, Hv), f"beta must be [B, T, Hv] = {(B, T, Hv)}, got {tuple(beta.shape)}")
    check(state.dim() == 4 and state.shape[1:] == (Hv, dk, dv),
          f"state must be [num_slots, Hv={Hv}, dk={dk}, dv={dv}], got {tuple(state.shape)}")
    check(state.dtype in STATE_DTYPES, f"state must be float32 or bfloat16, got {state.dtype}")
    check(state_idx.shape == (B,) and not state_idx.is_floating_point(),
          f"state_idx must be an integer tensor of shape [B={B}], got {state_idx.dtype} {tuple(state_idx.shape)}")


def l2norm_ref(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, in the input's dtype (callers pass fp32)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def gates_from_raw(a, b, A_log, dt_bias):
    """(g, beta) from the raw a, b projections [..., Hv]: the decay and write-strength gates of the gated delta rule."""
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias.float()), torch.sigmoid(b)


def _check_raw_gates(raw_gates, Hv):
    check(len(raw_gates) == 2 and all(t.shape == (Hv,) for t in raw_gates),
          f"raw_gates must be (A_log [Hv={Hv}], dt_bias [Hv]), got {[tuple(t.shape) for t in raw_gates]}")


def gdn_recurrent_ref(q, k, v, g, beta, state, state_idx, scale=None, out=None, raw_gates=None):
    _validate(q, k, v, g, beta, state, state_idx)
    if raw_gates is not None:
        _check_raw_gates(raw_gates, v.shape[2])
        g, beta = gates_from_raw(g, beta, *raw_gates)
    B, T, Hk, dk = q.shape
    Hv = v.shape[2]
    group = Hv // Hk
    scale = dk ** -0.5 if scale is None else scale
    qf = l2norm_ref(q.float()).repeat_interleave(group, dim=2) * scale
    kf = l2norm_ref(k.float()).repeat_interleave(group, dim=2)
    vf, gf, bf = v.float(), g.float(), beta.float()

    live = state_idx >= 0
    S = state[state_idx.long().clamp(min=0)].float()  # [B, Hv, dk, dv]
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for t in range(T):
        S = S * gf[:, t].exp()[..., None, None]
        kv = torch.einsum("bhkv,bhk->bhv", S, kf[:, t])
        delta = bf[:, t, :, None] * (vf[:, t] - kv)
        S = S + kf[:, t, :, :, None] * delta[:, :, None, :]
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, qf[:, t])
    state[state_idx[live].long()] = S[live].to(state.dtype)
    o[~live] = 0.0
    out = output(out, v.shape, v.dtype, v.device)
    out.copy_(o)
    return out


@triton.jit
def decay_and_update(S, g, k, u):
    """S exp(g) + k u^T on a [BK, BV] tile, in one expression as delta_rule_step_fused writes it. The ring fold
    replays accepted tokens with it, so that a folded state has the bits plain decoding would have given it."""
    return S * tl.exp(g) + k[:, None] * u[None, :]


@triton.jit
def delta_rule_step_fused(S, k, q, v, g, beta):
    """One token of the gated delta rule on a [BK, BV] fp32 state tile (k normalised, g the log decay) and its
    output S'^T q, from one pass over the tile before the step: S^T k and S^T q are independent reductions (instead
    of a decay pass, then one reduction, the update, then the other: three passes over the tile instead of four),
    u = beta (v - e S^T k), o = e S^T q + u (k . q), and the decay and rank-1 update in one pass (e = exp(g)).
    Returns (S, u, o); every kernel that steps the state calls it, so that all step alike."""
    e = tl.exp(g)
    a = tl.sum(S * k[:, None], axis=0)
    b = tl.sum(S * q[:, None], axis=0)
    u = beta * (v - e * a)
    o = e * b + u * tl.sum(k * q, axis=0)
    return decay_and_update(S, g, k, u), u, o


@triton.jit
def token_update(S, q_at, k_at, v_at, g_at, beta_at, offs_k, offs_v, mask_k, mask_v, live, scale, neg_decay_rate,
                 dt_bias, RAW_GATES: tl.constexpr):
    """One token on a [BK, BV] fp32 state tile from pointers to its q, k (key head), v, g, beta (value head) rows:
    the gates (from the raw projections when RAW_GATES), q and k l2-normalised (q scaled), the delta rule step and
    the output (delta_rule_step_fused). Returns (S, u, o (0 on a padding row), normalised k, g); shared by
    the decode and verify kernels, which must step alike for speculation to stay lossless."""
    q = tl.load(q_at + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    k = tl.load(k_at + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    v = tl.load(v_at + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    g = tl.load(g_at).to(tl.float32)
    beta = tl.load(beta_at)
    if RAW_GATES:
        g, beta = gates_from_raw_tl(g, beta, neg_decay_rate, dt_bias)
    beta = beta.to(tl.float32)
    q = q * (tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale)
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    S, u, o = delta_rule_step_fused(S, k, q, v, g, beta)
    return S, u, tl.where(live, o, 0.0), k, g


@triton.jit
def gates_from_raw_tl(a, b, neg_decay_rate, dt_bias):
    """gates_from_raw inside a kernel: g = neg_decay_rate * softplus(a + dt_bias) with torch's threshold (linear
    above 20), beta = sigmoid(b) rounded to b's dtype, both returned in fp32 (neg_decay_rate = -exp(A_log))."""
    x = a.to(tl.float32) + dt_bias
    g = neg_decay_rate * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    return g, cast_rtne(tl.sigmoid(b.to(tl.float32)), b.dtype).to(tl.float32)


@triton.jit
def state_program(idx_ptr, GROUP: tl.constexpr):
    """Where a (sequence, value head, dv tile) program works: (b, value head, dv tile, key head, state slot, live);
    a padding row (negative slot) gets slot 0 with live False, for masked loads. Shared by every kernel that
    steps or reads the state per value head (decode, speculative verify)."""
    b = tl.program_id(0)
    hv = tl.program_id(1)
    slot = tl.load(idx_ptr + b).to(tl.int64)
    return b, hv, tl.program_id(2), hv // GROUP, tl.maximum(slot, 0), slot >= 0


@triton.jit
def _gdn_recurrent_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, state_ptr, idx_ptr, alog_ptr, dtb_ptr,
    T, scale,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
    sg_b, sg_t, sg_h, sbeta_b, sbeta_t, sbeta_h, so_b, so_t, so_h,
    ss_n, ss_h, ss_k,
    GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    RAW_GATES: tl.constexpr, PDL: tl.constexpr,
):
    # One program = (sequence, value head, dv tile); the [dk, BV] state tile stays in registers across the T steps.
    pdl_enter(PDL)
    b, hv, vt, hk, slot, live = state_program(idx_ptr, GROUP)

    offs_k = tl.arange(0, BK)
    offs_v = vt * BV + tl.arange(0, BV)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    mask_s = mask_k[:, None] & mask_v[None, :] & live
    s_ptrs = state_ptr + slot * ss_n + hv * ss_h + offs_k[:, None] * ss_k + offs_v[None, :]
    S = tl.load(s_ptrs, mask=mask_s, other=0.0).to(tl.float32)

    b64 = b.to(tl.int64)
    neg_decay_rate = 0.0
    dt_bias = 0.0
    if RAW_GATES:
        neg_decay_rate = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    for t in range(T):
        S, _, o, _, _ = token_update(
            S, q_ptr + b64 * sq_b + t * sq_t + hk * sq_h, k_ptr + b64 * sk_b + t * sk_t + hk * sk_h,
            v_ptr + b64 * sv_b + t * sv_t + hv * sv_h, g_ptr + b64 * sg_b + t * sg_t + hv * sg_h,
            beta_ptr + b64 * sbeta_b + t * sbeta_t + hv * sbeta_h, offs_k, offs_v, mask_k, mask_v, live, scale,
            neg_decay_rate, dt_bias, RAW_GATES)
        tl.store(o_ptr + b64 * so_b + t * so_t + hv * so_h + offs_v, cast_rtne(o, o_ptr.dtype.element_ty), mask=mask_v)
    # the tile's pointers formed again rather than kept from the load: at one warp a [128, 32] tile of 64-bit
    # pointers held across the steps spills
    tl.store(state_ptr + (slot * ss_n + hv * ss_h) + (offs_k[:, None] * ss_k + offs_v[None, :]),
             cast_rtne(S, state_ptr.dtype.element_ty), mask=mask_s)


def gdn_recurrent_triton(q, k, v, g, beta, state, state_idx, scale=None, out=None, raw_gates=None, block_v=None,
                         num_warps=None, pdl=False):
    _validate(q, k, v, g, beta, state, state_idx)
    pdl_args = pdl_launch(pdl)
    if raw_gates is not None:
        _check_raw_gates(raw_gates, v.shape[2])
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_last_dim_contiguous(name, t)
    check(state.stride(-1) == 1, "state: last dimension (dv) must be contiguous")
    B, T, Hk, dk = q.shape
    Hv, dv = v.shape[2], v.shape[3]
    scale = dk ** -0.5 if scale is None else float(scale)
    o = output(out, v.shape, v.dtype, v.device)
    require_last_dim_contiguous("out", o)
    BK = next_pow2(dk)
    BV = block_v or min(next_pow2(dv), DECODE_BLOCK_V)
    grid = (B, Hv, cdiv(dv, BV))
    _gdn_recurrent_kernel[grid](
        q, k, v, g, beta, o, state, state_idx, *(raw_gates if raw_gates is not None else (g, g)),
        T, scale,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *g.stride(), *beta.stride(), *o.stride()[:3],
        *state.stride()[:3],
        GROUP=Hv // Hk, DK=dk, DV=dv, BK=BK, BV=BV, RAW_GATES=raw_gates is not None,
        **pdl_args, num_warps=num_warps or DECODE_WARPS,
    )
    return o


def gdn_recurrent(q, k, v, g, beta, state, state_idx, scale=None, out=None, raw_gates=None, **launch):
    """o [B, T, Hv, dv] (v.dtype, written to `out` if given); updates `state` rows `state_idx` in place.
    raw_gates=(A_log, dt_bias): g, beta are the raw a, b projections (module docstring).
    `launch`: block_v, num_warps, pdl (Triton only)."""
    if use_triton(q):
        return gdn_recurrent_triton(q, k, v, g, beta, state, state_idx, scale, out, raw_gates,
                                    **launch)
    return gdn_recurrent_ref(q, k, v, g, beta, state, state_idx, scale, out, raw_gates)
