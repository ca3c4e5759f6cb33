"""Rotary embeddings: interleaved multimodal RoPE for the text model, 2-D axial RoPE for the vision tower,
and the (T, H, W) position ids of a prompt with images.
"""
from __future__ import annotations

import numpy as np
import torch


def inv_frequencies(dim: int, theta: float, device=None) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))


def mrope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, mrope_section, dtype: torch.dtype):
    """positions [3, N] (T, H, W) or [N] (text: all axes equal) -> cos, sin [N, rotary_dim] in `dtype`.

    Interleaved layout: frequency i takes its angle from the T axis, except i % 3 == 1 (< 3*section[1]) from H and
    i % 3 == 2 (< 3*section[2]) from W.
    """
    if positions.dim() == 1:
        freqs = positions.float()[:, None] * inv_freq[None, :]
    else:
        per_axis = positions.float()[:, :, None] * inv_freq[None, None, :]  # [3, N, F]
        freqs = per_axis[0].clone()
        for axis in (1, 2):
            sl = slice(axis, 3 * mrope_section[axis], 3)
            freqs[:, sl] = per_axis[axis][:, sl]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, D]; rotate the first cos.shape[-1] dims (rotate-half pairing), pass the rest through."""
    rd = cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    xr, xp = x[..., :rd], x[..., rd:]
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
    rotated = torch.cat([-x2, x1], dim=-1)
    out = xr * c + rotated * s
    return torch.cat([out, xp], dim=-1) if xp.shape[-1] else out


def mrope_positions(token_ids, image_token_id: int | None, image_grids, merge: int) -> tuple[np.ndarray, int]:
    """(T, H, W) positions [3, L] for a prompt and the rope delta for the tokens generated after it.

    Text tokens advance all three axes together. The run of t*h*w/merge^2 image tokens of each image gets
    T = s + t_idx, H = s + h_idx, W = s + w_idx on the merged grid, and the next text token starts at
    s + max(h, w) / merge. Decode positions are then index + delta.
    """
    ids = np.asarray(token_ids)
    L = len(ids)
    pos = np.zeros((3, L), dtype=np.int64)
    grids = list(image_grids or [])
    is_img = (ids == image_token_id) if image_token_id is not None else np.zeros(L, dtype=bool)
    i, cur, g = 0, 0, 0
    while i < L:
        if not is_img[i]:
            j = i
            while j < L and not is_img[j]:
                j += 1
            pos[:, i:j] = np.arange(cur, cur + j - i)[None, :]
            cur += j - i
            i = j
            continue
        if g >= len(grids):
            raise ValueError(f"prompt has more image-token runs than images ({len(grids)})")
        t, h, w = (int(v) for v in grids[g])
        gh, gw = h // merge, w // merge
        n = t * gh * gw
        if i + n > L or not is_img[i:i + n].all():
            raise ValueError(f"image {g}: expected {n} consecutive image tokens at position {i}")
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
        pos[0, i:i + n] = cur + tt.ravel()
        pos[1, i:i + n] = cur + hh.ravel()
        pos[2, i:i + n] = cur + ww.ravel()
        cur += max(h, w) // merge
        i += n
        g += 1
    if g != len(grids):
        raise ValueError(f"{len(grids)} images given but the prompt has image tokens for {g}")
    delta = int(pos.max()) + 1 - L if L else 0
    return pos, delta


def vision_rotary_cos_sin(grids, merge: int, head_dim: int, theta: float, device=None):
    """2-D axial rotary for patches in merge-block order: cos, sin [P, head_dim] (fp32)."""
    inv = inv_frequencies(head_dim // 2, theta, device)
    rows, cols = [], []
    for t, h, w in grids:
        r = torch.arange(h, device=device)[:, None].expand(h, w)
        c = torch.arange(w, device=device)[None, :].expand(h, w)
        # (h, w) -> (h/m, m, w/m, m) -> (h/m, w/m, m, m): the order the processor emits patches in
        r = r.reshape(h // merge, merge, w // merge, merge).permute(0, 2, 1, 3).reshape(-1)
        c = c.reshape(h // merge, merge, w // merge, merge).permute(0, 2, 1, 3).reshape(-1)
        rows.append(r.repeat(t))
        cols.append(c.repeat(t))
    r = torch.cat(rows).float()
    c = torch.cat(cols).float()
    emb = torch.cat([r[:, None] * inv[None, :], c[:, None] * inv[None, :]], dim=-1)
    emb = torch.cat([emb, emb], dim=-1)
    return emb.cos(), emb.sin()
