"""Fused decode attention inputs (q/k RMSNorm + partial rotary + KV-cache store): Triton (interpreter) vs reference,
reference vs the engine's unfused ops (glue.attention_inputs + store_kvcache_ref)."""
import pytest
import torch

from kernels.testing import assert_close, poisoned, require_interpreted  # sets TRITON_INTERPRET first
from kernels.fused_attn_decode import (_fused_attn_inputs_kernel, fused_attn_decode_inputs,
                                       fused_attn_decode_inputs_ref, fused_attn_decode_inputs_triton)
from kernels.paged_attention import dequantize_kv_ref, store_kvcache_ref
from kernels.quant_linear import FP8

EPS = 1e-6


def make_inputs(N, nh, nkv, hd, rd, dtype, num_blocks=7, block_size=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(N, (2 * nh + 2 * nkv) * hd, generator=gen) * 1.5).to(dtype)
    qw = (0.2 * torch.randn(hd, generator=gen)).to(dtype)
    kw = (0.2 * torch.randn(hd, generator=gen)).to(dtype)
    ang = torch.randn(N, rd // 2, generator=gen) * 3
    cos, sin = torch.cat([ang, ang], -1).cos().to(dtype), torch.cat([ang, ang], -1).sin().to(dtype)
    k_cache = torch.randn(num_blocks, block_size, nkv, hd, generator=gen).to(dtype)
    # distinct slots, with padding rows (-1) in between
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:N]
    slots[1::3] = -1
    return qkv, qw, kw, cos, sin, k_cache, k_cache.clone() * 0.5, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,nh,nkv,hd,rd", [(5, 3, 1, 24, 12), (4, 6, 2, 20, 20), (1, 2, 2, 40, 8)])
def test_triton_matches_ref(N, nh, nkv, hd, rd, dtype):
    require_interpreted(_fused_attn_inputs_kernel)
    qkv, qw, kw, cos, sin, kc, vc, slots = make_inputs(N, nh, nkv, hd, rd, dtype, seed=hd + N)
    kc_t, vc_t = kc.clone(), vc.clone()
    want = fused_attn_decode_inputs_ref(qkv, qw, kw, cos, sin, EPS, nh, nkv, hd, kc, vc, slots)
    got = fused_attn_decode_inputs_triton(qkv, qw, kw, cos, sin, EPS, nh, nkv, hd, kc_t, vc_t, slots,
                                          out=poisoned((N, nh, hd), dtype))
    assert got.dtype == dtype
    assert_close(got, want, dtype)
    assert_close(kc_t, kc, dtype)
    assert torch.equal(vc_t, vc)


def test_padding_rows_store_nothing():
    qkv, qw, kw, cos, sin, kc, vc, _ = make_inputs(3, 2, 1, 16, 8, torch.float32, seed=3)
    slots = torch.full((3,), -1, dtype=torch.int64)
    kc0, vc0 = kc.clone(), vc.clone()
    fused_attn_decode_inputs_triton(qkv, qw, kw, cos, sin, EPS, 2, 1, 16, kc, vc, slots)
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)


def test_ref_matches_engine_unfused_ops():
    """What the default decode path does: glue.attention_inputs (q/k norm + rotary) then store_kvcache."""
    from engine.models.glue import attention_inputs

    N, nh, nkv, hd, rd = 6, 4, 2, 24, 8
    qkv, qw, kw, cos, sin, kc, vc, slots = make_inputs(N, nh, nkv, hd, rd, torch.float32, seed=9)
    kc2, vc2 = kc.clone(), vc.clone()
    q, k, v, _ = attention_inputs(qkv, qw, kw, cos, sin, EPS, nh, nkv, hd)
    store_kvcache_ref(k, v, kc2, vc2, slots)
    got = fused_attn_decode_inputs_ref(qkv, qw, kw, cos, sin, EPS, nh, nkv, hd, kc, vc, slots)
    torch.testing.assert_close(got, q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kc, kc2, rtol=1e-6, atol=1e-6)
    assert torch.equal(vc, vc2)


def test_dispatch_and_bad_input(monkeypatch):
    qkv, qw, kw, cos, sin, kc, vc, slots = make_inputs(2, 2, 1, 16, 8, torch.float32, seed=1)
    monkeypatch.delenv("OCRIA_FORCE_TRITON", raising=False)
    want = fused_attn_decode_inputs(qkv, qw, kw, cos, sin, EPS, 2, 1, 16, kc.clone(), vc.clone(), slots)
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    assert_close(fused_attn_decode_inputs(qkv, qw, kw, cos, sin, EPS, 2, 1, 16, kc.clone(), vc.clone(), slots), want)
    with pytest.raises(ValueError, match="qkv must be"):
        fused_attn_decode_inputs(qkv[:, 1:], qw, kw, cos, sin, EPS, 2, 1, 16, kc, vc, slots)
    with pytest.raises(ValueError, match="cos, sin"):
        fused_attn_decode_inputs(qkv, qw, kw, cos[:, :3], sin[:, :3], EPS, 2, 1, 16, kc, vc, slots)


def test_fp8_cache_rows_and_scales():
    """An FP8 cache: each stored (token, kv head) row and its scale as store_kvcache_ref's quantization of the same
    k / v (v bit for bit; k within one E4M3 step of rounding, since k is computed in a different order), padding
    rows storing nothing."""
    require_interpreted(_fused_attn_inputs_kernel)
    N, nh, nkv, hd, rd = 5, 4, 2, 24, 12
    qkv, qw, kw, cos, sin, kc, _, slots = make_inputs(N, nh, nkv, hd, rd, torch.bfloat16, seed=8)
    caches = {}
    for name, fn in (("ref", fused_attn_decode_inputs_ref), ("tri", fused_attn_decode_inputs_triton)):
        c = [torch.zeros(kc.shape, dtype=FP8) for _ in range(2)]
        s = tuple(torch.full(kc.shape[:3], -1.0) for _ in range(2))
        q = fn(qkv, qw, kw, cos, sin, EPS, nh, nkv, hd, *c, slots, scales=s)
        caches[name] = (q, c, s)
    (q_r, c_r, s_r), (q_t, c_t, s_t) = caches["ref"], caches["tri"]
    assert_close(q_t, q_r, torch.bfloat16)
    assert torch.equal(c_t[1].view(torch.uint8), c_r[1].view(torch.uint8)) and torch.equal(s_t[1], s_r[1])
    deq = [dequantize_kv_ref(c[0], s[0], torch.float32) for c, s in ((c_r, s_r), (c_t, s_t))]
    assert_close(deq[1], deq[0], torch.bfloat16, atol=0.07, rtol=0.07)
    assert (s_t[0] == -1).sum() == (s_r[0] == -1).sum() == kc.shape[0] * kc.shape[1] * nkv - int((slots >= 0).sum()) * nkv
