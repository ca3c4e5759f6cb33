"""Small building blocks shared by the text and vision models."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops
from kernels.small_m_linear import MAX_M, SplitKWorkspace, default_launch, split_ranges


def fused_weight(shard_sizes: list[int], in_features: int, **factory) -> nn.Parameter:
    """A [sum(shard_sizes), in_features] weight whose row blocks are loaded from separate checkpoint tensors."""
    p = nn.Parameter(torch.empty(sum(shard_sizes), in_features, **factory), requires_grad=False)
    p.shard_sizes = list(shard_sizes)
    return p


def param(*shape, **factory) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, **factory), requires_grad=False)


class NormedInput(NamedTuple):
    """rmsnorm(x [+ residual]) not computed yet: the decode projection that reads it applies the norm on load
    (kernels/small_m_linear.rmsnorm_linear) and, with a residual, writes x + residual into residual_out, which the
    layer already holds as its new residual stream. Consumed by exactly one projection."""
    x: torch.Tensor
    residual: torch.Tensor | None
    weight: torch.Tensor
    eps: float
    residual_out: torch.Tensor | None


class DecodeProjections:
    """How decode steps of at most MAX_M rows run their projections: kernels/small_m_linear's GEMV, which beats cuBLAS
    at these shapes on the H200 (bench/results/h200_small_m_linear.json; 5 % per decode step: h200_decode_gemv.json).
    One split-K workspace serves every projection: a step's launches run one after another on one stream.
    Products of more than MAX_M rows (prefill chunks, larger decode batches) keep the plain torch ops (cuBLAS).
    swiglu_epilogue: the MLP's gate_up GEMV applies silu(gate) * up to its own output (kernels/small_m_linear.
    linear_silu_mul), so no SwiGLU kernel runs and the [M, 2I] gate_up output is never stored (1.6 % faster decode
    steps on the H200, bench/results/h200_decode_epilogues.json).
    pdl (mode 1 or 2 of kernels/_common.pdl_enter; the model runner passes 0 where the GPU has no PDL): the GEMVs
    use programmatic dependent launch (kernels/small_m_linear), overlapping each one's start with the end of the
    kernel before (TextModel.set_pdl does the same for the other decode kernels; together 2-3 % faster decode steps
    at b1-b8, bench/results/h200_decode_pdl.json).
    fuse_norm (off, not yet timed in this form): the RMSNorm before each layer's first projection and its MLP is
    applied by that projection's GEMV as it reads its input (kernels/small_m_linear.rmsnorm_linear, in one pass where
    the launch does not split K), with the gate_up GEMV's SwiGLU epilogue too.
    prologues (off): the elementwise op before a projection computed inside the GEMV (SwiGLU before down_proj, the
    GDN's gated norm before its out_proj). Their first form measured slower on the H200; reworked since (the math on
    the rows that exist), not yet timed."""

    def __init__(self, workspace: SplitKWorkspace | None = None, fuse_norm: bool = False, pdl: int = 0,
                 prologues: bool = False, swiglu_epilogue: bool = False):
        self.workspace, self.fuse_norm, self.prologues = workspace, fuse_norm, prologues
        self.swiglu_epilogue = swiglu_epilogue
        self.launch = dict(workspace=workspace, pdl=int(pdl)) if pdl else dict(workspace=workspace)

    @classmethod
    def for_model(cls, weights: list[torch.Tensor], fuse_norm: bool, pdl: int = 0,
                  prologues: bool = False, swiglu_epilogue: bool = False) -> DecodeProjections:
        """Sized for the largest split-K launch among `weights` at MAX_M rows. Disabled (the torch ops) where the
        kernels would run their torch references anyway (CPU, unless OCRIA_FORCE_TRITON=1)."""
        w = weights[0]
        if not ops.use_triton(w):
            return cls()
        parts, tiles = 1, 1
        for wt in weights:
            N, K = wt.shape
            d = default_launch(N, K, wt.dtype, wt.device)
            S = split_ranges(K, d["block_k"], d["split_k"])[1]
            if S > 1:
                parts, tiles = max(parts, S * MAX_M * N), max(tiles, -(-N // d["block_n"]))
        # (linear_silu_mul launches gate_up with the plain launch's tiles and splits: the same workspace fits it)
        return cls(SplitKWorkspace(torch.empty(parts, dtype=torch.float32, device=w.device),
                                   torch.zeros(tiles, dtype=torch.int32, device=w.device)), fuse_norm,
                   pdl, prologues, swiglu_epilogue)

    def gemv(self, rows: int) -> bool:
        """Whether a product of `rows` rows runs on the GEMV (else the torch op)."""
        return self.workspace is not None and rows <= MAX_M

    def on(self, rows: int, is_prefill: bool) -> bool:
        return not is_prefill and self.gemv(rows)

    def defer_norm(self, rows: int, is_prefill: bool) -> bool:
        return self.fuse_norm and self.on(rows, is_prefill)

    def linear(self, x, weight: torch.Tensor, swiglu: bool = False) -> torch.Tensor:
        """x @ weight.T; swiglu (GEMV only, see mlp): silu(gate) * up of a fused [gate | up] weight's product."""
        if isinstance(x, NormedInput):
            y = ops.rmsnorm_linear(x.x, x.weight, x.eps, weight, x.residual, residual_out=x.residual_out,
                                   swiglu=swiglu, **self.launch)
            return y if x.residual is None else y[0]
        if self.gemv(x.shape[0]):
            return (ops.linear_silu_mul if swiglu else ops.small_m_linear)(x, weight, **self.launch)
        return F.linear(x, weight)

    def gated_rmsnorm_linear(self, o: torch.Tensor, z: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                             weight: torch.Tensor) -> torch.Tensor:
        """out_proj(gated_rmsnorm(o, z)) of a GDN layer, o and z [N, heads, head_dim]."""
        if self.prologues and self.gemv(o.shape[0]):
            return ops.gated_rmsnorm_linear(o, z, norm_weight, eps, weight, **self.launch)
        gated = ops.gated_rmsnorm(o, z, norm_weight, eps, pdl=self.launch.get("pdl", 0))
        return self.linear(gated.reshape(o.shape[0], -1), weight)

    def mlp(self, x, gate_up_weight: torch.Tensor, down_weight: torch.Tensor) -> torch.Tensor:
        """down(silu(gate) * up) of a SwiGLU MLP with a fused [gate | up] weight. The SwiGLU is the gate_up GEMV's
        epilogue unless the prologues are on (then down_proj's prologue computes it)."""
        rows = (x.x if isinstance(x, NormedInput) else x).shape[0]
        if self.swiglu_epilogue and not self.prologues and self.gemv(rows):
            return self.linear(self.linear(x, gate_up_weight, swiglu=True), down_weight)
        return self.silu_mul_linear(self.linear(x, gate_up_weight), down_weight)

    def silu_mul_linear(self, gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.prologues and self.gemv(gate_up.shape[0]):
            return ops.silu_mul_linear(gate_up, weight, **self.launch)
        return self.linear(ops.silu_mul(gate_up), weight)
