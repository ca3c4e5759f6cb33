"""Token selection: greedy argmax, or temperature / top-k / top-p sampling with one torch.Generator per request,
so a request's samples depend only on its own seed and logits, never on what else is in the batch."""
from __future__ import annotations

import torch

from engine.sequence import Sequence
from engine.step_metadata import to_device


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [B, V] (already temperature-scaled); top_k [B] (0 = off), top_p [B] (1 = off) -> masked logits."""
    V = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(V, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, V).clamp(max=V)
    drop = ranks >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # probability of strictly better tokens
    drop |= mass_before > top_p[:, None]  # keep the smallest prefix reaching top_p (the best token always stays)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class Sampler:
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """logits [B, V] fp32 -> one token id per sequence, [B] int64 on the logits' device (no host sync). A
        sequence's banned token (Sequence.loop_ban) is never chosen."""
        bans = [(row, tok) for row, s in enumerate(seqs) if (tok := s.loop_ban()) is not None]
        if bans:
            rows, toks = zip(*bans)
            dev = logits.device
            logits = logits.clone()  # the caller's logits stay as the model gave them (keep_logits)
            logits[to_device(list(rows), torch.int64, dev), to_device(list(toks), torch.int64, dev)] = -torch.inf
        tokens = logits.argmax(dim=-1)
        rows = [i for i, s in enumerate(seqs) if s.sampling.temperature > 0]
        if rows:
            dev = logits.device
            idx = to_device(rows, torch.int64, dev)
            temp = to_device([seqs[i].sampling.temperature for i in rows], torch.float32, dev)
            top_k = to_device([seqs[i].sampling.top_k for i in rows], torch.int64, dev)
            top_p = to_device([seqs[i].sampling.top_p for i in rows], torch.float32, dev)
            probs = filter_logits(logits[idx] / temp[:, None], top_k, top_p).softmax(-1)
            # Exponential-race sampling: argmax(p / E), E ~ Exp(1), draws from p with no host sync.
            noise = torch.stack([torch.empty_like(probs[j]).exponential_(generator=seqs[i].generator)
                                 for j, i in enumerate(rows)])
            tokens[idx] = (probs / noise).argmax(dim=-1)
        return tokens
