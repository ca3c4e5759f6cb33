"""The GDN updates of speculatively emitted tokens that are not yet in the recurrent state (ReplaySSM's deferred fold).

A speculative step's verify reads each sequence's state once, folds in the tokens pending from earlier steps, and
writes the folded state back only once more than `fold_after` are pending; the accepted tokens of the step become
pending (kernels/gdn_verify). So between speculative steps a slot's state alone is not its sequence's state: every
other reader of GDN state (a plain decode step, a prefill chunk) goes through the runner, which folds what is
pending first (`fold`) or, for a slot that starts a new sequence, drops it (`forget`); a copy for beam search (which
never speculates) carries its source's empty ring.

The host keeps `dirty`, the slots a speculative step has touched since their last fold, so that a run that never
speculates, or a plain step over other slots, launches nothing.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from engine import ops


class GdnRing:
    def __init__(self, runner, verify_len: int, fold_after: int):
        """Rows for fold_after pending tokens and two verify blocks per state slot, for every GDN layer (fold_after
        >= 0: DecodeTuning.check)."""
        t, dev = runner.cfg.text, runner.device
        L, slots = runner.ssm_state.shape[:2]
        self.runner, self.fold_after = runner, fold_after
        self.rows = fold_after + 2 * verify_len
        f32 = dict(dtype=torch.float32, device=dev)
        self.k = torch.zeros(L, slots, self.rows, t.linear_num_key_heads, t.linear_key_head_dim, **f32)
        self.u = torch.zeros(L, slots, self.rows, t.linear_num_value_heads, t.linear_value_head_dim, **f32)
        self.g = torch.zeros(L, slots, self.rows, t.linear_num_value_heads, **f32)
        self.pos = torch.zeros(slots, 2, dtype=torch.int32, device=dev)  # (oldest pending row, pending count)
        self.dirty: set[int] = set()

    def layer(self, i: int) -> tuple[torch.Tensor, ...]:
        """GDN layer i's ring (ring_k, ring_u, ring_g, ring_pos) as kernels/gdn_verify takes it."""
        return self.k[i], self.u[i], self.g[i], self.pos

    def advance(self, state_idx: torch.Tensor, emitted: torch.Tensor) -> None:
        """After a verify (on the device): the accepted tokens become pending."""
        ops.gdn_ring_advance(self.pos, state_idx, emitted, self.fold_after, self.rows)

    def touched(self, slots: Iterable[int]) -> None:
        self.dirty.update(int(s) for s in slots)

    def fold(self, slots: Iterable[int]) -> None:
        """Fold the pending tokens of these slots into their states (every layer, one launch)."""
        idx = self._take(slots)
        if idx is not None:
            ops.gdn_fold(self.runner.ssm_state, idx, (self.k, self.u, self.g, self.pos))

    def forget(self, slots: Iterable[int]) -> None:
        """Slots that start a new sequence: whatever was pending there belonged to the one before."""
        idx = self._take(slots)
        if idx is not None:
            self.pos[idx] = 0

    def _take(self, slots: Iterable[int]) -> torch.Tensor | None:
        """The dirty ones among `slots` (a device index tensor, None if none), no longer dirty."""
        hit = sorted(self.dirty.intersection(int(s) for s in slots))
        if not hit:
            return None
        self.dirty.difference_update(hit)
        return torch.tensor(hit, dtype=torch.int64).to(self.runner.device, non_blocking=True)
