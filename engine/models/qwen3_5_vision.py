"""Qwen3.5 vision tower: patch embedding, interpolated learned positions, 2-D rotary ViT blocks attending within
each image, and the 2x2 patch merger that produces one language-model embedding per merged patch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import VisionConfig
from engine.models.layers import param
from engine.rope import vision_rotary_cos_sin


def _linear(d_in: int, d_out: int, **factory) -> nn.Linear:
    return nn.Linear(d_in, d_out, bias=True, **factory).requires_grad_(False)


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig, **factory):
        super().__init__()
        D = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.norm1 = nn.LayerNorm(D, eps=1e-6, **factory).requires_grad_(False)
        self.norm2 = nn.LayerNorm(D, eps=1e-6, **factory).requires_grad_(False)
        self.attn = nn.Module()
        self.attn.qkv = _linear(D, 3 * D, **factory)
        self.attn.proj = _linear(D, D, **factory)
        self.mlp = nn.Module()
        self.mlp.linear_fc1 = _linear(D, cfg.intermediate_size, **factory)
        self.mlp.linear_fc2 = _linear(cfg.intermediate_size, D, **factory)

    def attention(self, x: torch.Tensor, cos, sin, seq_lens: list[int]) -> torch.Tensor:
        P, D = x.shape
        qkv = self.attn.qkv(x).view(P, 3, self.num_heads, D // self.num_heads)
        q, k, v = qkv.unbind(1)
        # rotary in fp32 over the whole head
        c, s = cos[:, None, :], sin[:, None, :]

        def rot(t):
            tf = t.float()
            h = tf.shape[-1] // 2
            return (tf * c + torch.cat([-tf[..., h:], tf[..., :h]], -1) * s).to(t.dtype)

        q, k = rot(q), rot(k)
        outs, start = [], 0
        for n in seq_lens:  # bidirectional attention within one image (frame)
            sl = slice(start, start + n)
            o = F.scaled_dot_product_attention(q[sl].transpose(0, 1)[None], k[sl].transpose(0, 1)[None],
                                               v[sl].transpose(0, 1)[None])
            outs.append(o[0].transpose(0, 1).reshape(n, D))
            start += n
        return self.attn.proj(torch.cat(outs, 0))

    def forward(self, x, cos, sin, seq_lens):
        x = x + self.attention(self.norm1(x), cos, sin, seq_lens)
        h = self.mlp.linear_fc2(F.gelu(self.mlp.linear_fc1(self.norm2(x)), approximate="tanh"))
        return x + h


class VisionModel(nn.Module):
    def __init__(self, cfg: VisionConfig, dtype: torch.dtype, device):
        super().__init__()
        factory = dict(dtype=dtype, device=device)
        self.cfg = cfg
        D = cfg.hidden_size
        self.patch_embed = nn.Module()
        self.patch_embed.weight = param(D, cfg.patch_dim, **factory)  # Conv3d with stride == kernel == a linear map
        self.patch_embed.bias = param(D, **factory)
        self.pos_embed = nn.Module()
        self.pos_embed.weight = param(cfg.num_position_embeddings, D, **factory)
        self.blocks = nn.ModuleList(VisionBlock(cfg, **factory) for _ in range(cfg.depth))
        self.merger = nn.Module()
        M = D * cfg.spatial_merge_size**2
        self.merger.norm = nn.LayerNorm(D, eps=1e-6, **factory).requires_grad_(False)
        self.merger.linear_fc1 = _linear(M, M, **factory)
        self.merger.linear_fc2 = _linear(M, cfg.out_hidden_size, **factory)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embed.weight.dtype

    def interpolated_positions(self, grids) -> torch.Tensor:
        """Bilinear (align_corners) resampling of the square position table to each grid, in merge-block order."""
        side = int(round(self.cfg.num_position_embeddings**0.5))
        m = self.cfg.spatial_merge_size
        table = self.pos_embed.weight
        dev = table.device
        out = []
        for t, h, w in grids:
            def taps(n):
                src = torch.arange(n, device=dev, dtype=torch.float32) * (side - 1) / max(n - 1, 1)
                lo = src.floor()
                d = src - lo  # distance to the lower tap; the upper tap's weight is 1 - |d - 1|
                return lo.long(), (lo.long() + 1).clamp(max=side - 1), 1 - d, 1 - (d - 1).abs()

            r0, r1, wr0, wr1 = taps(h)
            c0, c1, wc0, wc1 = taps(w)
            # the four taps in the order (r0,c0), (r0,c1), (r1,c0), (r1,c1)
            idx = torch.stack([r0[:, None] * side + c0[None, :], r0[:, None] * side + c1[None, :],
                               r1[:, None] * side + c0[None, :], r1[:, None] * side + c1[None, :]], -1)
            wts = torch.stack([wr0[:, None] * wc0[None, :], wr0[:, None] * wc1[None, :],
                               wr1[:, None] * wc0[None, :], wr1[:, None] * wc1[None, :]], -1)
            pe = (table[idx] * wts[..., None]).sum(2)  # [h, w, D], fp32 weights
            pe = pe.reshape(h // m, m, w // m, m, -1).permute(0, 2, 1, 3, 4).reshape(h * w, -1)
            out.append(pe.repeat(t, 1))
        return torch.cat(out, 0)

    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """pixel_values [P, C*T*p*p] (processor order) -> merged embeddings [P / merge^2, out_hidden]."""
        x = F.linear(pixel_values.to(self.dtype), self.patch_embed.weight, self.patch_embed.bias)
        x = x + self.interpolated_positions(grids).to(x.dtype)
        cos, sin = vision_rotary_cos_sin(grids, self.cfg.spatial_merge_size, self.cfg.head_dim, self.cfg.rope_theta,
                                         device=x.device)
        seq_lens = [h * w for t, h, w in grids for _ in range(t)]
        for blk in self.blocks:
            x = blk(x, cos, sin, seq_lens)
        M = self.cfg.hidden_size * self.cfg.spatial_merge_size**2
        x = self.merger.norm(x).view(-1, M)
        return self.merger.linear_fc2(F.gelu(self.merger.linear_fc1(x)))
