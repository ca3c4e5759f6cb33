"""A request's life inside the engine: its tokens, cache handles, image inputs, sampling state and timings."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass

import numpy as np
import torch

from engine.interface import SamplingParams, SpecStats
from engine.loop_guard import LoopDrop, LoopGuard


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # not yet admitted (or preempted): holds no cache
    PREFILLING = "prefilling"  # admitted; some tokens not yet in the caches
    DECODING = "decoding"  # all tokens but the newest sampled one are in the caches
    FINISHED = "finished"


@dataclass
class ImageInputs:
    pixel_values: torch.Tensor  # host: float32 [P, patch_dim], or uint8 [P, patch_dim / T] to expand on the device
    grids: list[tuple[int, int, int]]
    spans: list[tuple[int, int]]  # (first token index, token count) of each image in the prompt


class Sequence:
    def __init__(self, seq_id: int, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                 stop_ids: frozenset[int], mrope_positions: np.ndarray, rope_delta: int,
                 images: ImageInputs | None = None, generator: torch.Generator | None = None,
                 keep_logits: bool = False):
        self.seq_id = seq_id
        self.request_id = request_id
        self.token_ids = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.sampling = sampling
        self.stop_ids = stop_ids
        self.mrope_positions = mrope_positions  # [3, prompt_len]
        self.rope_delta = rope_delta
        self.images = images
        self.image_embeds: torch.Tensor | None = None  # device, rows in image order; dropped after prefill
        self.generator = generator
        self.logits: list[torch.Tensor] | None = [] if keep_logits else None

        self.status = SeqStatus.WAITING
        self.num_computed = 0  # tokens whose KV / GDN state are in the caches
        self.num_known = len(prompt_ids)  # tokens the host has seen; the rest are placeholders still in flight
        self.block_table: list[int] = []
        self.state_slot: int | None = None
        self.finish_reason: str | None = None
        self.arrival_time = time.perf_counter()
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.num_preemptions = 0
        self.beam = None  # engine.beam_search.BeamGroup of a beam-search request's members
        self.spec_stats = SpecStats()  # speculative decoding's counts (zeros when the engine does not speculate)
        self.loop_guard = LoopGuard(sampling.loop_stop_tokens) if sampling.loop_stop_tokens else None
        self.loop_drop = LoopDrop(sampling.loop_drop_tokens) if sampling.loop_drop_tokens else None

    def loop_ban(self) -> int | None:
        """The token to forbid at the position about to be sampled (sampling.loop_ban_next), or None."""
        if not (self.sampling.loop_ban_next and self.loop_drop is not None and self.loop_drop.looping):
            return None
        return self.loop_drop.next_in_loop(self.token_ids, self.num_known, len(self.token_ids))

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def is_finished(self) -> bool:
        return self.status == SeqStatus.FINISHED

    def positions(self, start: int, end: int) -> np.ndarray:
        """[3, end - start] rope positions: the prompt's mRoPE ids, then index + delta on all axes."""
        p_end = min(end, self.prompt_len)
        parts = []
        if start < p_end:
            parts.append(self.mrope_positions[:, start:p_end])
        if end > self.prompt_len:
            gen = np.arange(max(start, self.prompt_len), end) + self.rope_delta
            parts.append(np.broadcast_to(gen, (3, len(gen))))
        return np.concatenate(parts, axis=1)

    def image_rows(self, start: int, end: int) -> list[tuple[int, torch.Tensor]]:
        """Image-feature rows covering tokens [start, end): (offset from start, rows)."""
        if self.images is None:
            return []
        out, row0 = [], 0
        for a, n in self.images.spans:
            lo, hi = max(start, a), min(end, a + n)
            if lo < hi:
                out.append((lo - start, self.image_embeds[row0 + lo - a: row0 + hi - a]))
            row0 += n
        return out
