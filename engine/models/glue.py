"""The small element-wise steps between the big ops (q/k norm + rotary + gate split, output gate, GDN decay and
write strength), as plain torch functions. On CUDA the model runner swaps in torch.compile'd versions so each
becomes one or two fused kernels instead of a dozen launches per layer; on CPU they run eagerly (same math).
"""
from __future__ import annotations

import torch

from engine.rope import apply_rotary
from engine.ops import gates_from_raw


def rms_norm_zero_centred(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(x.dtype)


def attention_inputs(qkv, q_norm_w, k_norm_w, cos, sin, eps: float, nh: int, nkv: int, hd: int):
    """Fused projection [N, nh*2*hd + 2*nkv*hd] (per head [q_h | gate_h], then k, v) ->
    q [N, nh, hd] and k [N, nkv, hd] (RMSNormed per head, then rotated), v [N, nkv, hd], gate [N, nh*hd]."""
    N = qkv.shape[0]
    qg, k, v = qkv.split([nh * 2 * hd, nkv * hd, nkv * hd], dim=-1)
    qg = qg.view(N, nh, 2 * hd)
    q = apply_rotary(rms_norm_zero_centred(qg[..., :hd], q_norm_w, eps), cos, sin)
    k = apply_rotary(rms_norm_zero_centred(k.reshape(N, nkv, hd), k_norm_w, eps), cos, sin)
    return q.contiguous(), k.contiguous(), v.reshape(N, nkv, hd).contiguous(), qg[..., hd:].reshape(N, nh * hd)


def gated_output(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return o.reshape(gate.shape) * torch.sigmoid(gate)


def gdn_gates(ba: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """[b | a] projections -> (g = -exp(A_log) * softplus(a + dt_bias) in fp32 (log decay), beta = sigmoid(b))."""
    b, a = ba.chunk(2, dim=-1)
    return gates_from_raw(a, b, A_log, dt_bias)


class Glue:
    """The glue functions, eager or compiled (dynamic shapes: one compilation serves every batch size)."""

    NAMES = ("attention_inputs", "gated_output", "gdn_gates")

    def __init__(self, compiled: bool = False, backend: str = "inductor"):
        self.compiled = compiled
        for name in self.NAMES:
            fn = globals()[name]
            setattr(self, name, torch.compile(fn, dynamic=True, fullgraph=True, backend=backend) if compiled else fn)
