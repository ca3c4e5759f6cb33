"""Gated RMSNorm on the GDN output: Triton (interpreter) vs reference, reference vs transformers."""
import pytest
import torch

from kernels.testing import (  # sets TRITON_INTERPRET first
    assert_close, assert_dispatches_to_triton, poisoned, require_interpreted)
from kernels.gated_rmsnorm import _gated_rmsnorm_kernel, gated_rmsnorm, gated_rmsnorm_ref, gated_rmsnorm_triton

EPS = 1e-6


def make_inputs(N, H, D, dtype, weight_dtype=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    o = (torch.randn(N, H, D, generator=gen) * 2).to(dtype)
    z = torch.randn(N, H, D, generator=gen).to(dtype)
    weight = (1 + 0.3 * torch.randn(D, generator=gen)).to(weight_dtype or dtype)
    return o, z, weight


@pytest.mark.parametrize("dtype,weight_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                                (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("N,H,D", [(3, 6, 40), (5, 3, 128)])
def test_triton_matches_ref(N, H, D, dtype, weight_dtype):
    require_interpreted(_gated_rmsnorm_kernel)
    o, z, weight = make_inputs(N, H, D, dtype, weight_dtype, seed=D)
    y = gated_rmsnorm_triton(o, z, weight, EPS, out=poisoned(o.shape, dtype))
    assert y.dtype == dtype
    assert_close(y, gated_rmsnorm_ref(o, z, weight, EPS), dtype)


def test_strided_z():
    """z taken from a fused [.. | z] projection output: rows strided, last dim contiguous."""
    gen = torch.Generator().manual_seed(2)
    N, H, D = 4, 3, 24
    fused = torch.randn(N, 2 * H * D, generator=gen)
    o = fused[:, : H * D].reshape(N, H, D)
    z = fused[:, H * D:].view(N, H, D)
    weight = torch.randn(D, generator=gen)
    assert_close(gated_rmsnorm_triton(o, z, weight, EPS), gated_rmsnorm_ref(o, z, weight, EPS))


def test_ref_matches_independent_formula():
    o, z, weight = make_inputs(3, 2, 16, torch.float64, seed=4)
    expected = weight * o / (o.pow(2).mean(-1, keepdim=True) + EPS).sqrt() * z * torch.sigmoid(z)
    got = gated_rmsnorm_ref(o.float(), z.float(), weight.float(), EPS)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,weight_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                                (torch.bfloat16, torch.float32)])
def test_ref_matches_transformers(dtype, weight_dtype):
    import transformers.models.qwen3_5.modeling_qwen3_5 as hf
    o, z, weight = make_inputs(4, 3, 32, dtype, weight_dtype, seed=6)
    norm = hf.Qwen3_5RMSNormGated(32, eps=EPS).to(weight.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        assert torch.equal(gated_rmsnorm_ref(o, z, weight, EPS), norm(o, z))


def test_dispatch(monkeypatch):
    o, z, weight = make_inputs(2, 2, 8, torch.float32)
    assert_dispatches_to_triton(monkeypatch, "kernels.gated_rmsnorm.gated_rmsnorm_triton", gated_rmsnorm,
                                o, z, weight, EPS)


def test_bad_inputs_raise_clear_errors():
    o, z, weight = make_inputs(2, 2, 8, torch.float32)
    with pytest.raises(ValueError, match="o, z must be equal"):
        gated_rmsnorm_triton(o, z[:1], weight, EPS)
    with pytest.raises(ValueError, match="out must be"):
        gated_rmsnorm_triton(o, z, weight, EPS, out=torch.empty(2, 2, 8, dtype=torch.bfloat16))
