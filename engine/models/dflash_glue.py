"""The drafter's element-wise steps at inference (engine/models/dflash.DFlashDrafter.draft_hidden / write_context):
Qwen3 RMSNorm (plain weight) with the residual add before it, per-head q/k norm + rotary, the rotary tables. Plain
torch functions; on CUDA engine/model_runner swaps in torch.compile'd versions, so each is one or two fused kernels
instead of the 5-15 launches its torch ops make, in every draft pass and context write. The same math as the
training pass's modules (dflash.DraftLayer).
"""
from __future__ import annotations

import torch

from engine.rope import apply_rotary


def norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm in fp32, rounded to x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def add_norm(residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """(residual + delta, its norm): the residual stream after a sublayer and the next sublayer's input."""
    h = residual + delta
    return h, norm(h, weight, eps)


def qkv_heads(qkv, q_norm, k_norm, cos, sin, eps: float, nh: int, nkv: int, hd: int):
    """Fused projection [N, (nh + 2 nkv) hd] -> q [N, nh, hd], k [N, nkv, hd] (normed per head, rotated), v."""
    N = qkv.shape[0]
    q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
    q = apply_rotary(norm(q.reshape(N, nh, hd), q_norm, eps), cos, sin)
    k = apply_rotary(norm(k.reshape(N, nkv, hd), k_norm, eps), cos, sin)
    return q.contiguous(), k.contiguous(), v.reshape(N, nkv, hd).contiguous()


def kv_heads(kv, k_norm, cos, sin, eps: float, nkv: int, hd: int):
    """Fused projection [N, 2 nkv hd] of context rows -> k (normed per head, rotated), v [N, nkv, hd]."""
    N = kv.shape[0]
    k, v = kv.split([nkv * hd, nkv * hd], dim=-1)
    k = apply_rotary(norm(k.reshape(N, nkv, hd), k_norm, eps), cos, sin)
    return k.contiguous(), v.reshape(N, nkv, hd).contiguous()


def rotary(index: torch.Tensor, inv_freq: torch.Tensor, like: torch.Tensor):
    """cos, sin [N, head_dim] of positions index [N], in like's dtype (rotate-half layout)."""
    freqs = index.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos().to(like.dtype), emb.sin().to(like.dtype)


class DraftGlue:
    """The functions above, eager or compiled (dynamic shapes: one compilation serves every batch size)."""

    NAMES = ("norm", "add_norm", "qkv_heads", "kv_heads", "rotary")

    def __init__(self, compiled: bool = False, backend: str = "inductor"):
        self.compiled = compiled
        for name in self.NAMES:
            fn = globals()[name]
            setattr(self, name, torch.compile(fn, dynamic=True, fullgraph=True, backend=backend) if compiled else fn)
