"""Training-time attention for the vision tower of transformers' Qwen3.5 model: all images of a batch in one SDPA call.

Without flash-attn, transformers' vision attention splits the packed patches image by image and calls attention once
per image and block: 768 calls forward and as many backward for a batch of 128 pages in a 6-block tower, each one a
small launch with host work around it. Here one call per block covers the whole batch: on CUDA in bf16, flash
attention's variable-length kernel over the packed rows; elsewhere the images padded to the longest one,
[images, heads, L, d], in one masked SDPA call.

transformers hands the images' boundaries (cu_seqlens) only to implementations whose name contains "flash", so the
function is registered under such a name; it is plain torch and runs anywhere, CPU included.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

NAME = "packed_sdpa_flash_api"  # "flash": transformers passes cu_seqlens (its flash-attention calling convention)


def padded_attention(query, key, value, cu, longest: int, scaling=None, dropout=0.0):
    """query, key, value [1, heads, T, d], image i being rows cu[i]:cu[i + 1] (cu int64): the images padded to the
    longest, [images, heads, L, d], in one masked SDPA call (a padded key is never attended to; padded query rows are
    dropped). Runs anywhere: the reference for varlen_flash_attention and the path off CUDA. Returns [T, heads, d]."""
    _, heads, total, dim = query.shape
    lens = cu[1:] - cu[:-1]
    n = lens.numel()
    image = torch.repeat_interleave(torch.arange(n, device=query.device), lens, output_size=total)  # no host sync
    slot = image * longest + torch.arange(total, device=query.device) - cu[image]  # row in the padded [n * L] layout

    def padded(t):  # [1, heads, T, d] -> [n, heads, L, d]
        rows = t[0].new_zeros(heads, n * longest, dim).index_copy(1, slot, t[0])
        return rows.view(heads, n, longest, dim).transpose(0, 1)

    keep = (torch.arange(longest, device=query.device) < lens[:, None])[:, None, None, :]  # [n, 1, 1, L]
    # on CUDA only the memory-efficient kernel: the math fallback would hold n * heads * L^2 fp32 scores (GBs)
    backends = [SDPBackend.EFFICIENT_ATTENTION] if query.is_cuda else [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    with sdpa_kernel(backends):
        out = F.scaled_dot_product_attention(padded(query), padded(key), padded(value), attn_mask=keep,
                                             dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).reshape(n * longest, heads, dim).index_select(0, slot)


def varlen_flash_attention(query, key, value, cu, longest: int):
    """The same as padded_attention (default scale, no dropout) through flash attention's variable-length kernel:
    no padding and no mask, which the padded call needs and which keep it on the slower memory-efficient kernel
    (half of a 1,536 px training step's device time, research/ocria_tiny/results/s21_train_profile_padded.txt).
    CUDA with bf16/fp16 inputs only. Returns [T, heads, d]."""
    from torch.nn.attention.varlen import varlen_attn

    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, d]
    cu32 = cu.to(torch.int32)
    return varlen_attn(q, k, v, cu32, cu32, longest, longest)


def flash_varlen_usable(query, scaling, dropout) -> bool:
    if not (query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and not dropout):
        return False
    if scaling is not None and abs(scaling * query.shape[-1] ** 0.5 - 1) > 1e-6:
        return False  # varlen_attn's portable signature has no scale argument: the default 1/sqrt(d) only
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401  (torch >= 2.9)
    except ImportError:
        return False
    return True


def packed_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, cu_seq_lens_q=None,
                     max_length_q=None, **kwargs):
    """query, key, value [1, heads, T, d]: the patches of n images one after another, image i being rows
    cu_seq_lens_q[i]:cu_seq_lens_q[i + 1]; each attends within its own image. Returns ([1, T, heads, d], None)."""
    cu = cu_seq_lens_q.to(device=query.device, dtype=torch.long)
    longest = int(max_length_q) if max_length_q is not None else int((cu[1:] - cu[:-1]).max())
    if flash_varlen_usable(query, scaling, dropout):
        out = varlen_flash_attention(query, key, value, cu, longest)
    else:
        out = padded_attention(query, key, value, cu, longest, scaling, dropout)
    return out[None], None


def use_packed_vision_attention(model) -> None:
    """Route the vision tower of a Qwen3_5ForConditionalGeneration through packed_attention."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packed_attention)
    model.model.visual.config._attn_implementation = NAME
