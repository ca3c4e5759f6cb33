"""Training-time chunked gated delta rule for transformers' Qwen3.5 Gated DeltaNet layers, in fewer torch ops.

Without fla (whose backward refuses this H200 image's Triton on Hopper), transformers runs its torch fallback, which
dispatches ~45 ops for every 64-token chunk of every layer under training's autocast: at 1,536 px pages (~2,100
tokens) the 12 layers dispatch 20,940 ops forward (95 % of the forward's ops) and ~32 k backward a step
(research/ocria_tiny/results/op_count_1536.json). Each op costs host time on the GPU however small its tensors. The
engine's own prefill form of the same recurrence (engine.models.gdn_prefill.chunked_delta_rule_torch) runs a chunk in
three batched multiply-adds; this adapts transformers' call to it. transformers' function is the reference
(tests/test_chunked_gdn.py).
"""
from __future__ import annotations

import contextlib
import functools

import torch

from engine.models.gdn_prefill import chunked_delta_rule_torch
from engine.step_metadata import chunked_layout


def chunked_gated_delta_rule(query, key, value, g, beta, chunk_size: int = 64, initial_state=None,
                             output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, **kwargs):
    """transformers.models.qwen3_5's torch_chunk_gated_delta_rule, same arguments and results: query/key [B, T, H, k],
    value [B, T, H, v], g/beta [B, T, H] -> (out [B, T, H, v] in query's dtype, final state [B, H, k, v] or None).
    The engine's form always L2-normalises q and k, as Qwen3.5's layers ask; packed sequences (`cu_seqlens`) are not
    supported, as in the reference."""
    if kwargs.get("cu_seqlens") is not None:
        raise ValueError("chunked_gated_delta_rule: packed sequences (cu_seqlens) are not supported")
    if not use_qk_l2norm_in_kernel:
        raise ValueError("chunked_gated_delta_rule: q and k are always L2-normalised (use_qk_l2norm_in_kernel=True)")
    b, t, h, dk = key.shape
    dv = value.shape[-1]
    rows, n_chunks = chunked_layout([t] * b, chunk_size)
    states = (torch.zeros(b, h, dk, dv, dtype=torch.float32, device=query.device) if initial_state is None
              else initial_state)
    # in fp32 throughout, also under training's bf16 autocast: the state is a running sum over the whole sequence
    # (transformers' fallback keeps it in fp32 too), and autocast's casts would add ops to every chunk
    with torch.autocast(query.device.type, enabled=False):
        out, state = chunked_delta_rule_torch(
            query.reshape(b * t, h, dk), key.reshape(b * t, h, dk), value.reshape(b * t, h, dv).float(),
            g.reshape(b * t, h), beta.reshape(b * t, h), states, torch.from_numpy(rows).to(query.device), n_chunks,
            chunk_size)
    return out.reshape(b, t, h, dv).to(query.dtype), (state if output_final_state else None)


@contextlib.contextmanager
def chunked_gdn_in(modeling_module, chunk_size: int = 64):
    """Within the block, transformers' Qwen3.5 Gated DeltaNet layers (`modeling_module`, e.g.
    transformers.models.qwen3_5.modeling_qwen3_5) run chunked_gated_delta_rule for whole sequences, in chunks of
    `chunk_size` tokens; restored on exit. The layers call the module's function by name, so it is swapped there, for
    the block only."""
    name = "torch_chunk_gated_delta_rule"
    original = getattr(modeling_module, name)
    setattr(modeling_module, name, functools.partial(chunked_gated_delta_rule, chunk_size=chunk_size))
    try:
        yield
    finally:
        setattr(modeling_module, name, original)
