"""Multi-token (prefill) forms of the GDN layer's two recurrences, over a packed batch of sequences:
the causal depthwise conv1d and the gated delta rule. Decode (one token) uses kernels.* instead.

On CUDA the delta rule runs flash-linear-attention's chunked kernel when fla is importable; otherwise (and on CPU)
the chunked torch form below, one sequence at a time.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops import l2norm_ref

try:  # optional GPU dependency (fla-core): varlen chunked gated delta rule in Triton
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as _fla_chunk
except Exception:  # noqa: BLE001  (any import failure just means "not available")
    _fla_chunk = None


def fla_available() -> bool:
    return _fla_chunk is not None


def conv1d_prefill_varlen(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, slots: list[int],
                          query_lens: list[int]) -> torch.Tensor:
    """x [N, C] packed chunks; conv_state[slot] [C, K-1] holds each sequence's previous K-1 inputs (zeros if new).

    One conv over the concatenation of [state_i, x_i] segments: every output window then lies inside one segment.
    Returns silu(conv) [N, C] and writes each sequence's last K-1 inputs back into conv_state.
    """
    K = weight.shape[1]
    pieces, start = [], 0
    for slot, n in zip(slots, query_lens):
        pieces.append(conv_state[slot].t().to(x.dtype))
        pieces.append(x[start:start + n])
        start += n
    ext = torch.cat(pieces, 0)  # [sum(n_i + K - 1), C]
    y_ext = F.conv1d(ext.t()[None], weight[:, None, :].to(x.dtype), groups=weight.shape[0])[0]  # [C, T_ext-K+1]
    outs, off = [], 0
    for slot, n in zip(slots, query_lens):
        outs.append(y_ext[:, off:off + n])
        conv_state[slot] = ext[off + n: off + n + K - 1].t().to(conv_state.dtype)
        off += n + K - 1
    return F.silu(torch.cat(outs, 1).t())


def chunked_delta_rule_torch(q, k, v, g, beta, state, chunk: int = 64):
    """One sequence. q, k [L, Hk, dk]; v [L, Hv, dv]; g (log decay), beta [L, Hv]; state [Hv, dk, dv] fp32.

    Within a chunk with cumulative log decay G and entry state S0, the per-token corrections u solve the unit
    lower-triangular system (I + A) u = beta*v - beta*exp(G)*k S0, A[t,s] = beta_t exp(G_t-G_s) k_t.k_s (s < t);
    then o_t = exp(G_t) q_t S0 + sum_{s<=t} exp(G_t-G_s) (q_t.k_s) u_s and
    S_end = exp(G_C) S0 + sum_s exp(G_C-G_s) k_s u_s^T. Returns (o [L, Hv, dv] in v.dtype, final state fp32).
    """
    L, Hk, dk = q.shape
    Hv, dv = v.shape[1], v.shape[2]
    group = Hv // Hk
    qf = (l2norm_ref(q.float()) * dk**-0.5).repeat_interleave(group, 1)
    kf = l2norm_ref(k.float()).repeat_interleave(group, 1)
    pad = (-L) % chunk
    n = (L + pad) // chunk

    def blocks(t):  # [L, Hv, ...] -> [Hv, n, chunk, ...], zero padded (padding tokens leave the state unchanged)
        t = t.float().transpose(0, 1)
        t = F.pad(t, (0, 0, 0, pad)) if t.dim() == 3 else F.pad(t, (0, pad))
        return t.reshape(Hv, n, chunk, *t.shape[2:])

    Q, Kb, V, G, B = blocks(qf), blocks(kf), blocks(v), blocks(g), blocks(beta)
    G = G.cumsum(-1)
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(incl, G[..., :, None] - G[..., None, :], float("-inf")).exp()  # [Hv, n, C, C]
    kk = Kb @ Kb.transpose(-1, -2)
    A = (B[..., :, None] * kk * decay).tril(-1)
    T = A + torch.eye(chunk, device=q.device)
    U0 = torch.linalg.solve_triangular(T, B[..., None] * V, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(T, (B * G.exp())[..., None] * Kb, upper=False, unitriangular=True)
    QK = (Q @ Kb.transpose(-1, -2)) * decay
    Qd = Q * G.exp()[..., None]
    Kd = Kb * (G[..., -1:] - G).exp()[..., None]
    chunk_decay = G[..., -1].exp()  # [Hv, n]

    S = state.float().clone()
    O = torch.empty(Hv, n, chunk, dv, dtype=torch.float32, device=q.device)
    for c in range(n):
        U = U0[:, c] - W[:, c] @ S
        O[:, c] = Qd[:, c] @ S + QK[:, c] @ U
        S = S * chunk_decay[:, c, None, None] + Kd[:, c].transpose(-1, -2) @ U
    o = O.reshape(Hv, n * chunk, dv)[:, :L].transpose(0, 1)
    return o.to(v.dtype), S


def delta_rule_prefill(q, k, v, g, beta, ssm_state: torch.Tensor, slots: list[int], slots_dev: torch.Tensor,
                       query_lens: list[int], cu_seqlens: torch.Tensor | None, cu_seqlens_cpu: torch.Tensor | None):
    """Packed q, k [N, Hk, dk], v [N, Hv, dv], g, beta [N, Hv] -> o [N, Hv, dv]; updates ssm_state rows in place."""
    if _fla_chunk is not None and q.is_cuda:
        init = ssm_state[slots_dev]
        o, final = _fla_chunk(q[None], k[None], v[None], g[None], beta[None], initial_state=init,
                              output_final_state=True, use_qk_l2norm_in_kernel=True,
                              cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
        ssm_state[slots_dev] = final.to(ssm_state.dtype)
        return o[0]
    outs, start = [], 0
    for slot, n in zip(slots, query_lens):
        sl = slice(start, start + n)
        o, S = chunked_delta_rule_torch(q[sl], k[sl], v[sl], g[sl], beta[sl], ssm_state[slot])
        ssm_state[slot] = S
        outs.append(o)
        start += n
    return torch.cat(outs, 0)
