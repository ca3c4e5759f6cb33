"""Teacher-forced taps: the output hidden states of chosen layers of the target over given sequences (a page's prompt
and the target's own answer to it), the context a DFlash drafter learns from (jobs/train_drafter.py).

The sequences are packed into the engine's prefill steps, many to a step (varlen: each sequence attends and runs its
GDN recurrences on its own rows; the GDN layers go through fla's chunked kernel where it is installed, as every
prefill does), up to a token budget a step; a sequence longer than what is left of the budget is cut into chunks and
continued at the next step, as the scheduler cuts prompts. A step's forward stops after the last tapped layer, and
its taps reach their sequences' rows with one copy. So the host launches one step's kernels for thousands of
tokens, where taps recorded while the target answers cost a decode step's launches for each token.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from engine.block_manager import blocks_for
from engine.interface import SamplingParams
from engine.sequence import Sequence
from engine.step_metadata import PrefillChunk, to_device

LOGIT_ROWS = 512  # soft labels: rows put through the LM head at once ([rows, vocab] fp32 is 0.5 GB at 248 k ids)


@dataclass
class SequenceTaps:
    taps: dict[int, torch.Tensor]  # layer id -> [len(token_ids), H], the engine's dtype, on its device
    # with soft_top_k: the distribution the target predicts at each row from the sequence's soft_from on: its top-k
    # probabilities renormalised and their ids [len(token_ids) - soft_from, k], on the host
    soft: tuple[torch.Tensor, torch.Tensor] | None = None


@torch.no_grad()
def prefill_taps(engine, sequences: list[dict], layer_ids, *, token_budget: int | None = None,
                 soft_top_k: int = 0, stats: dict | None = None) -> list[SequenceTaps]:
    """The hidden states of the layers `layer_ids` at every token of each sequence, computed by the prefill path of
    an idle `engine` (engine.llm_engine.Engine; its KV blocks and GDN state slots are borrowed and given back).

    sequences: dicts of token_ids, and for a sequence with images pixel_values and image_grids (as add_request takes
    them; uint8 compact patches are expanded on the device), and with soft_top_k > 0 soft_from: the first row whose
    next-token distribution is kept (SequenceTaps.soft; a page's prompt length - 1 for the distributions at its
    answer tokens; the forward then runs every layer and the LM head on those rows). token_budget: tokens a step
    (default the engine's max_num_batched_tokens). stats: receives the steps run and the tokens they fed."""
    if engine.has_unfinished():
        raise RuntimeError("prefill_taps needs an idle engine: it borrows the KV blocks and state slots of requests")
    layer_ids = list(layer_ids)
    if not layer_ids or min(layer_ids) < 0 or max(layer_ids) >= engine.cfg.text.num_hidden_layers:
        raise ValueError(f"layer_ids {layer_ids}: give layers of 0 .. {engine.cfg.text.num_hidden_layers - 1}")
    runner, blocks, states = engine.runner, engine.block_manager, engine.scheduler.states
    budget = token_budget or runner.max_num_batched_tokens
    seqs, soft_from = [], []
    for n, spec in enumerate(sequences):
        ids = [int(t) for t in spec["token_ids"]]
        if not ids:
            raise ValueError(f"sequence {n}: no tokens")
        if blocks_for(len(ids), blocks.block_size) > blocks.num_blocks:
            raise ValueError(f"sequence {n}: {len(ids)} tokens, the KV cache holds "
                             f"{blocks.num_blocks * blocks.block_size}")
        images, pos, delta = engine.prompt_inputs(f"sequence {n}", ids, spec.get("pixel_values"),
                                                  spec.get("image_grids"))
        seqs.append(Sequence(n, f"taps-{n}", ids, SamplingParams(max_tokens=1), frozenset(), pos, delta, images))
        if soft_top_k:
            first = spec.get("soft_from")
            if first is None or not 0 <= first < len(ids):
                raise ValueError(f"sequence {n}: soft_from {first!r}, give a row of 0 .. {len(ids) - 1}")
            soft_from.append(int(first))
    rows = np.cumsum([0] + [len(s) for s in seqs])  # each sequence's first row in the output
    H = engine.cfg.text.hidden_size
    out = torch.empty(len(layer_ids), int(rows[-1]), H, dtype=runner.dtype, device=engine.device)
    soft = None
    if soft_top_k:
        soft_rows = np.cumsum([0] + [len(s) - f for s, f in zip(seqs, soft_from)])
        k = min(soft_top_k, engine.cfg.text.vocab_size)
        soft = (torch.empty(int(soft_rows[-1]), k, device=engine.device),
                torch.empty(int(soft_rows[-1]), k, dtype=torch.int64, device=engine.device))
    waiting, active = deque(seqs), []
    try:
        while waiting or active:
            step, left = [], budget
            for s in active:  # continued sequences first, in order
                if left == 0:
                    break
                n = min(len(s) - s.num_computed, left)
                step.append((s, n))
                left -= n
            new = []
            while waiting and left > 0 and states.num_free and \
                    blocks.num_free >= blocks.blocks_needed(waiting[0], len(waiting[0])):
                s = waiting.popleft()
                blocks.grow(s, len(s))
                s.state_slot = states.allocate()
                active.append(s)
                new.append(s)
                n = min(len(s), left)
                step.append((s, n))
                left -= n
            if not step:  # nothing running holds memory, and the next sequence still does not fit
                raise RuntimeError("prefill_taps: the engine's state slots or KV blocks cannot hold a sequence")
            engine._encode_images([s for s in new if s.images is not None])  # one vision forward for the step
            chunks, dest, logit_rows, logit_dest, row = [], [], [], [], 0
            for s, n in step:
                a, e = s.num_computed, s.num_computed + n
                chunks.append(PrefillChunk(token_ids=s.token_ids[a:e], positions=s.positions(a, e), start=a,
                                           block_table=s.block_table, state_slot=s.state_slot,
                                           embed_overrides=s.image_rows(a, e)))
                dest.append(np.arange(rows[s.seq_id] + a, rows[s.seq_id] + e))
                if soft is not None and e > soft_from[s.seq_id]:
                    lo = max(a, soft_from[s.seq_id])
                    logit_rows.append(np.arange(row + lo - a, row + n))
                    base = soft_rows[s.seq_id] - soft_from[s.seq_id]
                    logit_dest.append(np.arange(base + lo, base + e))
                s.num_computed = e
                row += n
            taps, hidden = runner.run_prefill_taps(chunks, layer_ids, final=soft is not None)
            if stats is not None:
                stats["steps"] = stats.get("steps", 0) + 1
                stats["tokens"] = stats.get("tokens", 0) + row
            out.index_copy_(1, to_device(np.concatenate(dest), torch.int64, engine.device),
                            torch.stack([taps[lid] for lid in layer_ids]))
            if logit_rows:
                _soft_labels(engine, hidden, np.concatenate(logit_rows), np.concatenate(logit_dest), soft)
            for s, _ in step:
                if s.num_computed == len(s):
                    _release(blocks, states, s)
                    active.remove(s)
    finally:  # an error midway gives the engine its memory back
        for s in active:
            _release(blocks, states, s)
    host = (soft[0].cpu(), soft[1].cpu()) if soft is not None else None
    return [SequenceTaps({lid: out[j, rows[i]:rows[i + 1]] for j, lid in enumerate(layer_ids)},
                         (host[0][soft_rows[i]:soft_rows[i + 1]], host[1][soft_rows[i]:soft_rows[i + 1]])
                         if host is not None else None)
            for i in range(len(seqs))]


def _soft_labels(engine, hidden: torch.Tensor, rows: np.ndarray, dest: np.ndarray, soft) -> None:
    """The top-k of the next-token distribution at hidden's `rows`, renormalised, into soft's rows `dest`."""
    probs, ids = soft
    k = probs.shape[1]
    for i in range(0, len(rows), LOGIT_ROWS):
        r = to_device(rows[i:i + LOGIT_ROWS], torch.int64, engine.device)
        d = to_device(dest[i:i + LOGIT_ROWS], torch.int64, engine.device)
        p, top = engine.model.compute_logits(hidden[r]).float().softmax(-1).topk(k, -1)
        probs.index_copy_(0, d, p / p.sum(-1, keepdim=True))
        ids.index_copy_(0, d, top)


def _release(blocks, states, seq: Sequence) -> None:
    blocks.free(seq)
    if seq.state_slot is not None:
        states.free(seq.state_slot)
        seq.state_slot = None
    seq.image_embeds = None
