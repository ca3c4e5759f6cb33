"""Multi-token (prefill) forms of the GDN layer's two recurrences, over a packed batch of sequences:
the causal depthwise conv1d and the gated delta rule. Decode (one token) uses kernels.* instead.

On CUDA the delta rule runs flash-linear-attention's chunked kernel when fla is importable, otherwise the chunked
torch form below over every sequence of the step at once; on CPU that form one sequence at a time.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops import l2norm_ref, use_triton
from engine.step_metadata import GDN_CHUNK, StepMetadata, chunked_layout

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


def chunked_delta_rule_torch(q, k, v, g, beta, states, rows, n_chunks: int, chunk: int = GDN_CHUNK):
    """All sequences of a step at once. Packed q, k [N, Hk, dk]; v [N, Hv, dv]; g (log decay), beta [N, Hv];
    states [S, Hv, dk, dv] fp32, one per sequence; rows [N]: each token's row in the [S, n_chunks * chunk] layout
    (step_metadata.chunked_layout). Zero padding leaves a state unchanged (beta = 0 writes nothing, g = 0 keeps it).

    Within a chunk with cumulative log decay G and entry state S0, the per-token corrections u solve the unit
    lower-triangular system (I + A) u = beta*v - beta*exp(G)*k S0, A[t,s] = beta_t exp(G_t-G_s) k_t.k_s (s < t);
    then o_t = exp(G_t) q_t S0 + sum_{s<=t} exp(G_t-G_s) (q_t.k_s) u_s and
    S_end = exp(G_C) S0 + sum_s exp(G_C-G_s) k_s u_s^T. Everything but the terms in S0 is computed for all chunks at
    once; only the state's hand-over runs chunk by chunk, as three batched multiply-adds a chunk (each op costs host
    time however small its tensors). Differentiable: ocria-tiny's training runs it (research/ocria_tiny/chunked_gdn.py). Returns
    (o [N, Hv, dv] in v.dtype, final states [S, Hv, dk, dv] fp32).
    """
    Hk, dk = q.shape[1], q.shape[2]
    Hv, dv = v.shape[1], v.shape[2]
    S, group = states.shape[0], Hv // Hk
    qf = (l2norm_ref(q.float()) * dk**-0.5).repeat_interleave(group, 1)
    kf = l2norm_ref(k.float()).repeat_interleave(group, 1)

    def blocks(t):  # [N, Hv, ...] -> [S, Hv, n, chunk, ...], zero padded
        t = t.float()
        lay = t.new_zeros((S * n_chunks * chunk, *t.shape[1:])).index_copy_(0, rows, t)
        return lay.view(S, n_chunks, chunk, *t.shape[1:]).movedim(3, 1).contiguous()

    Q, Kb, V, G, B = blocks(qf), blocks(kf), blocks(v), blocks(g), blocks(beta)
    G = G.cumsum(-1)
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(incl, G[..., :, None] - G[..., None, :], float("-inf")).exp()  # [S, Hv, n, C, C]
    kk = Kb @ Kb.transpose(-1, -2)
    A = (B[..., :, None] * kk * decay).tril(-1)
    T = A + torch.eye(chunk, device=q.device)
    U0 = torch.linalg.solve_triangular(T, B[..., None] * V, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(T, (B * G.exp())[..., None] * Kb, upper=False, unitriangular=True)
    QK = (Q @ Kb.transpose(-1, -2)) * decay
    Qd = Q * G.exp()[..., None]
    Kd = Kb * (G[..., -1:] - G).exp()[..., None]
    chunk_decay = G[..., -1].exp()[..., None, None]  # [S, Hv, n, 1, 1]

    # the scan with sequences and heads folded into one batch dimension, each operand split into chunks once
    St = states.float().reshape(S * Hv, dk, dv)
    per_chunk = (t.reshape(S * Hv, n_chunks, *t.shape[3:]).unbind(1)
                 for t in (U0, W, Qd, QK, Kd.transpose(-1, -2), chunk_decay))
    outs = []
    for u0, w, qd, qk, kd_t, d in zip(*per_chunk):
        u = torch.baddbmm(u0, w, St, alpha=-1.0)
        outs.append(torch.baddbmm(torch.bmm(qd, St), qk, u))
        St = torch.baddbmm(St * d, kd_t, u)
    O = torch.stack(outs, 1).view(S, Hv, n_chunks, chunk, dv)
    o = O.movedim(1, 3).reshape(S * n_chunks * chunk, Hv, dv).index_select(0, rows)
    return o.to(v.dtype), St.view(S, Hv, dk, dv)


def delta_rule_per_sequence(q, k, v, g, beta, states, query_lens: list[int]):
    """`chunked_delta_rule_torch` once per sequence (packed inputs as there): the CPU path, where one sequence's
    working set stays in cache."""
    outs, finals, start = [], [], 0
    for i, n in enumerate(query_lens):
        sl = slice(start, start + n)
        rows, n_chunks = chunked_layout([n])
        o, s = chunked_delta_rule_torch(q[sl], k[sl], v[sl], g[sl], beta[sl], states[i:i + 1],
                                        torch.from_numpy(rows).to(q.device), n_chunks)
        outs.append(o)
        finals.append(s)
        start += n
    return torch.cat(outs), torch.cat(finals)


def delta_rule_fla(q, k, v, g, beta, states, cu_seqlens, cu_seqlens_cpu):
    """fla's varlen chunked kernel (CUDA, fla installed); same inputs and outputs as `chunked_delta_rule_torch`."""
    o, final = _fla_chunk(q[None], k[None], v[None], g[None], beta[None], initial_state=states,
                          output_final_state=True, use_qk_l2norm_in_kernel=True,
                          cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
    return o[0], final


def delta_rule_prefill(q, k, v, g, beta, ssm_state: torch.Tensor, meta: StepMetadata):
    """Packed q, k [N, Hk, dk], v [N, Hv, dv], g, beta [N, Hv] -> o [N, Hv, dv]; updates the step's sequences'
    ssm_state rows (meta.state_idx) in place."""
    init = ssm_state[meta.state_idx].float()  # stepped in fp32 whatever the pool's dtype
    if _fla_chunk is not None and q.is_cuda:
        o, final = delta_rule_fla(q, k, v, g, beta, init, meta.cu_seqlens, meta.cu_seqlens_cpu)
    elif use_triton(q):  # GPU path: the whole step in one call, ~1/S of the launches of a call per sequence
        o, final = chunked_delta_rule_torch(q, k, v, g, beta, init, meta.chunked_rows, meta.chunks_per_seq)
    else:  # CPU: a call per sequence keeps the working set in cache (bench/gdn_prefill_bench.py: 1.6x faster)
        o, final = delta_rule_per_sequence(q, k, v, g, beta, init, meta.query_lens)
    ssm_state[meta.state_idx] = final.to(ssm_state.dtype)
    return o
