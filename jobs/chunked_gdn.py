"""Training-time chunked gated delta rule for transformers' Qwen3.5 Gated DeltaNet layers, in fewer torch ops.

Without fla (whose backward refuses this H200 image's Triton on Hopper), transformers runs its torch fallback, which
dispatches ~45 ops for every 64-token chunk of every layer under training's autocast: at 1,536 px pages (~2,100
tokens) the 12 layers dispatch 20,940 ops forward (95 % of the forward's ops) and ~32 k backward a step
(bench/results/ocria_tiny_op_count_1536.json).
Each op costs host time on the GPU however small its tensors. Here the same arithmetic runs with the heads folded into
the batch, the per-chunk operands split once before the scan and each chunk's three updates as fused batched
multiply-adds: 5 ops a chunk. transformers' function is the reference (tests/test_chunked_gdn.py).

The recurrence, per head, with S the [k, v] state, for the chunks c of a sequence (positions i, j within a chunk,
g the per-token log decay, gamma its cumulative sum within the chunk, beta the write strength):
  Gamma_ij = exp(gamma_i - gamma_j) for i >= j, else 0
  T = I + strictly_lower((beta k) k^T * Gamma)           (unit lower triangular)
  U = T^-1 (beta v),  W = T^-1 (beta k exp(gamma))        (the UT transform: a chunk's delta updates at once)
  new_c = U_c - W_c S
  out_c = (q exp(gamma))_c S + ((q k^T) * Gamma)_c new_c
  S <- exp(gamma_last) S + (k exp(gamma_last - gamma))_c^T new_c
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


def chunked_gated_delta_rule(query, key, value, g, beta, chunk_size: int = 64, initial_state=None,
                             output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, **kwargs):
    """transformers.models.qwen3_5's torch_chunk_gated_delta_rule, same arguments and results: query/key [B, T, H, k],
    value [B, T, H, v], g/beta [B, T, H] -> (out [B, T, H, v] in query's dtype, final state [B, H, k, v] or None).
    `cu_seqlens` (packed sequences) is not supported, as in the reference."""
    if kwargs.get("cu_seqlens") is not None:
        raise ValueError("chunked_gated_delta_rule: packed sequences (cu_seqlens) are not supported")
    # in fp32 throughout, also under training's bf16 autocast: the state is a running sum over the whole sequence
    # (transformers' fallback keeps it in fp32 too), and autocast's casts would add ops to every chunk
    with torch.autocast(query.device.type, enabled=False):
        return _chunked(query, key, value, g, beta, chunk_size, initial_state, output_final_state,
                        use_qk_l2norm_in_kernel)


def _chunked(query, key, value, g, beta, chunk_size, initial_state, output_final_state, use_qk_l2norm_in_kernel):
    dtype = query.dtype
    b, t, h, dk = key.shape
    dv = value.shape[-1]
    q, k, v, beta, g = (x.transpose(1, 2).float() for x in (query, key, value, beta, g))  # [B, H, T, ...]
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * dk ** -0.5
    pad = -t % chunk_size
    n = (t + pad) // chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, pad)).reshape(b * h, n, chunk_size, -1) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)).reshape(b * h, n, chunk_size, 1) for x in (beta, g))

    gamma = g.cumsum(2)  # [BH, n, C, 1]
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    decay = (gamma - gamma.transpose(-1, -2)).masked_fill(~causal, float("-inf")).exp()  # Gamma, [BH, n, C, C]
    k_beta = k * beta
    ut = (k_beta @ k.transpose(-1, -2)) * decay  # its diagonal is ignored: the solve is unit triangular
    u = torch.linalg.solve_triangular(ut, v * beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(ut, k_beta * gamma.exp(), upper=False, unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * gamma.exp()
    k_decayed_t = (k * (gamma[:, :, -1:] - gamma).exp()).transpose(-1, -2)  # [BH, n, k, C]
    chunk_decay = gamma[:, :, -1:].exp()  # [BH, n, 1, 1]

    state = (torch.zeros(b * h, dk, dv, dtype=torch.float32, device=q.device) if initial_state is None
             else initial_state.reshape(b * h, dk, dv).float())
    outs = []
    for u_c, w_c, q_c, a_c, kt_c, d_c in zip(*(x.unbind(1) for x in (u, w, q_decayed, intra, k_decayed_t,
                                                                       chunk_decay))):
        new = torch.baddbmm(u_c, w_c, state, alpha=-1.0)
        outs.append(torch.baddbmm(torch.bmm(q_c, state), a_c, new))
        state = torch.baddbmm(state * d_c, kt_c, new)
    out = torch.stack(outs, 1).reshape(b, h, n * chunk_size, dv)[:, :, :t].transpose(1, 2).contiguous().to(dtype)
    return out, (state.reshape(b, h, dk, dv) if output_final_state else None)


@contextlib.contextmanager
def chunked_gdn_in(modeling_module):
    """Within the block, transformers' Qwen3.5 Gated DeltaNet layers (`modeling_module`, e.g.
    transformers.models.qwen3_5.modeling_qwen3_5) run chunked_gated_delta_rule for whole sequences; restored on exit.
    The layers call the module's function by name, so it is swapped there, for the block only."""
    name = "torch_chunk_gated_delta_rule"
    original = getattr(modeling_module, name)
    setattr(modeling_module, name, chunked_gated_delta_rule)
    try:
        yield
    finally:
        setattr(modeling_module, name, original)
