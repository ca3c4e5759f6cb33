"""Continuous-batching scheduler, prefill first.

Each step is either a prefill step (chunks of admitted-but-unfinished prompts, then newly admitted prompts, up to
`max_num_batched_tokens` tokens) or, when no prompt work is pending, a decode step over every decoding sequence.
With `min_admit` > 1, new prompts are admitted while others decode only once that many can start together (or all
that wait): fewer, larger prefill steps, for callers whose every step has a fixed host cost (eager runs).
A sequence is admitted only when a GDN state slot and KV blocks for its whole prompt are free, so prefill never
runs out of memory; decode growth that does not fit preempts the most recently admitted sequences (recompute).
A beam-search request is admitted, decoded and preempted with all its members (engine/beam_search.py).

The engine runs one step ahead of the host: a sequence's newest token may still be a placeholder (sampled on the
device, not yet seen by the host). Preemption needs real tokens, so when it is due the scheduler returns
NEED_DRAIN instead and the engine first collects the step in flight.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.block_manager import BlockManager
from engine.sequence import Sequence, SeqStatus
from engine.state_pool import StatePool


NEED_DRAIN = "need_drain"


@dataclass
class ScheduledStep:
    is_prefill: bool
    seqs: list[Sequence]
    chunk_lens: list[int]  # prefill: tokens of each sequence computed this step; decode: all 1


class Scheduler:
    def __init__(self, block_manager: BlockManager, state_pool: StatePool, max_num_seqs: int,
                 max_num_batched_tokens: int, decode_len=len, min_admit: int = 1):
        self.blocks = block_manager
        self.states = state_pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # tokens of KV a sequence's next decode step needs (speculative steps: its block past the newest token)
        self.decode_len = decode_len
        self.min_admit = min_admit
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, can_preempt: bool = True):
        """-> ScheduledStep, None (nothing to run) or NEED_DRAIN (preemption due while tokens are in flight)."""
        step = self._schedule_prefill()
        if step is not None:
            return step
        return self._schedule_decode(can_preempt)

    def _schedule_prefill(self) -> ScheduledStep | None:
        budget = self.max_num_batched_tokens
        seqs, lens = [], []
        for seq in self.running:
            if seq.status == SeqStatus.PREFILLING and budget > 0:
                n = min(len(seq) - seq.num_computed, budget)
                seqs.append(seq)
                lens.append(n)
                budget -= n
        if not seqs and self._admission_waits():
            return None
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            # a beam request is admitted with all its members: a state slot and the prompt's KV blocks each
            members = seq.beam.members if seq.beam is not None else [seq]
            if len(self.running) + len(members) > self.max_num_seqs or self.states.num_free < len(members):
                break
            # keep a few blocks (one per running sequence, at most 1% of the cache) free for decode growth, so
            # admitting a prompt does not immediately force a preemption
            reserve = min(len(self.running), self.blocks.num_blocks // 100)
            if self.blocks.num_free - len(members) * self.blocks.blocks_needed(seq, len(seq)) < reserve:
                break
            self.waiting.popleft()
            for m in members:  # the other members join `running` when the prompt is done (Scheduler.join)
                self.blocks.grow(m, len(seq))
                m.state_slot = self.states.allocate()
            seq.status = SeqStatus.PREFILLING
            self.running.append(seq)
            n = min(len(seq), budget)
            seqs.append(seq)
            lens.append(n)
            budget -= n
        return ScheduledStep(True, seqs, lens) if seqs else None

    def _admission_waits(self) -> bool:
        """Whether new prompts wait for more free seats (min_admit) while running sequences decode meanwhile."""
        if self.min_admit <= 1 or not any(s.status == SeqStatus.DECODING for s in self.running):
            return False
        return self.max_num_seqs - len(self.running) < min(self.min_admit, len(self.waiting))

    def _schedule_decode(self, can_preempt: bool):
        ready = [s for s in self.running if s.status == SeqStatus.DECODING and s.num_output < s.sampling.max_tokens]
        if not can_preempt:
            need = sum(self.blocks.blocks_needed(s, self.decode_len(s)) for s in ready)
            if need > self.blocks.num_free:
                return NEED_DRAIN
        batch = []
        for seq in ready:
            if seq.status != SeqStatus.DECODING:
                continue
            while not self.blocks.can_grow(seq, self.decode_len(seq)):
                victim = next((s for s in reversed(self.running)  # never a member of seq's own beam request
                               if s is not seq and (s.beam is None or s.beam is not seq.beam)), None)
                if victim is None:
                    break
                for dropped in self.preempt(victim):
                    if dropped in batch:
                        batch.remove(dropped)
            if seq.status != SeqStatus.DECODING:
                continue
            if not self.blocks.can_grow(seq, self.decode_len(seq)):
                for dropped in self.preempt(seq):  # alone and still does not fit: wait for memory
                    if dropped in batch:
                        batch.remove(dropped)
                continue
            self.blocks.grow(seq, self.decode_len(seq))
            batch.append(seq)
        return ScheduledStep(False, batch, [1] * len(batch)) if batch else None

    def preempt(self, seq: Sequence) -> list[Sequence]:
        """Drop seq's caches; it re-enters the queue front and recomputes prompt + outputs on readmission.
        A beam member takes its whole request with it, and the search restarts from the prompt.
        -> the sequences dropped from `running`."""
        members = seq.beam.members if seq.beam is not None else [seq]
        dropped = [m for m in members if m in self.running]
        for m in members:
            self._release(m)
            m.status = SeqStatus.WAITING
            m.num_computed = 0
            m.num_preemptions += 1  # (also tells the decode metadata that its block table is a new one)
            if seq.beam is not None:
                del m.token_ids[m.prompt_len:]
                m.num_known = m.prompt_len
        if seq.beam is not None:
            seq.beam.reset()
            seq = seq.beam.leader
        seq.image_embeds = None
        self.waiting.appendleft(seq)
        return dropped

    def join(self, members: list[Sequence]) -> None:
        """A beam request's other members start decoding: the prompt's caches have been copied to them."""
        for m in members:
            m.status = SeqStatus.DECODING
            m.num_computed = m.prompt_len
            self.running.append(m)

    def finish(self, seq: Sequence, reason: str) -> None:
        self._release(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason

    def abort_waiting(self, seq: Sequence) -> None:
        self.waiting.remove(seq)

    def _release(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        self.blocks.free(seq)
        if seq.state_slot is not None:
            self.states.free(seq.state_slot)
            seq.state_slot = None
