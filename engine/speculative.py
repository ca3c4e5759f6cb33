"""Speculative decode steps with a DFlash drafter: draft a block, verify it in one target pass, keep the accepted
prefix. Everything between launch and the token copy runs on the device; the host learns the accepted counts when
it collects the step.

One step over S sequences, block length T = verify_len (speculative.num_speculative_tokens + 1, or the drafter's
block size):
1. draft: the drafter runs [last token, MASK x (T - 1)] for every sequence (engine/models/dflash.py) and proposes
   T - 1 tokens (argmax, or drawn from its distribution for sampled requests).
2. verify: the target runs [last token, drafts] as S x T decode rows: attention layers store the block's KV and read
   their context through the paged cache, each row up to its own position, a sequence's rows together (one read of
   its K/V serves a tile of its rows x heads: kernels/paged_attention rows_per_seq); the KV of rejected tokens stays
   past the sequence's length and is overwritten later: rollback by length. GDN layers verify against the state
   with the tokens pending from earlier steps folded in, and put the block's updates in the ring after them
   (kernels/gdn_verify, engine/gdn_ring). The tapped hidden states of the block become the drafter's context at the
   same slots.
3. accept (engine/spec_sampling): greedy prefix match or rejection sampling -> a accepted drafts + one target token.
4. commit: the first a + 1 tokens' updates become pending in the ring (one small launch: GDN state is not
   written), every GDN layer shifts them into its conv state (one launch for all layers); the last emitted token
   goes to the runner's next-token buffer.
A sequence's block is cut to valid = min(T, tokens left before max_tokens, 1 + its num_speculative_tokens): rows
past it are padding (stored nowhere); valid = 1 is a plain decode step inside the same launch. Sequences whose next
token is banned by the loop guard (loop_ban_next) get valid = 1 and the ban on their one row.

The recurrent state is written back by a verify only once more than `fold_after` accepted tokens are pending
(ReplaySSM's deferred fold), not committed at every step: a step then reads each state once (plus its pending rows)
and writes it every few steps, where a commit after every verify reads and writes it once more, and writing every
token's state would cost T writes. The price: anything else that reads GDN state first folds the pending tokens in
(engine/gdn_ring, through the runner), and the ring's rows (fold_after + 2 T per state slot) are memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine import ops
from engine.models.dflash import DFlashDrafter
from engine.sampler import filter_logits
from engine.sequence import Sequence
from engine.spec_sampling import greedy_accept, rejection_accept
from engine.step_metadata import StepMetadata, to_device


@dataclass
class StepPlan:
    """A step's host arrays: per block row s * T + j (positions, cache index, KV slot or -1, context length for the
    verify pass and for the draft pass), per sequence (block table, state slot, valid block length)."""
    positions: np.ndarray
    index: np.ndarray
    slots: np.ndarray
    ctx: np.ndarray
    draft_ctx: np.ndarray
    tables: np.ndarray  # [S, width] int32: a sequence's rows share it (repeated on the device)
    state_idx: np.ndarray
    valid: list[int]
    seqs: list[Sequence]


@dataclass
class StepTensors:
    """A step's inputs on the device (the plan's arrays, or views of engine/spec_graphs' static buffers)."""
    positions: torch.Tensor
    index: torch.Tensor
    slots: torch.Tensor
    ctx: torch.Tensor
    draft_ctx: torch.Tensor
    tables: torch.Tensor
    state_idx: torch.Tensor
    valid: torch.Tensor

    @classmethod
    def of(cls, plan: StepPlan, device) -> StepTensors:
        i64, i32 = torch.int64, torch.int32
        T = len(plan.positions) // len(plan.valid)
        return cls(to_device(plan.positions, i64, device), to_device(plan.index, i64, device),
                   to_device(plan.slots, i64, device), to_device(plan.ctx, i32, device),
                   to_device(plan.draft_ctx, i32, device), to_device(plan.tables, i32, device).repeat_interleave(T, 0),
                   to_device(plan.state_idx, i64, device), to_device(plan.valid, i64, device))


@dataclass
class SpecFlight:
    """A launched speculative step: tokens [S, T] and emitted counts [S] (host copies once collected)."""
    tokens: torch.Tensor
    emitted: torch.Tensor
    valid: list[int]
    logits: torch.Tensor | None = None  # [S, T, V] when some sequence keeps its logits


class SpecDecoder:
    def __init__(self, runner, drafter: DFlashDrafter, verify_len: int, max_num_seqs: int):
        self.runner, self.drafter, self.T = runner, drafter, verify_len
        self.graphs = None  # engine/spec_graphs.SpecGraphs (the engine sets it unless enforce_eager)
        self.mask_token_id = drafter.cfg.mask_token_id
        t = runner.cfg.text
        self.ring = runner.gdn_ring  # the runner allocates it with the GDN states (engine/gdn_ring)
        assert self.ring is not None and self.ring.rows >= 2 * verify_len, "the runner's ring must hold two blocks"
        # the block's conv inputs in every GDN layer, with a leading layer axis so that one launch commits them all;
        # each layer's verify writes its own slice (layer.kept_x)
        self.kept_x = torch.empty(len(runner.gdn_layers), max_num_seqs, verify_len, t.gdn_conv_dim,
                                  dtype=runner.dtype, device=runner.device)
        for i, layer in enumerate(runner.gdn_layers):
            layer.bind_verify(self.kept_x[i], self.ring.layer(i), self.ring.fold_after)

    def block_len(self, seq: Sequence) -> int:
        """Tokens of the block this sequence verifies next step (1 = no drafts)."""
        sp = seq.sampling
        cap = self.T if sp.num_speculative_tokens is None else 1 + sp.num_speculative_tokens
        if seq.loop_ban() is not None:
            cap = 1
        return max(1, min(self.T, cap, sp.max_tokens - seq.num_output))

    def plan(self, seqs: list[Sequence]) -> StepPlan:
        """The host side of a step: each sequence's block rows s * T + j (rows past its valid length are padding,
        stored nowhere), computed as arrays: at large batch this runs every step for thousands of rows."""
        T, bs, S = self.T, self.runner.block_size, len(seqs)
        valid = [self.block_len(s) for s in seqs]
        v = np.array(valid, dtype=np.int64)
        start = np.array([len(s) - 1 for s in seqs], dtype=np.int64)  # the newest token: not yet in the caches
        i = start[:, None] + np.arange(T)[None, :]  # [S, T] cache index of each block row
        live = np.arange(T)[None, :] < v[:, None]
        width = max(len(s.block_table) for s in seqs)
        table = np.zeros((S, width), dtype=np.int32)
        for r, seq in enumerate(seqs):
            table[r, :len(seq.block_table)] = seq.block_table
        block_of = table[np.arange(S)[:, None], np.minimum(i // bs, width - 1)].astype(np.int64)
        rope = np.array([s.rope_delta for s in seqs], dtype=np.int64)
        return StepPlan(positions=(i + rope[:, None]).ravel(), index=i.ravel(),
                        slots=np.where(live, block_of * bs + i % bs, -1).ravel(),
                        ctx=np.where(live, i + 1, 0).astype(np.int32).ravel(),
                        draft_ctx=np.where(live, (start + v)[:, None], 0).astype(np.int32).ravel(),
                        tables=table,
                        state_idx=np.array([s.state_slot for s in seqs], dtype=np.int64), valid=valid, seqs=seqs)

    @torch.no_grad()
    def step(self, seqs: list[Sequence]) -> SpecFlight:
        plan = self.plan(seqs)
        self.ring.touched(plan.state_idx)
        sampled = [i for i, s in enumerate(seqs) if s.sampling.temperature > 0]
        bans = [(i, tok) for i, s in enumerate(seqs) if (tok := s.loop_ban()) is not None]
        keep_logits = any(s.logits is not None for s in seqs)
        if self.graphs is not None and not (sampled or bans or keep_logits):
            tokens, emitted = self.graphs.run(plan)
            return SpecFlight(tokens, emitted, plan.valid)
        T, S, dev = self.T, len(seqs), self.runner.device
        d = StepTensors.of(plan, dev)

        # 1. draft
        block = self.new_block(d.state_idx, S)
        drafts, q = self.propose(seqs, block, sampled, d.index, d.slots, d.tables, d.draft_ctx)
        # 2. verify
        block[:, 1:] = drafts
        logits = self.verify(block, d)
        if bans:
            logits = logits.clone()
            r, tk = zip(*bans)
            logits[to_device(list(r), torch.int64, dev), 0, to_device(list(tk), torch.int64, dev)] = -torch.inf

        # 3. accept
        tokens, emitted = greedy_accept(drafts, logits, d.valid)
        if sampled:
            rows = to_device(sampled, torch.int64, dev)
            ss = [seqs[i] for i in sampled]
            p = self._probs(logits[rows].float(), ss)
            gens = [(torch.rand(T - 1, generator=s.generator, device=dev), self._exp_noise(s, q.shape[1:]),
                     self._exp_noise(s, p.shape[1:])) for s in ss]
            u, rn, bn = (torch.stack(x) for x in zip(*gens))
            t_s, e_s = rejection_accept(drafts[rows], q, p, d.valid[rows], u, rn, bn)
            tokens[rows], emitted[rows] = t_s, e_s

        # 4. commit
        self.commit(d.state_idx, tokens, emitted)
        return SpecFlight(tokens, emitted, plan.valid, logits.float() if keep_logits else None)

    def greedy_step(self, d: StepTensors, seqs=None) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole greedy step on device tensors only (what engine/spec_graphs captures): draft, verify, accept,
        commit -> (tokens [S, T], emitted [S]). seqs (the first of the S rows' sequences, or None) is for
        drafters that need the host's view; the DFlash drafter does not."""
        S = d.state_idx.shape[0]
        block = self.new_block(d.state_idx, S)
        drafts, _ = self.propose(seqs, block, [], d.index, d.slots, d.tables, d.draft_ctx)
        block[:, 1:] = drafts
        tokens, emitted = greedy_accept(drafts, self.verify(block, d), d.valid)
        self.commit(d.state_idx, tokens, emitted)
        return tokens, emitted

    def new_block(self, state_idx: torch.Tensor, S: int) -> torch.Tensor:
        """[S, T] = [each sequence's last token (from the runner's next-token buffer), MASK...]."""
        block = torch.full((S, self.T), self.mask_token_id, dtype=torch.int64, device=state_idx.device)
        block[:, 0] = self.runner.next_tokens[state_idx]
        return block

    def verify(self, block: torch.Tensor, d: StepTensors) -> torch.Tensor:
        """The target over [last, drafts] of every sequence -> logits [S, T, V]; the block's taps become the
        drafter's context at the same slots."""
        S, T = block.shape
        model = self.runner.model
        meta = StepMetadata(is_prefill=False, num_tokens=S * T, positions=d.positions, slot_mapping=d.slots,
                            state_idx=d.state_idx, block_tables=d.tables, context_lens=d.ctx, verify_len=T)
        taps = self.drafter.new_taps()
        h = model(model.embed(block.view(-1)), meta, taps)
        self.drafter.write_context(taps, d.slots, d.index)
        return model.compute_logits(h).view(S, T, -1)

    def commit(self, state_idx: torch.Tensor, tokens: torch.Tensor, emitted: torch.Tensor) -> None:
        """The first `emitted` tokens become pending GDN updates and enter every conv state; the last one becomes
        the next input."""
        S, T = tokens.shape
        self.ring.advance(state_idx, emitted)
        ops.conv_state_commit(self.kept_x[:, :S, :T], self.runner.conv_state, state_idx, emitted)
        self.runner.next_tokens[state_idx] = tokens[torch.arange(S, device=tokens.device), emitted - 1]

    def propose(self, seqs, block, sampled, index, slots, block_tables, draft_ctx):
        """The drafter's T - 1 proposals [S, T - 1] for blocks [S, T] = [last, MASK...], and for the sampled rows
        their distributions q [len(sampled), T - 1, V] (None if none)."""
        S, T = block.shape
        model, dev = self.runner.model, block.device
        hidden = self.drafter.draft_hidden(model.embed(block.view(-1)), index, slots, block_tables, draft_ctx, T)
        rows = hidden.view(S, T, -1)[:, 1:].reshape(S * (T - 1), -1).to(self.runner.dtype)
        draft_logits = model.compute_logits(rows).view(S, T - 1, -1)
        if self.drafter.selector is not None:
            return self._select(seqs, block[:, 0], rows.view(S, T - 1, -1), draft_logits, sampled)
        drafts, q = draft_logits.argmax(-1), None
        if sampled:
            idx = to_device(sampled, torch.int64, dev)
            q = self._probs(draft_logits[idx], [seqs[i] for i in sampled])
            noise = torch.stack([self._exp_noise(seqs[i], q.shape[1:]) for i in sampled])
            drafts[idx] = (q / noise).argmax(-1)
        return drafts, q

    def _select(self, seqs, anchors, hidden, draft_logits, sampled):
        """DFlash2: each draft chosen among the top-k of its position given the draft before it (the verified token
        first), the argmax of the selector's scores (DFlashDrafter.select), or for sampled rows a draw from their
        softmax at the request's temperature; q is that softmax over the vocabulary (zero outside the candidates):
        what the draft was drawn from, which is all rejection sampling needs to stay lossless."""
        if not sampled:
            return self.drafter.select(draft_logits, hidden, anchors), None
        S, P, V = draft_logits.shape
        dev = draft_logits.device
        idx = to_device(sampled, torch.int64, dev)
        q = torch.zeros(len(sampled), P, V, device=dev)
        temp = to_device([seqs[i].sampling.temperature for i in sampled], torch.float32, dev)

        def pick(j, cand, scores):
            chosen = scores.argmax(-1)
            probs = (scores[idx] / temp[:, None]).softmax(-1)
            noise = torch.stack([self._exp_noise(seqs[i], probs.shape[1:]) for i in sampled])
            chosen[idx] = (probs / noise).argmax(-1)
            q[:, j].scatter_(1, cand[idx], probs)
            return chosen
        return self.drafter.select(draft_logits, hidden, anchors, pick), q

    @staticmethod
    def _probs(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """[n, P, V] logits -> the requests' sampling distributions (temperature, top-k, top-p), fp32."""
        n, P, V = logits.shape
        dev = logits.device
        temp = to_device([s.sampling.temperature for s in seqs], torch.float32, dev).repeat_interleave(P)
        top_k = to_device([s.sampling.top_k for s in seqs], torch.int64, dev).repeat_interleave(P)
        top_p = to_device([s.sampling.top_p for s in seqs], torch.float32, dev).repeat_interleave(P)
        flat = logits.float().reshape(n * P, V) / temp[:, None]
        return filter_logits(flat, top_k, top_p).softmax(-1).view(n, P, V)

    @staticmethod
    def _exp_noise(seq: Sequence, shape) -> torch.Tensor:
        return torch.empty(tuple(shape), device=seq.generator.device).exponential_(generator=seq.generator)
