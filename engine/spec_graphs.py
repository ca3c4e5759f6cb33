"""Greedy speculative steps from static device buffers, replayed on CUDA as one graph per padded batch size.

An eager speculative step launches the draft pass, the target's verify pass, the acceptance and the commit as some
hundreds of kernels from Python; at small batch the launches, not the GPU, set its time. A greedy step has no host
decision inside it (engine/speculative.SpecDecoder.greedy_step: everything from the last tokens to the next ones
runs on the device), so it is captured once per padded batch size and replayed.

Padding rows (the batch padded up to a captured size) belong to no sequence: no KV slot (-1: stored nowhere), a
context of one token, and the runner's scratch state slot (the one past max_num_seqs), so the commit's unmasked
writes and the next-token write land where no sequence reads. Sampled rows, loop-guard bans and kept logits take
the eager step. Without CUDA (or when capture fails) the same buffers run eagerly, which is what the CPU tests
check against the eager step.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from engine.model_runner import graph_batch_sizes
from engine.speculative import SpecDecoder, StepPlan, StepTensors


class SpecGraphs:
    def __init__(self, decoder: SpecDecoder, max_num_seqs: int, max_blocks: int, scratch_slot: int, capture: bool):
        self.decoder, self.T = decoder, decoder.T
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.max_blocks, self.scratch = max_blocks, scratch_slot
        dev = decoder.runner.device
        R = max_num_seqs * self.T
        i64, i32 = torch.int64, torch.int32
        self.buf = StepTensors(
            positions=torch.zeros(R, dtype=i64, device=dev), index=torch.zeros(R, dtype=i64, device=dev),
            slots=torch.full((R,), -1, dtype=i64, device=dev), ctx=torch.ones(R, dtype=i32, device=dev),
            draft_ctx=torch.ones(R, dtype=i32, device=dev), tables=None,
            state_idx=torch.full((max_num_seqs,), scratch_slot, dtype=i64, device=dev),
            valid=torch.ones(max_num_seqs, dtype=i64, device=dev))
        # one block table per sequence: the host copies S rows, the step repeats them for the sequence's T rows
        self.seq_tables = torch.zeros(max_num_seqs, max_blocks, dtype=i32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if capture and dev.type == "cuda":
            try:
                self.capture()
            except Exception as e:  # noqa: BLE001  (run the static step eagerly rather than not at all; loudly)
                warnings.warn(f"CUDA graph capture of the speculative step failed, it runs eagerly: {e!r}")
                self.graphs.clear()
                self.outputs.clear()
                torch.cuda.synchronize(dev)

    def views(self, padded: int, width: int) -> StepTensors:
        """The buffers' first `padded` sequences (their padded * T rows), block tables `width` columns wide (each
        sequence's repeated for its rows: a device copy, inside the graph when captured)."""
        R, b = padded * self.T, self.buf
        tables = self.seq_tables[:padded, :width].repeat_interleave(self.T, 0)
        return StepTensors(b.positions[:R], b.index[:R], b.slots[:R], b.ctx[:R], b.draft_ctx[:R], tables,
                           b.state_idx[:padded], b.valid[:padded])

    def fill(self, plan: StepPlan, padded: int) -> None:
        """Copy the plan's rows into the buffers, the rows up to `padded` sequences as padding."""
        S, T = len(plan.valid), self.T
        R, P = S * T, padded * T

        def rows(a: np.ndarray, pad, dtype) -> torch.Tensor:
            out = np.full((P, *a.shape[1:]), pad, dtype=dtype)
            out[:R] = a
            return torch.from_numpy(out)

        b = self.buf
        b.positions[:P].copy_(rows(plan.positions, 0, np.int64))
        b.index[:P].copy_(rows(plan.index, 0, np.int64))
        b.slots[:P].copy_(rows(plan.slots, -1, np.int64))
        b.ctx[:P].copy_(rows(np.maximum(plan.ctx, 1), 1, np.int32))
        b.draft_ctx[:P].copy_(rows(np.maximum(plan.draft_ctx, 1), 1, np.int32))
        tables = np.zeros((padded, self.max_blocks), dtype=np.int32)
        tables[:S, :plan.tables.shape[1]] = plan.tables
        self.seq_tables[:padded].copy_(torch.from_numpy(tables))
        state = np.full(padded, self.scratch, dtype=np.int64)
        state[:S] = plan.state_idx
        b.state_idx[:padded].copy_(torch.from_numpy(state))
        valid = np.ones(padded, dtype=np.int64)
        valid[:S] = plan.valid
        b.valid[:padded].copy_(torch.from_numpy(valid))

    @torch.no_grad()
    def run(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """One greedy step of the plan's S sequences -> (tokens [S, T], emitted [S]) on the device."""
        S = len(plan.valid)
        padded = next(s for s in self.sizes if s >= S)
        self.fill(plan, padded)
        if padded in self.graphs:
            self.graphs[padded].replay()
            tokens, emitted = self.outputs[padded]
        else:  # eager: block tables as wide as the plan's (the CPU reference gathers every column it is given)
            tokens, emitted = self.decoder.greedy_step(self.views(padded, max(1, plan.tables.shape[1])), plan.seqs)
        return tokens[:S], emitted[:S]

    @torch.no_grad()
    def capture(self) -> None:
        """One graph per padded size, largest first, sharing one memory pool; each captured over padding rows only
        (they touch no sequence's cache or state) after a warm-up run that compiles the kernels."""
        dev = self.decoder.runner.device
        pool = None
        for size in reversed(self.sizes):
            self.fill(StepPlan(*(np.zeros((0,), dtype=np.int64),) * 5, np.zeros((0, 1), dtype=np.int32),
                               np.zeros((0,), dtype=np.int64), [], []), size)
            self.decoder.greedy_step(self.views(size, self.max_blocks))
            torch.cuda.synchronize(dev)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.outputs[size] = self.decoder.greedy_step(self.views(size, self.max_blocks))
            pool = g.pool() if pool is None else pool
            self.graphs[size] = g
        torch.cuda.synchronize(dev)
