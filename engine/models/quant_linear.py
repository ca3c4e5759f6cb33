"""Quantized projection weights of the decoder and their linear layer.

A projection module's `.weight` is normally a bf16 [N, K] parameter; in a quantized checkpoint it becomes
  * QuantWeight: one FP8 or NVFP4 weight (several HF tensors of one fused projection concatenated along N; each
    keeps its own scale per row, so shards with different global scales fuse exactly), or
  * SplitWeight: row blocks of different kinds, e.g. the GDN in_proj [qkv | z | b | a] with qkv and z in FP8 and the
    small b and a (gates) in bf16; the product is the blocks' products side by side.
quant_linear(x, weight) runs one: decode-sized inputs through the in-register-dequantizing GEMVs (kernels/quant_linear;
FP8 W8A16 up to FP8_GEMV_MAX_M rows, NVFP4 up to NVFP4_GEMV_MAX_M; with the bf16 GEMVs' split-K workspace, PDL and
SwiGLU epilogue), larger ones through torch._scaled_mm (FP8 W8A8,
activations quantized per token by kernels/fp8_quant or already by a fused producer: x_fp8) or a dequantize-then-GEMM
(NVFP4); on CPU the torch references of the same products.
"""
from __future__ import annotations

import torch
from torch import nn

from engine import ops
from engine.quant_config import FP8, NVFP4


class QuantWeight(nn.Module):
    """FP8: data [N, K] float8_e4m3fn; NVFP4: data [N, K/2] uint8 + block_scale [N, K/16] float8_e4m3fn.
    row_scale [N] fp32: FP8's per-channel scale, or NVFP4's 1 / global scale. act_fp8: W8A8 (dynamic per token)."""

    def __init__(self, kind: str, data: torch.Tensor, row_scale: torch.Tensor, block_scale: torch.Tensor | None = None,
                 act_fp8: bool = False):
        super().__init__()
        self.kind, self.act_fp8 = kind, act_fp8
        self.register_buffer("data", data)
        self.register_buffer("row_scale", row_scale.float().contiguous())
        self.register_buffer("block_scale", block_scale)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.data.shape[0], self.data.shape[1] * (2 if self.kind == NVFP4 else 1))

    @classmethod
    def from_tensors(cls, kind: str, t: dict[str, torch.Tensor], act_fp8: bool, device) -> QuantWeight:
        """One HF module's stored tensors (local names) -> QuantWeight on `device`."""
        if kind == FP8:
            w = t["weight"]
            row = t["weight_scale"].float().reshape(-1).expand(w.shape[0])
            return cls(FP8, w.to(device), row.to(device), act_fp8=act_fp8)
        packed = t["weight_packed"]
        row = (1.0 / t["weight_global_scale"].float()).reshape(1).expand(packed.shape[0])
        return cls(NVFP4, packed.to(device), row.to(device), t["weight_scale"].to(device))

    @staticmethod
    def concat(parts: list[QuantWeight]) -> QuantWeight:
        p0 = parts[0]
        if len(parts) == 1:
            return p0
        cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
        return QuantWeight(p0.kind, cat("data"), cat("row_scale"), cat("block_scale") if p0.kind == NVFP4 else None,
                           p0.act_fp8)

    def same_kind(self, other) -> bool:
        return isinstance(other, QuantWeight) and (self.kind, self.act_fp8) == (other.kind, other.act_fp8)

    def dequantize(self) -> torch.Tensor:
        if self.kind == FP8:
            return ops.dequant_fp8_ref(self.data, self.row_scale)
        return ops.dequant_nvfp4_ref(self.data, self.block_scale, self.row_scale)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data, self.row_scale, self.block_scale) if t is not None)


class PlainWeight(nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    @property
    def shape(self):
        return tuple(self.weight.shape)


class SplitWeight(nn.Module):
    """Row blocks (QuantWeight or PlainWeight) of one fused projection, in output order."""

    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])


def is_quantized(weight) -> bool:
    return isinstance(weight, (QuantWeight, SplitWeight))


def leaves(weight) -> list:
    """What a projection weight multiplies by, block by block: a bf16 tensor or QuantWeight as it is, a SplitWeight's
    parts (a PlainWeight as its tensor)."""
    if isinstance(weight, SplitWeight):
        return [p.weight if isinstance(p, PlainWeight) else p for p in weight.parts]
    return [weight]


def quant_linear(x: torch.Tensor | None, weight, x_fp8: tuple[torch.Tensor, torch.Tensor] | None = None,
                 out_dtype: torch.dtype | None = None, out: torch.Tensor | None = None, swiglu: bool = False,
                 launch: dict | None = None) -> torch.Tensor:
    """x [M, K] @ weight.T -> [M, N] in x's dtype (or out_dtype). x_fp8: (q, scale) of x quantized per token already
    by a fused producer (kernels/fp8_quant); x may then be None, when wants_fp8_input(weight, M). out: where the
    GEMVs write (a column block of a SplitWeight's output). swiglu: silu(gate) * up of a fused [gate | up] weight,
    [M, N/2]: the GEMV's epilogue where a QuantWeight's GEMV serves the rows, else kernels/silu_mul after.
    launch: the GEMVs' shared launch options (engine/models/layers.DecodeProjections: split-K workspace, PDL)."""
    if x is None:
        if x_fp8 is None or out_dtype is None or not wants_fp8_input(weight, x_fp8[0].shape[0]):
            raise ValueError("quant_linear without x needs x_fp8, out_dtype and a weight that takes FP8 input")
        rows = x_fp8[0].shape[0]
    else:
        out_dtype, rows = x.dtype, x.shape[0]
    gemv = x is not None and ops.use_triton(x) and rows <= ops.MAX_M
    launch = launch if gemv and launch else {}
    if swiglu and not (isinstance(weight, QuantWeight) and gemv and rows <= gemv_rows(weight)):
        return ops.silu_mul(quant_linear(x, weight, x_fp8, out_dtype, launch=launch))
    if isinstance(weight, SplitWeight):
        if not gemv:
            return torch.cat([quant_linear(x, p, x_fp8, out_dtype) for p in weight.parts], dim=-1)
        y = torch.empty(rows, weight.shape[0], dtype=out_dtype, device=x.device) if out is None else out
        col = 0
        for p in weight.parts:  # each GEMV writes its column block: no concatenation
            quant_linear(x, p, out=y[:, col:col + p.shape[0]], launch=launch)
            col += p.shape[0]
        return y
    if isinstance(weight, PlainWeight):
        if gemv:
            return ops.small_m_linear(x, weight.weight, out=out, **launch)
        return torch.nn.functional.linear(x, weight.weight)
    if rows <= gemv_rows(weight):  # W8A16 / W4A16 GEMV (see kernels/quant_linear)
        run = ops.nvfp4_linear if weight.kind == NVFP4 else ops.fp8_linear
        scales = (weight.block_scale, weight.row_scale) if weight.kind == NVFP4 else (weight.row_scale,)
        return run(x, weight.data, *scales, out=out, swiglu=swiglu, **launch)
    if weight.kind == NVFP4:
        return ops.nvfp4_matmul(x, weight.data, weight.block_scale, weight.row_scale)
    xq, xs = x_fp8 if x_fp8 is not None else ops.quant_fp8_per_token(x)
    return ops.fp8_matmul(xq, xs, weight.data, weight.row_scale, out_dtype)


def gemv_rows(weight: QuantWeight) -> int:
    """Rows up to which a QuantWeight's product goes to its kernels/quant_linear linear: NVFP4's GEMV bound, FP8
    W8A8's, any for FP8 W8A16 (fp8_linear takes the rows past its GEMV to cuBLAS on the dequantized weight)."""
    if weight.kind == NVFP4:
        return ops.NVFP4_GEMV_MAX_M
    return ops.FP8_GEMV_MAX_M if weight.act_fp8 else 1 << 62


def wants_fp8_input(weight, rows: int) -> bool:
    """Whether every block of `weight` multiplies `rows` rows of FP8 activations (W8A8 GEMMs past the GEMV's rows),
    so that a producer may quantize them for it."""
    if rows <= ops.FP8_GEMV_MAX_M:
        return False
    if isinstance(weight, SplitWeight):
        return all(wants_fp8_input(p, rows) for p in weight.parts)
    return isinstance(weight, QuantWeight) and weight.act_fp8
