"""Training-time attention for the vision tower of transformers' Qwen3.5 model: all images of a batch in one SDPA call.

Without flash-attn, transformers' vision attention splits the packed patches image by image and calls attention once
per image and block: 768 calls forward and as many backward for a batch of 128 pages in a 6-block tower, each one a
small launch with host work around it. Here the images are padded to the longest one, [images, heads, L, d], and run
as one masked SDPA call (a padded key is never attended to; padded query rows are dropped).

transformers hands the images' boundaries (cu_seqlens) only to implementations whose name contains "flash", so the
function is registered under such a name; it is plain torch and runs anywhere, CPU included.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

NAME = "packed_sdpa_flash_api"  # "flash": transformers passes cu_seqlens (its flash-attention calling convention)


def packed_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, cu_seq_lens_q=None,
                     max_length_q=None, **kwargs):
    """query, key, value [1, heads, T, d]: the patches of n images one after another, image i being rows
    cu_seq_lens_q[i]:cu_seq_lens_q[i + 1]; each attends within its own image. Returns ([1, T, heads, d], None)."""
    _, heads, total, dim = query.shape
    cu = cu_seq_lens_q.to(device=query.device, dtype=torch.long)
    lens = cu[1:] - cu[:-1]
    n = lens.numel()
    longest = int(max_length_q) if max_length_q is not None else int(lens.max())
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
    return out.transpose(1, 2).reshape(n * longest, heads, dim).index_select(0, slot)[None], None


def use_packed_vision_attention(model) -> None:
    """Route the vision tower of a Qwen3_5ForConditionalGeneration through packed_attention."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packed_attention)
    model.model.visual.config._attn_implementation = NAME
