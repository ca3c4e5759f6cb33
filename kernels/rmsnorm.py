"""Gemma-style RMSNorm (zero-centred weight) with an optional fused residual add, as in Qwen3_5RMSNorm:
    y = (x.float() * rsqrt(mean(x^2) + eps) * (1 + w.float())).to(dtype)
With a residual: x <- (x + residual) rounded to dtype (what the model's bf16 residual stream holds), which is both
returned as the new residual and normalised.
"""
import torch
import triton
import triton.language as tl

from kernels._common import cast_rtne, cdiv, check, next_pow2, output, pdl_enter, pdl_launch, use_triton


def _validate(x, weight, residual):
    check(x.dim() >= 1 and weight.shape == (x.shape[-1],), f"weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    if residual is not None:
        check(residual.shape == x.shape and residual.dtype == x.dtype,
              f"residual must match x ({x.dtype} {tuple(x.shape)}), got {residual.dtype} {tuple(residual.shape)}")


def rmsnorm_ref(x, weight, eps, residual=None, out=None, residual_out=None):
    _validate(x, weight, residual)
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
    xf = x.float()
    y = output(out, x.shape, x.dtype, x.device)
    y.copy_(xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float()))
    if residual is None:
        return y
    new_res = output(residual_out, x.shape, x.dtype, x.device, "residual_out")
    new_res.copy_(x)
    return y, new_res


@triton.jit
def _rmsnorm_kernel(
    x_ptr, r_ptr, w_ptr, y_ptr, nr_ptr,
    R, eps,
    sx, sr, sy, snr,
    D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows < R)[:, None] & (offs_d < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * sx + offs_d[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + rows[:, None] * sr + offs_d[None, :], mask=mask, other=0.0)
        x = cast_rtne(x.to(tl.float32) + r.to(tl.float32), x.dtype)
        tl.store(nr_ptr + rows[:, None] * snr + offs_d[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)
    w = tl.load(w_ptr + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)
    y = xf * rstd[:, None] * (1.0 + w[None, :])
    tl.store(y_ptr + rows[:, None] * sy + offs_d[None, :], cast_rtne(y, y_ptr.dtype.element_ty), mask=mask)


def _rows(name, t):
    """t viewed as [rows, D]; its rows may be strided but D must be contiguous (a view, never a copy)."""
    check(t.stride(-1) == 1, f"{name}: last dimension must be contiguous, got strides {tuple(t.stride())}")
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(f"{name}: leading dims of shape {tuple(t.shape)} / strides {tuple(t.stride())} "
                         "cannot be flattened into one row stride") from None


def rmsnorm_triton(x, weight, eps, residual=None, out=None, residual_out=None, block_rows=None, num_warps=None,
                   pdl=False):
    """residual_out may be `residual` itself (in-place update of the residual stream). pdl: programmatic dependent
    launch (kernels/_common.pdl_enter; GPU only)."""
    _validate(x, weight, residual)
    pdl_args = pdl_launch(pdl)
    D = x.shape[-1]
    x2 = _rows("x", x)
    R = x2.shape[0]
    y = output(out, x.shape, x.dtype, x.device)
    y2 = _rows("out", y)
    has_res = residual is not None
    if has_res:
        r2 = _rows("residual", residual)
        new_res = output(residual_out, x.shape, x.dtype, x.device, "residual_out")
        nr2 = _rows("residual_out", new_res)
    else:
        r2, nr2 = x2, y2
    if R > 0:
        BLOCK_D = next_pow2(D)
        BLOCK_R = block_rows or max(1, min(16, 2048 // BLOCK_D))
        _rmsnorm_kernel[(cdiv(R, BLOCK_R),)](
            x2, r2, weight, y2, nr2, R, float(eps),
            x2.stride(0), r2.stride(0), y2.stride(0), nr2.stride(0),
            D=D, BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D, HAS_RESIDUAL=has_res, **pdl_args,
            num_warps=num_warps or (8 if BLOCK_D >= 2048 else 4),
        )
    return (y, new_res) if has_res else y


def rmsnorm(x, weight, eps, residual=None, out=None, residual_out=None, **launch):
    """y (x.dtype, x.shape) or, with residual, (y, new_residual = x + residual); outputs go to out / residual_out if
    given (residual_out=residual updates the residual in place). `launch`: block_rows, num_warps, pdl (Triton only)."""
    if use_triton(x):
        return rmsnorm_triton(x, weight, eps, residual, out, residual_out, **launch)
    return rmsnorm_ref(x, weight, eps, residual, out, residual_out)
