"""Weight quantizers writing compressed-tensors' tensors (engine/quant_config.py has the layout), round-to-nearest.

FP8 per channel:  scale = amax(|w_row|) / 448;  weight = e4m3(w / scale);  weight_scale = scale [N, 1].
NVFP4 (the reference recipe of vLLM/SGLang/ModelOpt and compressed-tensors):
    global_scale = 448 * 6 / amax(|w|)                           (fp32, `weight_global_scale`)
    block_scale  = e4m3(global_scale * amax(|w_block|) / 6)      (one per 16 along K, `weight_scale`)
    q            = e2m1(clamp(w * global_scale / block_scale, -6, 6))  (nearest, ties to even; `weight_packed`)
    w ~ q * block_scale / global_scale.
`amax` may be given (a calibrated or searched clipping value) instead of the tensor's own.
"""
from __future__ import annotations

import torch

from engine import ops

FP8 = torch.float8_e4m3fn
FP8_MAX, E2M1_MAX, GROUP = 448.0, 6.0, 16
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_MIDS = (_E2M1[1:] + _E2M1[:-1]) / 2


def round_e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """fp32 values (already within [-6, 6]) -> 4-bit E2M1 codes (uint8), nearest with ties to the even code; byte for
    byte what compressed-tensors' packer writes (tests/test_quant_format.py checks it where it is installed)."""
    a = v.abs().float()
    mids = _MIDS.to(v.device)
    lo = torch.searchsorted(mids, a.contiguous(), right=False)  # at a tie: the lower neighbour
    hi = torch.searchsorted(mids, a.contiguous(), right=True)  # at a tie: the upper one
    idx = torch.where((lo != hi) & (lo % 2 == 1), hi, lo)  # a tie goes to the code with mantissa bit 0
    return (idx | (v < 0).long() << 3).to(torch.uint8)  # a negative value rounded to 0 keeps its sign, as -0


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] codes -> [N, K/2] bytes, element 2i in the low nibble."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (weight fp8 [N, K], weight_scale fp32 [N, 1])."""
    wf = w.float()
    scale = wf.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (wf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def quantize_nvfp4(w: torch.Tensor, amax: float | torch.Tensor | None = None):
    """[N, K] (K % 16 == 0) -> (weight_packed uint8 [N, K/2], weight_scale fp8 [N, K/16], weight_global_scale
    fp32 [1])."""
    N, K = w.shape
    if K % GROUP:
        raise ValueError(f"NVFP4 needs K divisible by {GROUP}, got {K}")
    wf = w.float()
    amax = torch.as_tensor(wf.abs().amax() if amax is None else amax, dtype=torch.float32).clamp(min=1e-12)
    gs = (FP8_MAX * E2M1_MAX / amax).reshape(1)
    blocks = wf.view(N, K // GROUP, GROUP)
    bs = (gs * blocks.abs().amax(dim=2) / E2M1_MAX).clamp(max=FP8_MAX).to(FP8)
    step = bs.float() / gs  # the dequantized size of one E2M1 unit in each block
    scaled = torch.where(step[..., None] > 0, blocks / step[..., None].clamp(min=1e-30), torch.zeros_like(blocks))
    codes = round_e2m1_codes(scaled.clamp(-E2M1_MAX, E2M1_MAX)).view(N, K)
    return pack_e2m1(codes), bs, gs


def dequantize(tensors: dict[str, torch.Tensor], kind: str) -> torch.Tensor:
    """A module's stored tensors (local names: weight/weight_scale or weight_packed/weight_scale/weight_global_scale)
    -> its fp32 weight [N, K]."""
    if kind == "fp8":
        w = tensors["weight"]
        return ops.dequant_fp8_ref(w, tensors["weight_scale"].float().reshape(-1).expand(w.shape[0]))
    packed = tensors["weight_packed"]
    row = (1.0 / tensors["weight_global_scale"].float()).reshape(1).expand(packed.shape[0])
    return ops.dequant_nvfp4_ref(packed, tensors["weight_scale"], row)
