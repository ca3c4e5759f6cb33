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

from engine.block_manager import blocks_for
from engine.sequence import Sequence
from engine.step_metadata import to_device

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


class BeamStepper:
    """The engine's side of beam requests within a step: the device-side choices, the copy of the chosen parents'
    caches into the members that continue them, and the end of a request."""

    def __init__(self, scheduler, runner, block_size: int, device: torch.device):
        self.scheduler, self.runner, self.block_size, self.device = scheduler, runner, block_size, device

    def step(self, seqs: list[Sequence], tokens: torch.Tensor, logits: torch.Tensor):
        """Beam requests' choices for this step (one selection per shape of request, not per request), their
        parents' caches copied to the members that continue them.
        -> (the other sequences, their tokens and logits rows, [(requests, their choice)])."""
        row_of = {id(s): i for i, s in enumerate(seqs)}
        others = [i for i, s in enumerate(seqs) if s.beam is None]
        by_shape: dict[tuple, list[BeamGroup]] = {}
        for group in dict.fromkeys(s.beam for s in seqs if s.beam is not None):
            by_shape.setdefault(group.shape_key(), []).append(group)
        beams = []
        for (n, k, _), groups in by_shape.items():
            rows = to_device([row_of[id(m)] for g in groups for m in g.scored], torch.int64, self.device)
            norm, at_max = zip(*(g.next_length() for g in groups))
            scores = torch.stack([g.scores for g in groups])
            choice, new_scores = select_beams(logits[rows].view(len(groups), n, -1), scores, k, groups[0].stop_ids,
                                              to_device(norm, torch.float32, self.device),
                                              to_device(at_max, torch.bool, self.device))
            for g, row_scores in zip(groups, new_scores):
                g.scores = row_scores
            beams.append((groups, choice))
        self.copy_to_members(beams)
        for groups, _ in beams:
            for group in groups:
                if not group.forked:
                    group.forked = True
                    self.scheduler.join(group.members[1:])
        idx = to_device(others, torch.int64, self.device)
        return [seqs[i] for i in others], tokens[idx], logits[idx], beams


    def copy_to_members(self, beams: list[tuple[list[BeamGroup], BeamChoice]]) -> None:
        """Each member gets the GDN state row and KV blocks of the scored sequence it continues, for all beam
        requests in one copy. Blocks before the prompt's last full one are the same in every member (copied once,
        when the prompt is done). The parents are on the device, so the sources are gathered there: per member,
        the offset of its request's scored slots; per block, the offset of its request's scored block tables."""
        bs = self.block_size
        scored_slots, slot_base, dst_slots = [], [], []
        tables, blk_member, blk_base, blk_count, dst_blocks = [], [], [], [], []
        for groups, _ in beams:
            for g in groups:
                scored = g.scored
                first = scored[0].prompt_len // bs if g.forked else 0
                nb = blocks_for(scored[0].num_computed, bs) - first
                base_slot, base_table = len(scored_slots), len(tables)
                scored_slots += [s.state_slot for s in scored]
                for s in scored:
                    tables += s.block_table[first:first + nb]
                for m in g.members:
                    member = len(dst_slots)
                    slot_base.append(base_slot)
                    dst_slots.append(m.state_slot)
                    dst_blocks += m.block_table[first:first + nb]
                    blk_member += [member] * nb
                    blk_base += range(base_table, base_table + nb)
                    blk_count += [nb] * nb
        dev = self.device
        parents = torch.cat([choice.parents.flatten() for _, choice in beams])
        src_slots = to_device(scored_slots, torch.int64, dev)[to_device(slot_base, torch.int64, dev) + parents]
        blk = to_device([blk_member, blk_base, blk_count], torch.int64, dev)
        src_blocks = to_device(tables, torch.int64, dev)[blk[1] + parents[blk[0]] * blk[2]]
        self.runner.copy_caches(src_slots, to_device(dst_slots, torch.int64, dev), src_blocks,
                                to_device(dst_blocks, torch.int64, dev))


    def finish(self, group: BeamGroup) -> Sequence:
        """Ends a beam request: its leader takes the best hypothesis; every member leaves the scheduler."""
        leader, best = group.leader, group.best()
        leader.token_ids = leader.token_ids[:leader.prompt_len] + best
        leader.num_known = len(leader.token_ids)
        reason = "stop" if best[-1] in leader.stop_ids else "length"
        for m in group.members:
            self.scheduler.finish(m, reason)
        return leader
