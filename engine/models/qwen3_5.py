"""Qwen3.5 (VL or text-only): vision tower + text decoder + LM head, parameter names matching the loader."""
from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
from engine.models.layers import DecodePath, param
from engine.models.qwen3_5_text import TextModel
from engine.models.qwen3_5_vision import VisionModel
from engine.rope import inv_frequencies, mrope_cos_sin
from engine.step_metadata import StepMetadata


class Qwen3_5Model(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device, text_only: bool = False):
        super().__init__()
        self.cfg = cfg
        t = cfg.text
        self.language_model = TextModel(t, dtype, device)
        self.visual = VisionModel(cfg.vision, dtype, device) if cfg.vision is not None and not text_only else None
        if not t.tie_word_embeddings:
            self.lm_head = nn.Module()
            self.lm_head.weight = param(t.vocab_size, t.hidden_size, dtype=dtype, device=device)
        self.register_buffer("inv_freq", inv_frequencies(t.rotary_dim, t.rope_theta, device), persistent=False)
        self.path = DecodePath()

    def use(self, path: DecodePath) -> None:
        """Run steps the way `path` says (engine/models/layers.DecodePath): the decoder's layers and the LM head."""
        self.path = path
        self.language_model.use(path)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.language_model.embed_tokens.weight if self.cfg.text.tie_word_embeddings else self.lm_head.weight

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.embed(input_ids)

    def encode_images(self, pixel_values: torch.Tensor, grids) -> torch.Tensor:
        if self.visual is None:
            raise ValueError("this engine was loaded without a vision tower (text-only)")
        return self.visual(pixel_values, grids)

    @torch.no_grad()
    def forward(self, inputs_embeds: torch.Tensor, meta: StepMetadata, taps: dict | None = None,
                num_layers: int | None = None) -> torch.Tensor | None:
        cos, sin = mrope_cos_sin(meta.positions, self.inv_freq, self.cfg.text.mrope_section, inputs_embeds.dtype)
        return self.language_model(inputs_embeds, meta, cos, sin, taps, num_layers)

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.path.proj.linear(hidden, self.head_weight)
