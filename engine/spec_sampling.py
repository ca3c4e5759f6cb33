"""Lossless acceptance of a drafted block, on the device (no host sync).

A block row s holds the verified token and T - 1 drafts; the target's logits at block position j score the token at
position j + 1. valid[s] (1 .. T) caps the block: only the first valid[s] - 1 drafts may be accepted.

greedy: accept the longest prefix of drafts equal to the target's argmax; emit them and the argmax after them (the
    target's own greedy continuation, token for token).
sampling (Leviathan et al. 2023; Chen et al. 2023): accept draft x_j with probability min(1, p_j(x_j) / q_j(x_j))
    (u q < p), stop at the first rejection and draw its replacement from norm(max(0, p_j - q_j)) (p_j where that
    is all zero); when every allowed draft is accepted, draw the bonus from p at the next position. p and q are the
    target's and drafter's distributions after the same temperature / top-k / top-p transform. Draws use the
    exponential race argmax(w / E), E ~ Exp(1), which samples in proportion to w without normalising or syncing.
"""
from __future__ import annotations

import torch


def accepted_prefix(ok: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """ok [S, T-1] per-draft acceptance -> accepted count a [S] (leading run of accepted drafts, < valid)."""
    j = torch.arange(ok.shape[1], device=ok.device)
    ok = ok & (j[None, :] < (valid[:, None] - 1))
    return ok.long().cumprod(1).sum(1)


def greedy_accept(drafts: torch.Tensor, target_logits: torch.Tensor, valid: torch.Tensor):
    """drafts [S, T-1], target_logits [S, T, V] -> (tokens [S, T], emitted [S] = a + 1): tokens[:, :a + 1] are the
    output."""
    posterior = target_logits.argmax(-1)
    a = accepted_prefix(drafts == posterior[:, :-1], valid)
    return posterior, a + 1


def rejection_accept(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, valid: torch.Tensor,
                     uniform: torch.Tensor, resid_noise: torch.Tensor, bonus_noise: torch.Tensor):
    """drafts [S, T-1] drawn from q [S, T-1, V]; p [S, T, V] target probabilities; uniform [S, T-1] ~ U(0, 1);
    resid_noise [S, T-1, V], bonus_noise [S, T, V] ~ Exp(1) -> (tokens [S, T], emitted [S])."""
    S, T = p.shape[:2]
    idx = drafts[..., None]
    px = p[:, :-1].gather(-1, idx)[..., 0]
    qx = q.gather(-1, idx)[..., 0]
    a = accepted_prefix(uniform * qx < px, valid)
    resid = (p[:, :-1] - q).clamp(min=0)
    resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, p[:, :-1])
    resid_tok = (resid / resid_noise).argmax(-1)  # [S, T-1]
    bonus_tok = (p / bonus_noise).argmax(-1)  # [S, T]
    rows = torch.arange(S, device=p.device)
    all_taken = a >= valid - 1
    last = torch.where(all_taken, bonus_tok[rows, a], resid_tok[rows, a.clamp(max=T - 2)])
    j = torch.arange(T, device=p.device)[None, :]
    padded = torch.cat([drafts, drafts[:, :1]], dim=1)
    tokens = torch.where(j < a[:, None], padded, last[:, None])
    return tokens, a + 1
