"""Gated RMSNorm on the GDN output (norm before gate, plain weight):
    y = weight * (o * rsqrt(mean(o^2) + eps)).to(dtype);  y = (y * silu(z.float())).to(dtype)
per head over the last dim. Rounding follows transformers' Qwen3_5RMSNormGated: the normalised value is cast to
o.dtype before the weight product, and that product is rounded to the promoted dtype of (o, weight).
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import (
    cast_rtne, cdiv, check, next_pow2, output, pdl_enter, pdl_launch, require_last_dim_contiguous, use_triton)


def _validate(o, z, weight):
    check(o.dim() == 3 and z.shape == o.shape, f"o, z must be equal [N, H, dv], got {tuple(o.shape)}, {tuple(z.shape)}")
    check(weight.shape == (o.shape[-1],), f"weight must be [dv={o.shape[-1]}], got {tuple(weight.shape)}")


def gated_rmsnorm_ref(o, z, weight, eps, out=None):
    _validate(o, z, weight)
    of = o.float()
    normed = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)).to(o.dtype)
    out = output(out, o.shape, o.dtype, o.device)
    out.copy_(weight * normed * F.silu(z.float()))
    return out


@triton.jit
def _gated_rmsnorm_kernel(
    o_ptr, z_ptr, w_ptr, y_ptr,
    R, H, eps,
    so_n, so_h, sz_n, sz_h, sy_n, sy_h,
    D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, ROUND_PRODUCT: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    n = (rows // H).to(tl.int64)
    h = rows % H
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows < R)[:, None] & (offs_d < D)[None, :]
    o = tl.load(o_ptr + (n * so_n + h * so_h)[:, None] + offs_d[None, :], mask=mask, other=0.0)
    of = o.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(of * of, axis=1) / D + eps)
    normed = cast_rtne(of * rstd[:, None], o.dtype).to(tl.float32)
    w = tl.load(w_ptr + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)
    y = normed * w[None, :]
    if ROUND_PRODUCT:  # weight and o share a low-precision dtype: torch rounds their product
        y = cast_rtne(y, o.dtype).to(tl.float32)
    zf = tl.load(z_ptr + (n * sz_n + h * sz_h)[:, None] + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    y = y * (zf * tl.sigmoid(zf))
    tl.store(y_ptr + (n * sy_n + h * sy_h)[:, None] + offs_d[None, :], cast_rtne(y, y_ptr.dtype.element_ty), mask=mask)


def gated_rmsnorm_triton(o, z, weight, eps, out=None, block_rows=None, num_warps=None, pdl=False):
    _validate(o, z, weight)
    pdl_args = pdl_launch(pdl)
    require_last_dim_contiguous("o", o)
    require_last_dim_contiguous("z", z)
    require_last_dim_contiguous("weight", weight)
    N, H, D = o.shape
    y = output(out, o.shape, o.dtype, o.device)
    require_last_dim_contiguous("out", y)
    R = N * H
    if R == 0:
        return y
    BLOCK_D = next_pow2(D)
    BLOCK_R = block_rows or max(1, min(16, 2048 // BLOCK_D))
    product_dtype = torch.promote_types(o.dtype, weight.dtype)
    _gated_rmsnorm_kernel[(cdiv(R, BLOCK_R),)](
        o, z, weight, y, R, H, float(eps),
        o.stride(0), o.stride(1), z.stride(0), z.stride(1), y.stride(0), y.stride(1),
        D=D, BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D, ROUND_PRODUCT=product_dtype != torch.float32, **pdl_args,
        num_warps=num_warps or 4,
    )
    return y


def gated_rmsnorm(o, z, weight, eps, out=None, **launch):
    """y [N, H, dv] in o.dtype (written to `out` if given). `launch`: block_rows, num_warps, pdl (Triton only)."""
    if use_triton(o):
        return gated_rmsnorm_triton(o, z, weight, eps, out, **launch)
    return gated_rmsnorm_ref(o, z, weight, eps, out)
