"""Speculative verification of a Gated DeltaNet layer: a block of T tokens per sequence checked against the cached
state, with the updates of tokens already emitted kept pending in a ring and folded into the state only now and then
(ReplaySSM's deferred fold).

The ring, per state slot (fp32): ring_k [slots, P, Hk, dk] (normalised keys), ring_u [slots, P, Hv, dv] (the
corrections u), ring_g [slots, P, Hv] (log decays), and ring_pos [slots, 2] int32 = (row of the oldest pending token,
pending count h), one ring_pos for every layer. Row j of a slot's pending tokens is ring row (start + j) % P.

verify, per sequence b and value head, from slot s = state_idx[b]:
    S = state[s] with the h pending tokens folded in, oldest first:  S <- exp(g_j) S + k_j u_j^T
    if h > fold_after: state[s] <- S   (the pending rows are then dropped by gdn_ring_advance)
    for t < T:  S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T q_t
and the block's (k_t, u_t, g_t) go to ring rows (start + h + t) % P, past the pending ones (q, k l2-normalised in
fp32, q scaled by dk^-0.5; the same arithmetic as kernels/gdn_recurrent).
gdn_ring_advance, once the accepted counts n_b are known on the device: if h > fold_after, start += h and h = 0;
then h += n_b: the accepted tokens become pending, the rejected ones are forgotten by the count alone.
gdn_fold: state[s] <- S with every pending token folded in, h <- 0; run before anything else reads the state
(plain decode, prefill; a copy of a slot with nothing pending carries its ring position instead).

So a verify step reads the state once and writes it once every few steps (fold_after = 0: at every step that has
pending tokens, still one read and one write fewer than verifying and then committing), where writing every token's
state (vLLM's spec path) costs T writes; and the state folded token by token is the same, op for op, as n plain
decode steps would have left. P >= fold_after + 2 T: the block's rows never overlap the pending rows that other
programs of the same launch still read. The layered forms (a leading layer axis on state and ring) serve every
layer in one launch.

The conv1d half: verify convolves the block with the conv state without shifting it (and, given `keep`, stores the
block's pre-conv inputs x [B, T, C] there in the same launch); commit shifts in the first n_b of those inputs. One
launch each (the commit, as above, for every layer at once).

A negative state_idx marks a padding row: nothing of it is read or written and its outputs are zero. raw_gates as
in kernels/gdn_recurrent (g, beta passed as the raw a, b projections).
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import cast_rtne, cdiv, check, next_pow2, output, require_last_dim_contiguous, use_triton
from kernels.conv1d_update import conv_program
from kernels.gdn_recurrent import (
    DECODE_BLOCK_V, DECODE_WARPS, _check_raw_gates, _validate, decay_and_update, gates_from_raw, l2norm_ref,
    state_program, token_update)


def _check_ring(ring, state, Hk, dk, T=None, fold_after=None):
    """ring = (ring_k, ring_u, ring_g, ring_pos) for `state` [slots, Hv, dk, dv] (or both with a layer axis) -> P."""
    check(len(ring) == 4, f"ring must be (ring_k, ring_u, ring_g, ring_pos), got {len(ring)} tensors")
    rk, ru, rg, pos = ring
    lead = state.shape[:-3]  # (slots,) or (layers, slots)
    Hv, dv = state.shape[-3], state.shape[-1]
    P = rk.shape[len(lead)] if rk.dim() > len(lead) else 0
    for name, t, shape in (("ring_k", rk, (P, Hk, dk)), ("ring_u", ru, (P, Hv, dv)), ("ring_g", rg, (P, Hv))):
        check(t.dtype == torch.float32 and tuple(t.shape) == (*lead, *shape),
              f"{name} must be float32 {(*lead, *shape)} (state's leading dims, ring rows, head dims), got "
              f"{t.dtype} {tuple(t.shape)}")
    check(pos.dtype == torch.int32 and tuple(pos.shape) == (lead[-1], 2),
          f"ring_pos must be int32 [slots={lead[-1]}, 2], got {pos.dtype} {tuple(pos.shape)}")
    if T is not None:
        check(fold_after >= 0 and P >= fold_after + 2 * T,
              f"a ring of {P} rows holds fold_after={fold_after} pending tokens and a block of {T} only with "
              f"P >= fold_after + 2 T = {fold_after + 2 * T}")
    return P


def _verify_shapes(q, k, v, g, beta, state, state_idx, ring, fold_after, raw_gates):
    """(B, T, Hk, dk, Hv, dv, P) of a verify call whose inputs, ring and raw gates are checked."""
    _validate(q, k, v, g, beta, state, state_idx)
    B, T, Hk, dk = q.shape
    Hv, dv = v.shape[2], v.shape[3]
    P = _check_ring(ring, state, Hk, dk, T, fold_after)
    if raw_gates is not None:
        _check_raw_gates(raw_gates, Hv)
    return B, T, Hk, dk, Hv, dv, P


def _fold_ref(S, slots, ring, group):
    """S [B, Hv, dk, dv] (the states of `slots` [B], valid rows) with each slot's pending tokens folded in, oldest
    first, as the decode kernel steps a state."""
    rk, ru, rg, pos = ring
    P = rk.shape[1]
    start, h = pos[slots, 0].long(), pos[slots, 1].long()
    for j in range(int(h.max()) if len(h) else 0):
        p = (start + j) % P
        kf = rk[slots, p].repeat_interleave(group, dim=1)  # [B, Hv, dk]
        folded = S * rg[slots, p].exp()[..., None, None] + kf[..., None] * ru[slots, p][:, :, None, :]
        S = torch.where((j < h)[:, None, None, None], folded, S)
    return S


def gdn_verify_ref(q, k, v, g, beta, state, state_idx, ring, fold_after=0, scale=None, raw_gates=None, out=None):
    B, T, Hk, dk, Hv, dv, P = _verify_shapes(q, k, v, g, beta, state, state_idx, ring, fold_after, raw_gates)
    if raw_gates is not None:
        g, beta = gates_from_raw(g, beta, *raw_gates)
    group = Hv // Hk
    scale = dk ** -0.5 if scale is None else scale
    kn = l2norm_ref(k.float())
    qf = l2norm_ref(q.float()).repeat_interleave(group, dim=2) * scale
    kf = kn.repeat_interleave(group, dim=2)
    vf, gf, bf = v.float(), g.float(), beta.float()
    live = state_idx >= 0
    slots = state_idx.long()[live]
    S = state[state_idx.long().clamp(min=0)].clone()
    S[live] = _fold_ref(S[live], slots, ring, group)
    rk, ru, rg, pos = ring
    start, h = pos[slots, 0].long(), pos[slots, 1].long()
    flush = h > fold_after
    state[slots[flush]] = S[live][flush]
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    u = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for t in range(T):
        S = S * gf[:, t].exp()[..., None, None]
        kv = torch.einsum("bhkv,bhk->bhv", S, kf[:, t])
        u[:, t] = bf[:, t, :, None] * (vf[:, t] - kv)
        S = S + kf[:, t, :, :, None] * u[:, t, :, None, :]
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, qf[:, t])
    rows = ((start + h)[:, None] + torch.arange(T, device=q.device)[None, :]) % P  # [live, T]
    at = (slots[:, None].expand(-1, T), rows)
    rk[at], ru[at], rg[at] = kn[live], u[live], gf[live]
    o[~live] = 0.0
    out = output(out, v.shape, v.dtype, v.device)
    out.copy_(o)
    return out


def _ring_advance_ref(ring_pos, state_idx, num_accepted, fold_after, P):
    rows = state_idx.long()
    start, h = ring_pos[rows, 0], ring_pos[rows, 1]
    flush = h > fold_after
    ring_pos[rows] = torch.stack([torch.where(flush, (start + h) % P, start),
                                  torch.where(flush, 0, h) + num_accepted.to(torch.int32)], 1).to(torch.int32)


def gdn_fold_ref(state, state_idx, ring):
    """gdn_fold's contract, in torch: every layer (a leading layer axis) or one."""
    rk, ru, rg, pos = ring
    _check_ring(ring, state, rk.shape[-2], rk.shape[-1])
    slots = state_idx.long()
    if state.dim() == 5:
        for i in range(state.shape[0]):
            layer = (rk[i], ru[i], rg[i], pos)
            state[i, slots] = _fold_ref(state[i, slots], slots, layer, state.shape[2] // rk.shape[3])
    else:
        state[slots] = _fold_ref(state[slots], slots, ring, state.shape[1] // rk.shape[2])
    pos[slots] = 0


@triton.jit
def _ring_fold(S, rk_row, ru_row, rg_row, start, h, P, srk_p, sru_p, srg_p, offs_k, offs_v, mask_k, mask_v):
    """The h pending tokens of a slot (ring rows (start + j) % P, oldest first) folded into its [BK, BV] state tile,
    as the decode kernel steps it. *_row: the slot's ring at this head. One token's loads at a time: issuing a few
    tokens' loads together was slower (docs/decisions.md)."""
    for j in range(0, h):
        p = (start + j) % P
        k = tl.load(rk_row + p * srk_p + offs_k, mask=mask_k, other=0.0)
        u = tl.load(ru_row + p * sru_p + offs_v, mask=mask_v, other=0.0)
        S = decay_and_update(S, tl.load(rg_row + p * srg_p), k, u)
    return S


@triton.jit
def _pending_folded(state_ptr, pos_ptr, rk_ptr, ru_ptr, rg_ptr, slot, hv, hk, live, P, fold_after,
                    ss_n, ss_h, ss_k, srk_n, srk_p, srk_h, sru_n, sru_p, sru_h, srg_n, srg_p,
                    offs_k, offs_v, mask_k, mask_v):
    """A verify program's [BK, BV] state tile with its slot's pending tokens folded in, written back when more than
    fold_after were pending. Returns (tile, ring row of the block's first token, the slot's ring at this head: k, u,
    g pointers). A padding row reads nothing and has nothing pending."""
    mask_s = mask_k[:, None] & mask_v[None, :] & live
    s_ptrs = state_ptr + slot * ss_n + hv * ss_h + offs_k[:, None] * ss_k + offs_v[None, :]
    start = tl.load(pos_ptr + slot * 2, mask=live, other=0)
    h = tl.load(pos_ptr + slot * 2 + 1, mask=live, other=0)
    rk_row = rk_ptr + slot * srk_n + hk * srk_h
    ru_row = ru_ptr + slot * sru_n + hv * sru_h
    rg_row = rg_ptr + slot * srg_n + hv
    S = _ring_fold(tl.load(s_ptrs, mask=mask_s, other=0.0), rk_row, ru_row, rg_row, start, h, P, srk_p, sru_p, srg_p,
                   offs_k, offs_v, mask_k, mask_v)
    tl.store(s_ptrs, S, mask=mask_s & (h > fold_after))
    return S, start + h, rk_row, ru_row, rg_row


@triton.jit
def _verify_token(S, t, p, q_row, k_row, v_row, g_row, beta_row, o_row, ru_row, rk_row, rg_row,
                  sq_t, sk_t, sv_t, sg_t, sbeta_t, so_t, sru_p, srk_p, srg_p,
                  offs_k, offs_v, mask_k, mask_v, live, first_of_key, write_g, scale, neg_decay_rate, dt_bias,
                  RAW_GATES: tl.constexpr):
    """Token t of the block on the state tile S: output stored, its k / u / g stored at ring row p, the stepped tile
    returned."""
    S, u, o, k, g = token_update(S, q_row + t * sq_t, k_row + t * sk_t, v_row + t * sv_t, g_row + t * sg_t,
                                 beta_row + t * sbeta_t, offs_k, offs_v, mask_k, mask_v, live, scale, neg_decay_rate,
                                 dt_bias, RAW_GATES)
    tl.store(o_row + t * so_t + offs_v, cast_rtne(o, o_row.dtype.element_ty), mask=mask_v)
    tl.store(ru_row + p * sru_p + offs_v, u, mask=mask_v & live)
    tl.store(rk_row + p * srk_p + offs_k, k, mask=mask_k & first_of_key)
    tl.store(rg_row + p * srg_p, g, mask=write_g)
    return S


@triton.jit
def _gdn_verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, state_ptr, idx_ptr, rk_ptr, ru_ptr, rg_ptr, pos_ptr, alog_ptr,
    dtb_ptr, T, P, fold_after, scale,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
    sg_b, sg_t, sg_h, sbeta_b, sbeta_t, sbeta_h, so_b, so_t, so_h,
    ss_n, ss_h, ss_k, srk_n, srk_p, srk_h, sru_n, sru_p, sru_h, srg_n, srg_p,
    GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    RAW_GATES: tl.constexpr,
):
    # One program = (sequence, value head, dv tile), as kernels/gdn_recurrent: the state tile is loaded once, the
    # pending tokens folded in, and carried in registers over the block, a loop over its tokens (unrolled it was
    # slower: docs/decisions.md).
    b, hv, vt, hk, slot, live = state_program(idx_ptr, GROUP)
    offs_k = tl.arange(0, BK)
    offs_v = vt * BV + tl.arange(0, BV)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    S, base, rk_row, ru_row, rg_row = _pending_folded(
        state_ptr, pos_ptr, rk_ptr, ru_ptr, rg_ptr, slot, hv, hk, live, P, fold_after, ss_n, ss_h, ss_k, srk_n, srk_p,
        srk_h, sru_n, sru_p, sru_h, srg_n, srg_p, offs_k, offs_v, mask_k, mask_v)
    b64 = b.to(tl.int64)
    first_of_key = (hv % GROUP == 0) & (vt == 0) & live  # one program writes each key head's k
    neg_decay_rate = 0.0
    dt_bias = 0.0
    if RAW_GATES:
        neg_decay_rate = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    q_row, k_row = q_ptr + b64 * sq_b + hk * sq_h, k_ptr + b64 * sk_b + hk * sk_h
    v_row, o_row = v_ptr + b64 * sv_b + hv * sv_h, o_ptr + b64 * so_b + hv * so_h
    g_row, beta_row = g_ptr + b64 * sg_b + hv * sg_h, beta_ptr + b64 * sbeta_b + hv * sbeta_h
    for t in range(T):
        S = _verify_token(S, t, (base + t) % P, q_row, k_row, v_row, g_row, beta_row, o_row, ru_row, rk_row, rg_row,
                          sq_t, sk_t, sv_t, sg_t, sbeta_t, so_t, sru_p, srk_p, srg_p, offs_k, offs_v, mask_k, mask_v,
                          live, first_of_key, live & (vt == 0), scale, neg_decay_rate, dt_bias, RAW_GATES)


@triton.jit
def _gdn_fold_kernel(
    state_ptr, idx_ptr, rk_ptr, ru_ptr, rg_ptr, pos_ptr,
    NV, P, ss_l, ss_n, ss_h, ss_k, srk_l, srk_n, srk_p, srk_h, sru_l, sru_n, sru_p, sru_h, srg_l, srg_n, srg_p,
    GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    # Grid (sequence, value head, layer x dv tile): every GDN layer's fold in one launch.
    b = tl.program_id(0)
    hv = tl.program_id(1)
    layer = (tl.program_id(2) // NV).to(tl.int64)
    vt = tl.program_id(2) % NV
    slot = tl.load(idx_ptr + b).to(tl.int64)
    h = tl.load(pos_ptr + tl.maximum(slot, 0) * 2 + 1)
    if (slot >= 0) & (h > 0):
        offs_k = tl.arange(0, BK)
        offs_v = vt * BV + tl.arange(0, BV)
        mask_k = offs_k < DK
        mask_v = offs_v < DV
        mask_s = mask_k[:, None] & mask_v[None, :]
        s_ptrs = state_ptr + layer * ss_l + slot * ss_n + hv * ss_h + offs_k[:, None] * ss_k + offs_v[None, :]
        S = tl.load(s_ptrs, mask=mask_s, other=0.0)
        S = _ring_fold(S, rk_ptr + layer * srk_l + slot * srk_n + (hv // GROUP) * srk_h,
                       ru_ptr + layer * sru_l + slot * sru_n + hv * sru_h, rg_ptr + layer * srg_l + slot * srg_n + hv,
                       tl.load(pos_ptr + slot * 2), h, P, srk_p, sru_p, srg_p, offs_k, offs_v, mask_k, mask_v)
        tl.store(s_ptrs, S, mask=mask_s)


@triton.jit
def _ring_advance_kernel(pos_ptr, idx_ptr, n_ptr, B, P, fold_after, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < B
    slot = tl.load(idx_ptr + offs, mask=mask, other=0).to(tl.int64)
    n = tl.load(n_ptr + offs, mask=mask, other=0).to(tl.int32)
    start = tl.load(pos_ptr + slot * 2, mask=mask, other=0)
    h = tl.load(pos_ptr + slot * 2 + 1, mask=mask, other=0)
    flush = h > fold_after
    tl.store(pos_ptr + slot * 2, tl.where(flush, (start + h) % P, start), mask=mask)
    tl.store(pos_ptr + slot * 2 + 1, tl.where(flush, 0, h) + n, mask=mask)


# The decode kernel's launch (one warp per (sequence, value head, 32-wide dv tile): the token chain's reductions over
# dk stay inside a warp; docs/decisions.md): the same tile layout reduces in the same order, so a verified token's
# state and output have plain decoding's bits. The fold has no reductions: two warps per tile was fastest.
VERIFY_BLOCK_V, VERIFY_WARPS = DECODE_BLOCK_V, DECODE_WARPS
FOLD_BLOCK_V, FOLD_WARPS = 32, 2


def _block_v(dv: int, block_v, default: int) -> int:
    return block_v or min(next_pow2(dv), default)


def gdn_verify_triton(q, k, v, g, beta, state, state_idx, ring, fold_after=0, scale=None, raw_gates=None, out=None,
                      block_v=None, num_warps=None):
    B, T, Hk, dk, Hv, dv, P = _verify_shapes(q, k, v, g, beta, state, state_idx, ring, fold_after, raw_gates)
    for name, t in (("q", q), ("k", k), ("v", v), ("ring_k", ring[0]), ("ring_u", ring[1]), ("ring_g", ring[2]),
                    ("ring_pos", ring[3])):
        require_last_dim_contiguous(name, t)
    check(state.stride(-1) == 1, "state: last dimension (dv) must be contiguous")
    o = output(out, v.shape, v.dtype, v.device)
    require_last_dim_contiguous("out", o)
    scale = dk ** -0.5 if scale is None else float(scale)
    rk, ru, rg, pos = ring
    BV = _block_v(dv, block_v, VERIFY_BLOCK_V)
    _gdn_verify_kernel[(B, Hv, cdiv(dv, BV))](
        q, k, v, g, beta, o, state, state_idx, rk, ru, rg, pos,
        *(raw_gates if raw_gates is not None else (g, g)), T, P, fold_after, scale,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *g.stride(), *beta.stride(), *o.stride()[:3],
        *state.stride()[:3], *rk.stride()[:3], *ru.stride()[:3], *rg.stride()[:2],
        GROUP=Hv // Hk, DK=dk, DV=dv, BK=next_pow2(dk), BV=BV, RAW_GATES=raw_gates is not None,
        num_warps=num_warps or VERIFY_WARPS,
    )
    return o


def gdn_ring_advance_triton(ring_pos, state_idx, num_accepted, fold_after, P):
    B = state_idx.shape[0]
    _ring_advance_kernel[(1,)](ring_pos, state_idx, num_accepted, B, P, fold_after, BLOCK=max(16, next_pow2(B)))


def gdn_fold_triton(state, state_idx, ring, block_v=None, num_warps=None):
    rk, ru, rg, pos = ring
    P = _check_ring(ring, state, rk.shape[-2], rk.shape[-1])
    if state.dim() == 4:  # one layer: a layer axis of length 1
        state, rk, ru, rg = state[None], rk[None], ru[None], rg[None]
    Hv, dk, dv = state.shape[2:]
    check(state.stride(-1) == 1, "state: last dimension (dv) must be contiguous")
    BV = _block_v(dv, block_v, FOLD_BLOCK_V)
    NV = cdiv(dv, BV)
    B = state_idx.shape[0]
    _gdn_fold_kernel[(B, Hv, NV * state.shape[0])](
        state, state_idx, rk, ru, rg, pos,
        NV, P, *state.stride()[:4], *rk.stride()[:4], *ru.stride()[:4], *rg.stride()[:3],
        GROUP=Hv // rk.shape[3], DK=dk, DV=dv, BK=next_pow2(dk), BV=BV, num_warps=num_warps or FOLD_WARPS,
    )
    pos[state_idx.long()] = 0


def gdn_verify(q, k, v, g, beta, state, state_idx, ring, fold_after=0, scale=None, raw_gates=None, out=None,
               **launch):
    """q, k [B, T, Hk, dk], v [B, T, Hv, dv], g, beta [B, T, Hv] -> o [B, T, Hv, dv] (v.dtype), verified against
    each row's state with its pending tokens folded in; ring = (ring_k [slots, P, Hk, dk], ring_u [slots, P, Hv, dv],
    ring_g [slots, P, Hv] fp32, ring_pos [slots, 2] int32) receives the block's normalised keys, corrections and log
    decays after the pending rows; a row with more than fold_after pending tokens writes its folded state back
    (gdn_ring_advance then drops them). `launch`: block_v, num_warps (Triton only)."""
    if use_triton(q):
        return gdn_verify_triton(q, k, v, g, beta, state, state_idx, ring, fold_after, scale, raw_gates, out,
                                 **launch)
    return gdn_verify_ref(q, k, v, g, beta, state, state_idx, ring, fold_after, scale, raw_gates, out)


def gdn_ring_advance(ring_pos, state_idx, num_accepted, fold_after, P):
    """After a verify: rows with more than fold_after pending tokens drop them (their state was written back), then
    every row's first num_accepted[b] block tokens become pending. Every row must be live (state_idx >= 0; the
    speculative step's padding rows use a scratch slot)."""
    if use_triton(ring_pos):
        return gdn_ring_advance_triton(ring_pos, state_idx, num_accepted, fold_after, P)
    return _ring_advance_ref(ring_pos, state_idx, num_accepted, fold_after, P)


def gdn_fold(state, state_idx, ring, **launch):
    """state[state_idx[b]] <- that state with its pending ring tokens folded in, pending count <- 0. With a leading
    layer axis on state [L, slots, Hv, dk, dv] and on ring_k / ring_u / ring_g, every layer at once (one launch).
    Every row must be live (state_idx >= 0), each slot once."""
    if use_triton(state):
        return gdn_fold_triton(state, state_idx, ring, **launch)
    return gdn_fold_ref(state, state_idx, ring)


# ------------------------------------------------------------------------------------------------ conv1d half

def _conv_window(x, conv_state, state_idx):
    """[conv_state rows, x^T] -> [B, C, K-1+T] in fp32 (padding rows read slot 0; their results are unused)."""
    rows = state_idx.long().clamp(min=0)
    return torch.cat([conv_state[rows].float(), x.float().transpose(1, 2)], dim=-1)


def _validate_conv(x, conv_state, weight, state_idx):
    check(x.dim() == 3 and weight.dim() == 2 and weight.shape[0] == x.shape[2],
          f"x must be [B, T, C] and weight [C, K], got {tuple(x.shape)}, {tuple(weight.shape)}")
    K = weight.shape[1]
    check(conv_state.shape[1:] == (x.shape[2], K - 1), f"conv_state must be [slots, C, K-1], got {tuple(conv_state.shape)}")
    check(state_idx.shape == (x.shape[0],) and not state_idx.is_floating_point(),
          f"state_idx must be an integer tensor of shape [B={x.shape[0]}], got {tuple(state_idx.shape)}")


def causal_conv1d_verify_ref(x, conv_state, weight, state_idx, activation="silu", keep=None):
    """x [B, T, C] -> y [B, T, C] (x.dtype): the causal conv of the block after each row's conv state, computed as
    kernels/conv1d_update computes one token (fp32 sum over the K taps), without touching conv_state. keep: a
    [B, T, C] tensor that receives x (the block's inputs, which the commit reads)."""
    _validate_conv(x, conv_state, weight, state_idx)
    if keep is not None:
        keep.copy_(x)
    K = weight.shape[1]
    windows = _conv_window(x, conv_state, state_idx).unfold(-1, K, 1)  # [B, C, T, K]
    y = (windows * weight.float()[None, :, None, :]).sum(-1).transpose(1, 2)
    if activation == "silu":
        y = F.silu(y)
    return y.to(x.dtype).contiguous()


def conv_state_commit_ref(x, conv_state, state_idx, num_accepted):
    """conv_state rows state_idx <- the last K-1 inputs after the first num_accepted[b] tokens of x [B, T, C].
    Every row must be live (state_idx >= 0): the write is an index_copy, not masked. With a leading layer axis on
    x [L, B, T, C] and conv_state [L, slots, C, K-1], every layer."""
    if conv_state.dim() == 4:
        check(x.dim() == 4 and x.shape[0] == conv_state.shape[0],
              f"x must be [layers={conv_state.shape[0]}, B, T, C] with a layered conv_state, got {tuple(x.shape)}")
        for i in range(x.shape[0]):
            conv_state_commit_ref(x[i], conv_state[i], state_idx, num_accepted)
        return
    K1 = conv_state.shape[2]
    window = _conv_window(x, conv_state, state_idx)  # [B, C, K-1+T]
    cols = num_accepted.long()[:, None] + torch.arange(K1, device=x.device)[None, :]  # [B, K-1]
    new = window.gather(2, cols[:, None, :].expand(-1, window.shape[1], -1))
    conv_state.index_copy_(0, state_idx.long(), new.to(conv_state.dtype))


@triton.jit
def _window_tile(x_ptr, s_rows, c, mask_c, pos, sx_t, ss_c, K: tl.constexpr):
    """Window columns `pos` of [conv state (K - 1 columns) | x (T rows)] at channels `c` (c, mask_c and pos shaped
    to broadcast against each other: the tile's shape) -> fp32, zero where pos < 0 or masked. x_ptr points at this
    row's x[0, 0]."""
    from_state = pos < K - 1
    sv = tl.load(s_rows + c * ss_c + pos, mask=mask_c & from_state & (pos >= 0), other=0.0)
    xv = tl.load(x_ptr + (pos - (K - 1)) * sx_t + c, mask=mask_c & ~from_state, other=0.0)
    return sv.to(tl.float32) + xv.to(tl.float32)


@triton.jit
def _conv_verify_kernel(
    x_ptr, state_ptr, w_ptr, idx_ptr, y_ptr, keep_ptr,
    T, C, sx_b, sx_t, ss_n, ss_c, sw_c, sy_b, sy_t, sk_b, sk_t,
    K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, SILU: tl.constexpr, KEEP: tl.constexpr,
):
    # The whole block at once: a [BT, BC, BK] tile of windows (output t sees window columns t .. t + K - 1 of
    # [conv state | x]), summed over the taps as conv1d_update sums one token's [BC, BK] window. No loop over the
    # block: its loads are all in flight together.
    b, offs_c, mask_c, slot, _ = conv_program(idx_ptr, C, BC)  # padding rows read slot 0, as the reference does
    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    mask_t = offs_t < T
    x_row = x_ptr + b.to(tl.int64) * sx_b
    pos = tl.where((offs_k[None, :] < K) & mask_t[:, None], offs_t[:, None] + offs_k[None, :], -1)
    window = _window_tile(x_row, state_ptr + slot * ss_n, offs_c[None, :, None], mask_c[None, :, None],
                          pos[:, None, :], sx_t, ss_c, K)
    w = tl.load(w_ptr + offs_c[:, None] * sw_c + offs_k[None, :], mask=mask_c[:, None] & (offs_k[None, :] < K),
                other=0.0).to(tl.float32)
    y = tl.sum(window * w[None, :, :], axis=2)  # [BT, BC]
    if SILU:
        y = y * tl.sigmoid(y)
    tc = mask_t[:, None] & mask_c[None, :]
    tl.store(y_ptr + b.to(tl.int64) * sy_b + offs_t[:, None] * sy_t + offs_c[None, :],
             cast_rtne(y, y_ptr.dtype.element_ty), mask=tc)
    if KEEP:  # the block's inputs, for the commit
        xt = tl.load(x_row + offs_t[:, None] * sx_t + offs_c[None, :], mask=tc)
        tl.store(keep_ptr + b.to(tl.int64) * sk_b + offs_t[:, None] * sk_t + offs_c[None, :], xt, mask=tc)


@triton.jit
def _conv_commit_kernel(
    x_ptr, state_ptr, idx_ptr, n_ptr,
    C, sx_l, sx_b, sx_t, ss_l, ss_n, ss_c,
    K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr,
):
    # Grid (sequence, channel block, layer): every GDN layer's conv commit in one launch.
    b, offs_c, mask_c, slot, live = conv_program(idx_ptr, C, BC)
    layer = tl.program_id(2).to(tl.int64)
    offs_j = tl.arange(0, BK)
    s_rows = state_ptr + layer * ss_l + slot * ss_n
    n = tl.load(n_ptr + b).to(tl.int32)
    # new column j = window column n + j; the whole tile is read before any of it is written
    pos = tl.where(offs_j < K - 1, n + offs_j, -1)
    new = _window_tile(x_ptr + layer * sx_l + b.to(tl.int64) * sx_b, s_rows, offs_c[:, None], (mask_c & live)[:, None],
                       pos[None, :], sx_t, ss_c, K)
    tl.store(s_rows + offs_c[:, None] * ss_c + offs_j[None, :], new.to(state_ptr.dtype.element_ty),
             mask=(mask_c & live)[:, None] & (offs_j < K - 1)[None, :])


def _conv_block_c(C: int, block_c) -> int:
    return block_c or min(next_pow2(C), 256)


def causal_conv1d_verify_triton(x, conv_state, weight, state_idx, activation="silu", keep=None, block_c=None,
                                num_warps=None):
    _validate_conv(x, conv_state, weight, state_idx)
    check(activation in (None, "silu"), f"activation must be None or 'silu', got {activation!r}")
    check(keep is None or (keep.shape == x.shape and keep.dtype == x.dtype),
          f"keep must be {x.dtype} {tuple(x.shape)}, got {None if keep is None else (keep.dtype, tuple(keep.shape))}")
    for name, t in (("x", x), ("conv_state", conv_state), ("weight", weight)) + ((("keep", keep),) if keep is not None
                                                                                 else ()):
        require_last_dim_contiguous(name, t)
    B, T, C = x.shape
    K = weight.shape[1]
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    BT = next_pow2(T)
    BC = block_c or max(16, min(next_pow2(C), 1024 // BT))  # the [BT, BC, BK] window tile: 4K values at K = 4
    kp = keep if keep is not None else y
    _conv_verify_kernel[(B, cdiv(C, BC))](
        x, conv_state, weight, state_idx, y, kp, T, C, x.stride(0), x.stride(1), conv_state.stride(0),
        conv_state.stride(1), weight.stride(0), y.stride(0), y.stride(1), kp.stride(0), kp.stride(1),
        K=K, BK=next_pow2(K), BT=BT, BC=BC, SILU=activation == "silu", KEEP=keep is not None,
        num_warps=num_warps or 4,
    )
    return y


def conv_state_commit_triton(x, conv_state, state_idx, num_accepted, block_c=None, num_warps=None):
    """conv_state_commit_ref's contract, except that padding rows (state_idx < 0) are skipped."""
    if conv_state.dim() == 3:  # one layer: a layer axis of length 1
        x, conv_state = x[None], conv_state[None]
    check(x.dim() == 4 and x.shape[0] == conv_state.shape[0],
          f"x must be [layers={conv_state.shape[0]}, B, T, C] with a layered conv_state, got {tuple(x.shape)}")
    L, B, T, C = x.shape
    K = conv_state.shape[3] + 1
    check(conv_state.shape[2] == C, f"conv_state must be [slots, C={C}, K-1], got {tuple(conv_state.shape)}")
    check(num_accepted.shape == (B,) and state_idx.shape == (B,), "num_accepted and state_idx must be [B]")
    for name, t in (("x", x), ("conv_state", conv_state)):
        require_last_dim_contiguous(name, t)
    BC = _conv_block_c(C, block_c)
    _conv_commit_kernel[(B, cdiv(C, BC), L)](
        x, conv_state, state_idx, num_accepted, C, *x.stride()[:3], *conv_state.stride()[:3],
        K=K, BK=next_pow2(K - 1), BC=BC, num_warps=num_warps or 4,
    )


def causal_conv1d_verify(x, conv_state, weight, state_idx, activation="silu", keep=None, **launch):
    """x [B, T, C] -> y [B, T, C] (x.dtype): the block's causal conv after each row's conv state, which is not
    touched; keep [B, T, C] (optional) receives x in the same launch. `launch`: block_c, num_warps (Triton)."""
    if use_triton(x):
        return causal_conv1d_verify_triton(x, conv_state, weight, state_idx, activation, keep, **launch)
    return causal_conv1d_verify_ref(x, conv_state, weight, state_idx, activation, keep)


def conv_state_commit(x, conv_state, state_idx, num_accepted, **launch):
    """conv_state rows state_idx <- the last K-1 inputs after the first num_accepted[b] tokens of x [B, T, C]; with
    a leading layer axis on x [L, B, T, C] and conv_state [L, slots, C, K-1], every layer at once (one launch)."""
    if use_triton(x):
        return conv_state_commit_triton(x, conv_state, state_idx, num_accepted, **launch)
    return conv_state_commit_ref(x, conv_state, state_idx, num_accepted)
