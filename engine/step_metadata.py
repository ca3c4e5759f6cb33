"""Per-step metadata: everything the layers need to find their caches, built once per step on the host and copied
to the device in one go. Layers only read it; nothing in a forward pass synchronises with the host.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class PrefillChunk:
    """One sequence's slice of a prefill step: tokens [start, start + len(token_ids)) of the sequence."""
    token_ids: list[int]
    positions: np.ndarray  # [3, n] mRoPE positions of these tokens
    start: int  # tokens already in the caches
    block_table: list[int]
    state_slot: int
    # (row offset within this chunk, rows [n, hidden]) that replace token embeddings, e.g. image features
    embed_overrides: list = None  # type: ignore[assignment]


@dataclass
class StepMetadata:
    is_prefill: bool
    num_tokens: int
    positions: torch.Tensor  # prefill: [3, N] (T, H, W); decode: [B] (text position, same on all axes)
    slot_mapping: torch.Tensor  # [N] int64 flat KV slot per token (-1 = padding, not stored)
    state_idx: torch.Tensor  # [S] int32 GDN state slot per sequence (-1 = padding)
    # decode
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32
    context_lens: torch.Tensor | None = None  # [B] int32, tokens in cache including this one
    # prefill (host lists drive per-sequence loops; device tensors feed kernels)
    query_lens: list[int] | None = None
    kv_lens: list[int] | None = None  # tokens in cache after this chunk, per sequence
    state_slots: list[int] | None = None
    cu_seqlens: torch.Tensor | None = None  # [S+1] int64 on device
    cu_seqlens_cpu: torch.Tensor | None = None
    kv_gather_slots: torch.Tensor | None = None  # [sum kv_lens] flat KV slots of every sequence's full context
    fresh_state_idx: torch.Tensor | None = None  # slots of sequences starting now: zeroed before the step
    # each token's row when every sequence is laid out in `chunks_per_seq` chunks of GDN_CHUNK rows (zero padded):
    # the torch GDN prefill runs all sequences of a step together over that layout
    chunked_rows: torch.Tensor | None = None  # [N] int64
    chunks_per_seq: int = 0
    # speculative verify (engine/speculative.py): T > 0 tokens per sequence, rows s * T + j laid out like decode
    # rows (positions, slot_mapping, context_lens, block_tables per row); state_idx [S] per sequence. GDN layers
    # read their state without writing it and keep the block's updates aside for the commit.
    verify_len: int = 0


GDN_CHUNK = 64  # chunk length of the torch GDN prefill (engine/models/gdn_prefill.py)


def chunked_layout(query_lens: list[int], chunk: int = GDN_CHUNK) -> tuple[np.ndarray, int]:
    """-> (row of each packed token in a [len(query_lens), n * chunk] layout, n = chunks of the longest sequence)."""
    n = max(-(-q // chunk) for q in query_lens)
    rows = np.concatenate([i * n * chunk + np.arange(q) for i, q in enumerate(query_lens)])
    return rows, n


def to_device(data, dtype: torch.dtype, device) -> torch.Tensor:
    """Host data (list / numpy / CPU tensor) -> device tensor without a host sync: a copy from pageable memory
    would first wait for all queued device work, so CUDA copies go through pinned memory (recycled by torch's
    caching host allocator once the copy is done)."""
    t = data if torch.is_tensor(data) else torch.as_tensor(np.asarray(data))
    t = t.to(dtype)
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _flat_slots(block_table: list[int], start: int, end: int, block_size: int) -> np.ndarray:
    j = np.arange(start, end)
    return np.asarray(block_table, dtype=np.int64)[j // block_size] * block_size + j % block_size


def build_prefill_metadata(chunks: list[PrefillChunk], block_size: int, device) -> StepMetadata:
    query_lens = [len(c.token_ids) for c in chunks]
    kv_lens = [c.start + n for c, n in zip(chunks, query_lens)]
    positions = np.concatenate([c.positions for c in chunks], axis=1)
    slot_mapping = np.concatenate([_flat_slots(c.block_table, c.start, c.start + n, block_size)
                                   for c, n in zip(chunks, query_lens)])
    gather = np.concatenate([_flat_slots(c.block_table, 0, kv, block_size) for c, kv in zip(chunks, kv_lens)])
    cu = np.zeros(len(chunks) + 1, dtype=np.int64)
    cu[1:] = np.cumsum(query_lens)
    slots = [c.state_slot for c in chunks]
    fresh = [c.state_slot for c in chunks if c.start == 0]
    chunked_rows, chunks_per_seq = chunked_layout(query_lens)

    def dev(a, dtype):
        return to_device(np.ascontiguousarray(a), dtype, device)

    cu_cpu = torch.from_numpy(cu)
    return StepMetadata(
        is_prefill=True, num_tokens=int(cu[-1]),
        positions=dev(positions, torch.int64), slot_mapping=dev(slot_mapping, torch.int64),
        state_idx=dev(np.asarray(slots), torch.int32),
        query_lens=query_lens, kv_lens=kv_lens, state_slots=slots,
        cu_seqlens=to_device(cu_cpu, torch.int64, device), cu_seqlens_cpu=cu_cpu,
        kv_gather_slots=dev(gather, torch.int64),
        fresh_state_idx=dev(np.asarray(fresh, dtype=np.int64), torch.int64) if fresh else None,
        chunked_rows=dev(chunked_rows, torch.int64), chunks_per_seq=chunks_per_seq,
    )


class DecodeInputs:
    """Static device buffers for decode steps (CUDA graphs replay against these) and two sets of pinned host
    staging buffers, used alternately: while the GPU may still be copying from one set (the previous step's), the
    host fills the other. The engine waits for step t before it fills the set step t used again (step t + 2)."""

    NAMES = {"positions": torch.int64, "slot_mapping": torch.int64, "state_idx": torch.int32,
             "context_lens": torch.int32, "block_tables": torch.int32}

    def __init__(self, max_batch: int, max_blocks: int, device):
        self.max_batch, self.max_blocks = max_batch, max_blocks
        pin = torch.device(device).type == "cuda"

        def shape(name):
            return (max_batch, max_blocks) if name == "block_tables" else (max_batch,)

        self.host = [{k: torch.zeros(shape(k), dtype=d, pin_memory=pin) for k, d in self.NAMES.items()}
                     for _ in range(2)]
        self.dev = {k: torch.zeros(shape(k), dtype=d, device=device) for k, d in self.NAMES.items()}
        self._turn = 0
        self.width = max_blocks  # block-table columns the next step reads
        # per staging set: (row owner, blocks written) of each block-table row; tables grow one block per
        # block_size tokens, so most steps rewrite no row at all
        self._rows = [[None] * max_batch for _ in range(2)]

    def fill(self, positions, slot_mapping, state_idx, context_lens, block_tables, padded: int, row_owners=None):
        """Write a decode batch (B rows) padded to `padded` rows, then one async copy per buffer. row_owners
        (e.g. sequence ids) lets unchanged block-table rows be skipped."""
        B = len(positions)
        host, rows = self.host[self._turn], self._rows[self._turn]
        self._turn ^= 1
        h = {k: v.numpy() for k, v in host.items()}
        h["positions"][:B] = positions
        h["slot_mapping"][:B] = slot_mapping
        h["state_idx"][:B] = state_idx
        h["context_lens"][:B] = context_lens
        bt = h["block_tables"]
        # Eager steps read only the table columns in use (the CPU reference gathers every column it is given);
        # with no rows (graph capture) the full width, which captured graphs keep.
        self.width = max((len(row) for row in block_tables), default=self.max_blocks) or self.max_blocks
        for i, row in enumerate(block_tables):
            key = (row_owners[i], len(row)) if row_owners is not None else None
            if key is None or rows[i] != key:
                bt[i, :len(row)] = row
                rows[i] = key
        # padding rows: stored nowhere, no state, empty context
        h["positions"][B:padded] = 0
        h["slot_mapping"][B:padded] = -1
        h["state_idx"][B:padded] = -1
        h["context_lens"][B:padded] = 0
        for k in self.dev:
            self.dev[k][:padded].copy_(host[k][:padded], non_blocking=True)

    def metadata(self, padded: int) -> StepMetadata:
        d = self.dev
        return StepMetadata(
            is_prefill=False, num_tokens=padded, positions=d["positions"][:padded],
            slot_mapping=d["slot_mapping"][:padded], state_idx=d["state_idx"][:padded],
            block_tables=d["block_tables"][:padded, :self.width], context_lens=d["context_lens"][:padded])
