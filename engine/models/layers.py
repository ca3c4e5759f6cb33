"""Small building blocks shared by the text and vision models."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops
from engine.models.glue import Glue
from engine.models.quant_linear import QuantWeight, is_quantized, leaves, quant_linear, wants_fp8_input
from engine.quant_config import NVFP4


def fused_weight(shard_sizes: list[int], in_features: int, **factory) -> nn.Parameter:
    """A [sum(shard_sizes), in_features] weight whose row blocks are loaded from separate checkpoint tensors."""
    p = nn.Parameter(torch.empty(sum(shard_sizes), in_features, **factory), requires_grad=False)
    p.shard_sizes = list(shard_sizes)
    return p


def param(*shape, **factory) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, **factory), requires_grad=False)


class DecodeProjections:
    """How decode steps of at most MAX_M rows run their projections: kernels/small_m_linear's GEMV, which beats cuBLAS
    at these shapes (bench/results/h200_small_m_linear.json).
    One split-K workspace serves every projection: a step's launches run one after another on one stream.
    Products of more than MAX_M rows (prefill chunks, larger decode batches) keep the plain torch ops (cuBLAS).
    swiglu_epilogue: the MLP's gate_up GEMV applies silu(gate) * up to its own output (kernels/small_m_linear.
    linear_silu_mul), so no SwiGLU kernel runs and the [M, 2I] gate_up output is never stored.
    pdl (the model runner passes False where the GPU has no PDL): the GEMVs use programmatic dependent launch
    (kernels/small_m_linear), overlapping each one's start with the end of the kernel before (DecodePath.pdl does
    the same for the other decode kernels).
    The norms stay kernels of their own and the SwiGLU is gate_up's epilogue: computed by the GEMV that reads them,
    as it loads its input, they were slower (kernels/small_m_linear's docstring).
    Quantized weights' GEMVs (kernels/quant_linear) take the same workspace, PDL and SwiGLU epilogue."""

    def __init__(self, workspace: ops.SplitKWorkspace | None = None, pdl: bool = False, swiglu_epilogue: bool = False):
        self.workspace, self.swiglu_epilogue = workspace, swiglu_epilogue
        self.launch = dict(workspace=workspace, pdl=True) if pdl else dict(workspace=workspace)

    @classmethod
    def for_model(cls, weights: list, pdl: bool = False, swiglu_epilogue: bool = False) -> DecodeProjections:
        """Sized for the largest split-K launch among `weights` (bf16 tensors, quantized weights) at MAX_M rows.
        Disabled (the torch ops) where the kernels would run their torch references anyway (CPU, unless
        OCRIA_FORCE_TRITON=1)."""
        blocks = [b for w in weights for b in leaves(w)]
        w = next(b for b in blocks if isinstance(b, torch.Tensor))  # the head is never quantized
        if not ops.use_triton(w):
            return cls()
        parts, tiles = 1, 1
        for b in blocks:
            need = ops.quant_workspace_size(*b.shape, b.data.device, b.kind == NVFP4, ops.MAX_M) \
                if isinstance(b, QuantWeight) else ops.workspace_size(*b.shape, b.dtype, b.device, ops.MAX_M)
            parts, tiles = max(parts, need[0]), max(tiles, need[1])
        # (the SwiGLU epilogue launches gate_up with the plain launch's tiles and splits: the same workspace fits it)
        return cls(ops.SplitKWorkspace(torch.empty(parts, dtype=torch.float32, device=w.device),
                                   torch.zeros(tiles, dtype=torch.int32, device=w.device)), pdl, swiglu_epilogue)

    def gemv(self, rows: int) -> bool:
        """Whether a product of `rows` rows runs on the GEMV (else the torch op)."""
        return self.workspace is not None and rows <= ops.MAX_M

    def linear(self, x: torch.Tensor, weight: torch.Tensor, swiglu: bool = False) -> torch.Tensor:
        """x @ weight.T; swiglu (GEMV only, see mlp): silu(gate) * up of a fused [gate | up] weight's product.
        Quantized weights (engine/models/quant_linear) pick their own kernels, with this launch."""
        if is_quantized(weight):
            return quant_linear(x, weight, launch=self.launch, swiglu=swiglu)
        if self.gemv(x.shape[0]):
            return (ops.linear_silu_mul if swiglu else ops.small_m_linear)(x, weight, **self.launch)
        return F.linear(x, weight)

    def mlp(self, x: torch.Tensor | None, gate_up_weight, down_weight, x_fp8=None, out_dtype=None) -> torch.Tensor:
        """down(silu(gate) * up) of a SwiGLU MLP with a fused [gate | up] weight. Quantized weights: x may come
        quantized already (x_fp8 = (q, scale) from the norm, x None, out_dtype given) for an FP8 W8A8 gate_up, and an
        FP8 W8A8 down_proj gets its input from the SwiGLU kernel that also quantizes it (kernels/fp8_quant)."""
        fused = self.swiglu_epilogue and x is not None and self.gemv(x.shape[0])
        if fused and isinstance(gate_up_weight, QuantWeight):  # the quantized GEMV's own SwiGLU epilogue
            return self.linear(self.linear(x, gate_up_weight, swiglu=True), down_weight)
        if is_quantized(gate_up_weight) or is_quantized(down_weight):
            gate_up = quant_linear(x, gate_up_weight, x_fp8, out_dtype, launch=self.launch) \
                if is_quantized(gate_up_weight) else self.linear(x, gate_up_weight)
            if wants_fp8_input(down_weight, gate_up.shape[0]):
                return quant_linear(None, down_weight, ops.silu_mul_quant_fp8(gate_up), out_dtype=gate_up.dtype)
            return self.linear(ops.silu_mul(gate_up), down_weight)
        if fused:
            return self.linear(self.linear(x, gate_up_weight, swiglu=True), down_weight)
        return self.linear(ops.silu_mul(self.linear(x, gate_up_weight)), down_weight)


@dataclass(frozen=True)
class DecodePath:
    """How the decoder's layers run a step, chosen once by the model runner for its device (engine/options.
    DecodeTuning) and handed to the model whole (`use`): each layer takes the parts it needs, so no layer attribute
    is set from outside its class. The defaults are the plain torch path (the CPU's)."""
    proj: DecodeProjections = field(default_factory=DecodeProjections)
    glue: Glue = field(default_factory=Glue)
    pdl: bool = False  # norms', GDN and attention decode kernels with programmatic dependent launch (sm_90+)
    fused_attention_decode: bool = False  # attention decode inputs (q/k norm, rotary, KV store) from one kernel
