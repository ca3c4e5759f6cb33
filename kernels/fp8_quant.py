"""Dynamic per-token FP8 (E4M3) activation quantization, alone or fused into the op that produces the activation.

For a row h (the activation as the unfused path would store it, i.e. rounded to the model dtype):
    scale = max(amax(|h|), 1e-12) / 448 (fp32),  q = float8_e4m3fn(clamp(h / scale, -448, 448))  (round to nearest even)
so q * scale ~ h. The producers fused here:
  * quant_fp8_per_token(x): h = x;
  * rmsnorm_quant_fp8(x, w, eps, residual): h = RMSNorm(x) (zero-centred weight, kernels/rmsnorm), with the residual
    add first when given (x + residual, rounded to the dtype, is also returned as the new residual), the input of the
    projections after each decoder norm (the engine uses it before an FP8 W8A8 MLP gate_up);
  * silu_mul_quant_fp8(gate_up): h = silu(gate) * up (kernels/silu_mul), the input of down_proj.
Each program handles one row whole (the amax needs all of it before any element is written): BLOCK = next_pow2(D).
Returns (q [R, D] float8_e4m3fn, scale [R] fp32), what kernels/quant_linear.fp8_linear takes as (x, x_scale).

The kernel rounds to the E4M3 grid itself (round_to_e4m3) before the cast, which then is exact: the Triton CPU
interpreter's fp32 -> fp8 cast drops the carry of a mantissa that rounds up into the next binade (127.8 -> 64
instead of 128; ~2 % of random values), while GPUs round correctly either way.
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import cast_rtne, check, next_pow2, require_last_dim_contiguous, use_triton
from kernels.quant_linear import FP8, FP8_MAX

PLAIN, RMSNORM, SILU_MUL = 0, 1, 2
MIN_AMAX = 1e-12


def quantize_rows_ref(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h [R, D] -> (q fp8 [R, D], scale fp32 [R]) as described in the module docstring."""
    hf = h.float()
    scale = hf.abs().amax(dim=-1).clamp(min=MIN_AMAX) / FP8_MAX
    q = (hf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def quant_fp8_per_token_ref(x):
    check(x.dim() == 2, f"x must be [R, D], got {tuple(x.shape)}")
    return quantize_rows_ref(x)


def rmsnorm_quant_fp8_ref(x, weight, eps, residual=None):
    from kernels.rmsnorm import rmsnorm_ref

    check(x.dim() == 2, f"x must be [R, D], got {tuple(x.shape)}")
    if residual is None:
        return quantize_rows_ref(rmsnorm_ref(x, weight, eps))
    h, new_residual = rmsnorm_ref(x, weight, eps, residual)
    return (*quantize_rows_ref(h), new_residual)


def silu_mul_quant_fp8_ref(gate_up):
    check(gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0, f"gate_up must be [R, 2*I], got {tuple(gate_up.shape)}")
    gate, up = gate_up.float().chunk(2, dim=-1)
    return quantize_rows_ref((F.silu(gate) * up).to(gate_up.dtype))


@triton.jit
def round_to_e4m3(v):
    """fp32 -> the nearest E4M3 value (ties to even), still fp32 (|v| <= 448 assumed). Normal range: drop 20 of the
    23 mantissa bits with round-to-nearest-even on the bits (a carry moves into the exponent as it should);
    below 2^-6 (E4M3 subnormals, spaced 2^-9): add and subtract 1.5 * 2^14, whose fp32 ulp is 2^-9."""
    bits = v.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    sub = (v + 24576.0) - 24576.0
    return tl.where(tl.abs(v) < 0.015625, sub, normal)


@triton.jit
def _quant_rows_kernel(x_ptr, w_ptr, r_ptr, nr_ptr, q_ptr, s_ptr, D, sx, sr, snr, sq, eps, BLOCK: tl.constexpr,
                       PRODUCER: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    dtype = x_ptr.dtype.element_ty
    if PRODUCER == 2:  # silu(gate) * up of a [gate | up] row, rounded to the dtype as kernels/silu_mul stores it
        gate = tl.load(x_ptr + row * sx + offs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * sx + D + offs, mask=mask, other=0.0).to(tl.float32)
        h = cast_rtne(gate * tl.sigmoid(gate) * up, dtype).to(tl.float32)
    else:
        h = tl.load(x_ptr + row * sx + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:  # the residual stream holds x + residual rounded to the dtype (kernels/rmsnorm)
            h = cast_rtne(h + tl.load(r_ptr + row * sr + offs, mask=mask, other=0.0).to(tl.float32), dtype)
            tl.store(nr_ptr + row * snr + offs, h, mask=mask)
            h = h.to(tl.float32)
        if PRODUCER == 1:  # zero-centred RMSNorm, rounded to the dtype as kernels/rmsnorm stores it
            rstd = tl.rsqrt(tl.sum(h * h, axis=0) / D + eps)
            w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            h = cast_rtne(h * rstd * (1.0 + w), dtype).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(h), axis=0), 1e-12) / 448.0
    q = tl.minimum(tl.maximum(tl.div_rn(h, scale), -448.0), 448.0)
    tl.store(q_ptr + row * sq + offs, round_to_e4m3(q).to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row, scale)


def _launch(x, weight, eps, producer, residual=None, num_warps=None):
    check(x.dim() == 2, f"input must be [R, D], got {tuple(x.shape)}")
    require_last_dim_contiguous("x", x)
    if residual is not None:
        check(residual.shape == x.shape and residual.dtype == x.dtype,
              f"residual must match x ({x.dtype} {tuple(x.shape)}), got {residual.dtype} {tuple(residual.shape)}")
        require_last_dim_contiguous("residual", residual)
    new_res = torch.empty_like(x) if residual is not None else None
    R = x.shape[0]
    D = x.shape[1] // 2 if producer == SILU_MUL else x.shape[1]
    q = torch.empty(R, D, dtype=FP8, device=x.device)
    s = torch.empty(R, dtype=torch.float32, device=x.device)
    if R == 0 or D == 0:
        return (q, s.fill_(MIN_AMAX / FP8_MAX)) + ((new_res,) if residual is not None else ())
    BLOCK = next_pow2(D)
    r = residual if residual is not None else x
    nr = new_res if residual is not None else x
    _quant_rows_kernel[(R,)](x, weight if weight is not None else x, r, nr, q, s, D, x.stride(0), r.stride(0),
                             nr.stride(0), q.stride(0), float(eps), BLOCK=BLOCK, PRODUCER=producer,
                             HAS_RESIDUAL=residual is not None, num_warps=num_warps or (8 if BLOCK >= 4096 else 4))
    return (q, s, new_res) if residual is not None else (q, s)


def quant_fp8_per_token_triton(x, **launch):
    return _launch(x, None, 0.0, PLAIN, **launch)


def rmsnorm_quant_fp8_triton(x, weight, eps, residual=None, **launch):
    check(weight.shape == (x.shape[-1],), f"weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    return _launch(x, weight, eps, RMSNORM, residual, **launch)


def silu_mul_quant_fp8_triton(gate_up, **launch):
    check(gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0, f"gate_up must be [R, 2*I], got {tuple(gate_up.shape)}")
    return _launch(gate_up, None, 0.0, SILU_MUL, **launch)


def quant_fp8_per_token(x, **launch):
    """x [R, D] -> (q fp8 [R, D], scale fp32 [R]); Triton on CUDA, the reference elsewhere."""
    return quant_fp8_per_token_triton(x, **launch) if use_triton(x) else quant_fp8_per_token_ref(x)


def rmsnorm_quant_fp8(x, weight, eps, residual=None, **launch):
    """RMSNorm(x) quantized per token: (q fp8 [R, D], scale fp32 [R]); with a residual, RMSNorm(x + residual) and
    the new residual: (q, scale, x + residual)."""
    if use_triton(x):
        return rmsnorm_quant_fp8_triton(x, weight, eps, residual, **launch)
    return rmsnorm_quant_fp8_ref(x, weight, eps, residual)


def silu_mul_quant_fp8(gate_up, **launch):
    """silu(gate) * up quantized per token: (q fp8 [R, I], scale fp32 [R])."""
    return silu_mul_quant_fp8_triton(gate_up, **launch) if use_triton(gate_up) else silu_mul_quant_fp8_ref(gate_up)
