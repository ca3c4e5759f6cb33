"""Checks of a request before it is queued: sampling parameters, the prompt against the vocabulary and the context,
and image inputs against their grids. A request that fails one is refused whole (RequestRejected), before it holds
any engine state."""
from __future__ import annotations

import numpy as np
import torch

from engine.block_manager import BlockManager, blocks_for
from engine.config import ModelConfig
from engine.interface import SamplingParams
from engine.sequence import ImageInputs


class RequestRejected(ValueError):
    """The request can never run on this engine (too long, malformed); nothing was queued."""


def check_sampling(request_id: str, sampling: SamplingParams, keep_logits: bool, max_num_seqs: int) -> None:
    """Sampling parameters in range; loop guards and beam search only in the combinations the engine runs."""
    if sampling.max_tokens < 1:
        raise RequestRejected(f"request {request_id!r}: max_tokens must be >= 1, got {sampling.max_tokens}")
    if sampling.temperature < 0 or not 0 < sampling.top_p <= 1 or sampling.top_k < 0 or sampling.num_beams < 1:
        raise RequestRejected(f"request {request_id!r}: bad sampling params {sampling}")
    loops = [n for n in (sampling.loop_stop_tokens, sampling.loop_drop_tokens) if n]
    if (loops and (min(loops) < 3 or len(loops) > 1 or sampling.num_beams > 1)
            or (sampling.loop_ban_next and not sampling.loop_drop_tokens)):
        raise RequestRejected(f"request {request_id!r}: loop_stop_tokens and loop_drop_tokens must be 0 (off) or "
                              f">= 3, one of them at most, and work without beam search only; loop_ban_next needs "
                              f"loop_drop_tokens; got {sampling}")
    if sampling.num_beams > 1 and (sampling.temperature > 0 or keep_logits or sampling.num_beams > max_num_seqs):
        raise RequestRejected(f"request {request_id!r}: beam search needs temperature 0, no keep_logits and "
                              f"num_beams <= max_num_seqs ({max_num_seqs}); got {sampling}")


def check_prompt(request_id: str, ids: list[int], sampling: SamplingParams, vocab_size: int, max_model_len: int,
                 block_manager: BlockManager) -> None:
    """Token ids in the vocabulary, and the prompt plus max_tokens within the context and the KV cache (per beam)."""
    if not ids:
        raise RequestRejected(f"request {request_id!r}: empty prompt")
    if any(t < 0 or t >= vocab_size for t in ids):
        raise RequestRejected(f"request {request_id!r}: token id outside [0, {vocab_size})")
    budget = len(ids) + sampling.max_tokens
    if budget > max_model_len:
        raise RequestRejected(
            f"request {request_id!r}: prompt ({len(ids)} tokens) + max_tokens ({sampling.max_tokens}) = {budget} "
            f"exceeds the context budget max_model_len={max_model_len}; shrink the image (max_pixels), "
            f"lower max_tokens or raise max_model_len")
    if sampling.num_beams * blocks_for(budget, block_manager.block_size) > block_manager.num_blocks:
        raise RequestRejected(f"request {request_id!r}: needs {budget} tokens of KV cache for each of its "
                              f"{sampling.num_beams} beam(s), the whole cache holds "
                              f"{block_manager.num_blocks * block_manager.block_size}")


def image_inputs(request_id: str, cfg: ModelConfig, ids: list[int], pixel_values, grids: list[tuple[int, int, int]],
                 has_image_processor: bool) -> ImageInputs:
    """pixel_values [P, patch_dim] (float) or [P, patch_dim / t] (uint8, expanded on the device) checked against the
    grids and the prompt's image-token runs: one run of exactly (t * h * w) / merge^2 tokens per image, in order."""
    v = cfg.vision
    pv = torch.as_tensor(np.asarray(pixel_values) if not torch.is_tensor(pixel_values) else pixel_values)
    n_patches = sum(t * h * w for t, h, w in grids)
    compact = pv.dtype == torch.uint8  # Processor.page_inputs(compact=True): expanded on the device
    width = v.patch_dim // v.temporal_patch_size if compact else v.patch_dim
    if pv.dim() != 2 or pv.shape != (n_patches, width):
        raise RequestRejected(f"request {request_id!r}: pixel_values shape {tuple(pv.shape)}, grids imply "
                              f"[{n_patches}, {width}]")
    if compact and (not has_image_processor or any(t != 1 for t, _, _ in grids)):
        raise RequestRejected(f"request {request_id!r}: uint8 patches need still images (grid t = 1) and the "
                              f"checkpoint's image processor; pass float32 patches instead")
    m2 = v.spatial_merge_size**2
    spans, i, arr = [], 0, np.asarray(ids)
    is_img = arr == cfg.image_token_id
    for t, h, w in grids:
        n = t * h * w // m2
        starts = np.flatnonzero(is_img[i:])
        if not len(starts):
            raise RequestRejected(f"request {request_id!r}: fewer image-token runs than images")
        a = i + int(starts[0])
        if not is_img[a:a + n].all() or (a + n < len(arr) and is_img[a + n]):
            raise RequestRejected(f"request {request_id!r}: image of grid {(t, h, w)} needs exactly {n} "
                                  f"consecutive image tokens at {a}")
        spans.append((a, n))
        i = a + n
    if is_img[i:].any():
        raise RequestRejected(f"request {request_id!r}: more image tokens than the images provide")
    return ImageInputs(pv if compact else pv.float(), grids, spans)
