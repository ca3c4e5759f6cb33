"""Causal depthwise conv1d: single-token decode update with a per-sequence state pool, plus a whole-chunk reference.

conv_state[slot] [C, K-1] holds the previous K-1 inputs, oldest first. Decode computes
    y = act(sum_k weight[:, k] * window[:, k]),  window = [conv_state[slot], x]
and shifts the window into conv_state in place. A negative state_idx marks a padding row: its state is untouched.
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import (
    cast_rtne, cdiv, check, next_pow2, output, pdl_enter, pdl_launch, require_last_dim_contiguous, use_triton)

ACTIVATIONS = (None, "silu")


def _weight_2d(weight: torch.Tensor) -> torch.Tensor:
    """Accept the checkpoint layout [C, 1, K] as well as [C, K]."""
    if weight.dim() == 3:
        check(weight.shape[1] == 1, f"conv weight must be [C, K] or [C, 1, K], got {tuple(weight.shape)}")
        return weight[:, 0]
    check(weight.dim() == 2, f"conv weight must be [C, K] or [C, 1, K], got {tuple(weight.shape)}")
    return weight


def _activate(y: torch.Tensor, activation) -> torch.Tensor:
    check(activation in ACTIVATIONS, f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return F.silu(y) if activation == "silu" else y


def _validate(x, conv_state, weight, state_idx):
    check(x.dim() == 2, f"x must be [B, C], got {tuple(x.shape)}")
    B, C = x.shape
    K = weight.shape[1]
    check(weight.shape[0] == C and K >= 2, f"weight must be [C={C}, K>=2], got {tuple(weight.shape)}")
    check(conv_state.dim() == 3 and conv_state.shape[1:] == (C, K - 1),
          f"conv_state must be [num_slots, C={C}, K-1={K - 1}], got {tuple(conv_state.shape)}")
    check(state_idx.shape == (B,) and not state_idx.is_floating_point(),
          f"state_idx must be an integer tensor of shape [B={B}], got {state_idx.dtype} {tuple(state_idx.shape)}")


def causal_conv1d_update_ref(x, conv_state, weight, state_idx, activation="silu", out=None):
    weight = _weight_2d(weight)
    _validate(x, conv_state, weight, state_idx)
    live = state_idx >= 0
    rows = state_idx.long().clamp(min=0)
    window = torch.cat([conv_state[rows].float(), x.float()[:, :, None]], dim=-1)  # [B, C, K]
    y = _activate((window * weight.float()).sum(-1), activation)
    conv_state[state_idx[live].long()] = window[live, :, 1:].to(conv_state.dtype)
    out = output(out, x.shape, x.dtype, x.device)
    out.copy_(y)
    return out


def causal_conv1d_prefill_ref(x, weight, initial_state=None, activation="silu"):
    """Whole chunk x [L, C] of one sequence -> (y [L, C], final_state [C, K-1]); initial_state [C, K-1] or None (zeros)."""
    weight = _weight_2d(weight)
    check(x.dim() == 2 and x.shape[1] == weight.shape[0], f"x must be [L, C={weight.shape[0]}], got {tuple(x.shape)}")
    L, C = x.shape
    K = weight.shape[1]
    if initial_state is None:
        initial_state = x.new_zeros(C, K - 1)
    check(initial_state.shape == (C, K - 1), f"initial_state must be [C={C}, K-1={K - 1}], got {tuple(initial_state.shape)}")
    padded = torch.cat([initial_state.float(), x.float().t()], dim=1)  # [C, K-1+L]
    y = F.conv1d(padded[None], weight.float()[:, None, :], groups=C)[0]  # [C, L]
    y = _activate(y, activation)
    final_state = padded[:, L:].to(initial_state.dtype)  # last K-1 inputs, including older state when L < K-1
    return y.t().to(x.dtype), final_state


@triton.jit
def conv_program(idx_ptr, C, BC: tl.constexpr):
    """A conv program's place: its sequence row b, its BC channels and their mask, the row's state slot (0 for a
    padding row) and whether the row is live (state_idx >= 0). Grid (rows, channel blocks)."""
    b = tl.program_id(0)
    offs_c = tl.program_id(1) * BC + tl.arange(0, BC)
    slot = tl.load(idx_ptr + b).to(tl.int64)
    return b, offs_c, offs_c < C, tl.maximum(slot, 0), slot >= 0


@triton.jit
def _conv1d_update_kernel(
    x_ptr, state_ptr, w_ptr, idx_ptr, y_ptr,
    C, sx_b, ss_n, ss_c, sw_c, sy_b,
    K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, SILU: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    b, offs_c, mask_c, slot, live = conv_program(idx_ptr, C, BC)
    offs_k = tl.arange(0, BK)

    x = tl.load(x_ptr + b * sx_b + offs_c, mask=mask_c, other=0.0)
    s_base = state_ptr + slot * ss_n + offs_c[:, None] * ss_c
    hist_mask = mask_c[:, None] & (offs_k[None, :] < K - 1) & live
    window = tl.load(s_base + offs_k[None, :], mask=hist_mask, other=0.0).to(tl.float32)
    window = tl.where(offs_k[None, :] == K - 1, x.to(tl.float32)[:, None], window)
    w = tl.load(w_ptr + offs_c[:, None] * sw_c + offs_k[None, :], mask=mask_c[:, None] & (offs_k[None, :] < K), other=0.0)
    y = tl.sum(window * w.to(tl.float32), axis=1)
    if SILU:
        y = y * tl.sigmoid(y)
    tl.store(y_ptr + b * sy_b + offs_c, cast_rtne(y, y_ptr.dtype.element_ty), mask=mask_c)

    # New state column j = window column j + 1 (re-read from memory: a register tile cannot be shifted cheaply).
    shifted = tl.load(s_base + offs_k[None, :] + 1, mask=mask_c[:, None] & (offs_k[None, :] + 1 < K - 1) & live, other=0.0)
    shifted = tl.where(offs_k[None, :] == K - 2, cast_rtne(x[:, None].to(tl.float32), state_ptr.dtype.element_ty), shifted)
    tl.store(s_base + offs_k[None, :], shifted, mask=hist_mask)


def causal_conv1d_update_triton(x, conv_state, weight, state_idx, activation="silu", out=None, block_c=None,
                                num_warps=None, pdl=False):
    weight = _weight_2d(weight)
    pdl_args = pdl_launch(pdl)
    _validate(x, conv_state, weight, state_idx)
    check(activation in ACTIVATIONS, f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    require_last_dim_contiguous("x", x)
    require_last_dim_contiguous("conv_state", conv_state)
    require_last_dim_contiguous("weight", weight)
    B, C = x.shape
    K = weight.shape[1]
    y = output(out, x.shape, x.dtype, x.device)
    require_last_dim_contiguous("out", y)
    BC = block_c or min(next_pow2(C), 256 if B <= 16 else 1024)
    grid = (B, cdiv(C, BC))
    _conv1d_update_kernel[grid](
        x, conv_state, weight, state_idx, y,
        C, x.stride(0), conv_state.stride(0), conv_state.stride(1), weight.stride(0), y.stride(0),
        K=K, BK=next_pow2(K), BC=BC, SILU=activation == "silu", **pdl_args,
        num_warps=num_warps or 4,
    )
    return y


def causal_conv1d_update(x, conv_state, weight, state_idx, activation="silu", out=None, **launch):
    """y [B, C] (x.dtype, written to `out` if given); shifts x into conv_state rows state_idx in place.
    `launch`: block_c, num_warps, pdl (Triton only)."""
    if use_triton(x):
        return causal_conv1d_update_triton(x, conv_state, weight, state_idx, activation, out, **launch)
    return causal_conv1d_update_ref(x, conv_state, weight, state_idx, activation, out)
