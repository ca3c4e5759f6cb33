"""Small building blocks shared by the text and vision models."""
from __future__ import annotations

import torch
from torch import nn


def fused_weight(shard_sizes: list[int], in_features: int, **factory) -> nn.Parameter:
    """A [sum(shard_sizes), in_features] weight whose row blocks are loaded from separate checkpoint tensors."""
    p = nn.Parameter(torch.empty(sum(shard_sizes), in_features, **factory), requires_grad=False)
    p.shard_sizes = list(shard_sizes)
    return p


def param(*shape, **factory) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, **factory), requires_grad=False)
