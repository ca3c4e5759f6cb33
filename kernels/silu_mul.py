"""SwiGLU activation on a fused gate_up projection: y = silu(gate) * up, gate_up = [gate | up] along the last dim.
Math in fp32, one rounding to the input dtype."""
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import cast_rtne, cdiv, check, next_pow2, output, require_last_dim_contiguous, use_triton


def _validate(gate_up):
    check(gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0, f"gate_up must be [N, 2*I], got {tuple(gate_up.shape)}")


def silu_mul_ref(gate_up, out=None):
    _validate(gate_up)
    gate, up = gate_up.float().chunk(2, dim=-1)
    out = output(out, (gate_up.shape[0], gate_up.shape[1] // 2), gate_up.dtype, gate_up.device)
    out.copy_(F.silu(gate) * up)
    return out


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, I, sx, sy, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    gate = tl.load(x_ptr + n * sx + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + n * sx + I + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + n * sy + offs, cast_rtne(gate * tl.sigmoid(gate) * up, y_ptr.dtype.element_ty), mask=mask)


def silu_mul_triton(gate_up, out=None, block=None, num_warps=None):
    _validate(gate_up)
    require_last_dim_contiguous("gate_up", gate_up)
    N, I = gate_up.shape[0], gate_up.shape[1] // 2
    y = output(out, (N, I), gate_up.dtype, gate_up.device)
    require_last_dim_contiguous("out", y)
    if N == 0:
        return y
    BLOCK = block or min(next_pow2(I), 1024)
    _silu_mul_kernel[(N, cdiv(I, BLOCK))](gate_up, y, I, gate_up.stride(0), y.stride(0), BLOCK=BLOCK,
                                          num_warps=num_warps or 4)
    return y


def silu_mul(gate_up, out=None, **launch):
    """y [N, I] in gate_up.dtype (written to `out` if given). `launch`: block, num_warps (Triton only)."""
    if use_triton(gate_up):
        return silu_mul_triton(gate_up, out, **launch)
    return silu_mul_ref(gate_up, out)
