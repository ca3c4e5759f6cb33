"""Beam search for one request, with the choices transformers' generate(num_beams=k, early_stopping=True) makes.

A beam request is k member sequences (each with its own GDN state slot and KV blocks) that are always decoded in
the same step. Each step `select_beams` picks, on the device and for all beam requests of the same shape at once,
the k best unfinished continuations and the finished candidates among the k best overall; the engine then copies
each chosen parent's GDN state row and the KV blocks it wrote since the prompt into the member that continues it, so
the next step can launch before the host has seen this step's choices. The host rebuilds the members' token lists and
keeps the finished hypotheses when it collects the step (`BeamGroup.apply`). The search ends once k hypotheses have
finished (early stopping) or at max_tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sequence import Sequence

# transformers' mask for continuations that must not be chosen; a score this low never wins a comparison
MASKED = -1.0e9


@dataclass
class BeamChoice:
    """One step's choices for G beam requests of the same shape (row g: request g): device tensors at launch, host
    copies once collected."""
    parents: torch.Tensor  # [G, k] the scored row each running beam continues
    tokens: torch.Tensor  # [G, k] its new token
    cand_parents: torch.Tensor  # [G, k] the k best continuations overall (finished ones become hypotheses)
    cand_tokens: torch.Tensor  # [G, k]
    cand_scores: torch.Tensor  # [G, k] log-probability / generated length ** length_penalty
    cand_finished: torch.Tensor  # [G, k] bool: ends with a stop token, or reaches max_tokens
    num_rows: int  # rows scored per request: 1 on the prompt's last token, else k

    def to_host(self) -> BeamChoice:
        moved = {k: v.to("cpu", non_blocking=True) for k, v in vars(self).items() if torch.is_tensor(v)}
        return BeamChoice(**moved, num_rows=self.num_rows)


def select_beams(logits: torch.Tensor, scores: torch.Tensor, num_beams: int, stop_ids: torch.Tensor,
                 length_norm: torch.Tensor, at_max_tokens: torch.Tensor) -> tuple[BeamChoice, torch.Tensor]:
    """logits [G, n, V] of G requests' running beams (n = 1 on the prompt's last token), scores [G, n] their summed
    log-probabilities, length_norm [G] (tokens each continuation will have) ** length_penalty, at_max_tokens [G]
    bool. -> (choice, new scores [G, k])."""
    G, n, V = logits.shape
    total = (torch.log_softmax(logits.float(), dim=-1) + scores[..., None]).view(G, n * V)
    # keep enough candidates that k unfinished ones remain even if every beam's best tokens are stop tokens
    keep = min(max(2, 1 + stop_ids.numel()) * num_beams, n * V)
    top, flat = total.topk(keep, dim=-1)
    parents, tokens = flat // V, flat % V
    finished = torch.isin(tokens, stop_ids) | at_max_tokens[:, None]
    run_scores, run = (top + finished.float() * MASKED).topk(num_beams, dim=-1)
    k = num_beams
    choice = BeamChoice(parents.gather(1, run), tokens.gather(1, run), parents[:, :k], tokens[:, :k],
                        top[:, :k] / length_norm[:, None], finished[:, :k], n)
    return choice, run_scores


class BeamGroup:
    """The k member sequences of one beam request (the first is the request's own sequence) and its hypotheses."""

    def __init__(self, members: list[Sequence], length_penalty: float, device: torch.device):
        self.members = members
        self.width = len(members)
        self.length_penalty = length_penalty
        self.stop_tuple = tuple(sorted(members[0].stop_ids))
        self.stop_ids = torch.tensor(self.stop_tuple, dtype=torch.int64, device=device)
        self.device = device
        self.reset()
        for m in members:
            m.beam = self

    @property
    def leader(self) -> Sequence:
        return self.members[0]

    @property
    def scored(self) -> list[Sequence]:
        """The sequences whose logits this step's choice is made from."""
        return self.members if self.forked else [self.leader]

    def shape_key(self) -> tuple:
        """Requests with equal keys are selected together (one select_beams call)."""
        return len(self.scored), self.width, self.stop_tuple

    def reset(self) -> None:
        """Back to the state before the prompt's last token was scored (new, or preempted: the search restarts)."""
        self.scores = torch.zeros(1, dtype=torch.float32, device=self.device)
        self.forked = False  # members other than the leader hold the prompt's caches
        self.hypotheses: list[tuple[float, list[int]]] = []  # (score, output ids), best first, at most k

    def next_length(self) -> tuple[float, bool]:
        """(length ** length_penalty, whether it reaches max_tokens) of the continuations scored this step."""
        generated = self.leader.num_output + 1  # placeholders count: the host may be a step behind
        return float(generated) ** self.length_penalty, generated >= self.leader.sampling.max_tokens

    def apply(self, choice: BeamChoice, row: int) -> bool:
        """Apply a collected step (host tensors, this request's row): keep its finished candidates, give each member
        its parent's outputs plus its new token. -> True when the search is over."""
        rows = self.members[:choice.num_rows]
        outputs = [m.token_ids[m.prompt_len:m.num_known] for m in rows]
        new = [(s, outputs[p] + [t]) for p, t, s, f in zip(
            choice.cand_parents[row].tolist(), choice.cand_tokens[row].tolist(), choice.cand_scores[row].tolist(),
            choice.cand_finished[row].tolist()) if f]
        # sorted() is stable: on equal scores the earlier hypothesis stays ahead
        self.hypotheses = sorted(self.hypotheses + new, key=lambda h: -h[0])[:self.width]
        for m, p, t in zip(self.members, choice.parents[row].tolist(), choice.tokens[row].tolist()):
            in_flight = m.token_ids[m.num_known + 1:]  # placeholders of steps launched after this one
            m.token_ids = m.token_ids[:m.prompt_len] + outputs[p] + [t] + in_flight
            m.num_known += 1
        return len(self.hypotheses) >= self.width

    def best(self) -> list[int]:
        return self.hypotheses[0][1]
