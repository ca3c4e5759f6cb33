"""Gemma-style RMSNorm (+ fused residual add): Triton (interpreter) vs reference, reference vs transformers."""
import pytest
import torch

from kernels.testing import (  # sets TRITON_INTERPRET first
    assert_close, assert_dispatches_to_triton, poisoned, require_interpreted)
from kernels.rmsnorm import _rmsnorm_kernel, rmsnorm, rmsnorm_ref, rmsnorm_triton

EPS = 1e-6


def make_inputs(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    residual = torch.randn(*shape, generator=gen).to(dtype)
    weight = (torch.randn(shape[-1], generator=gen) * 0.2).to(dtype)
    return x, residual, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 37), (3, 4, 24), (2, 300)])
def test_triton_matches_ref(shape, dtype):
    require_interpreted(_rmsnorm_kernel)
    x, residual, weight = make_inputs(shape, dtype, seed=len(shape))
    y = rmsnorm_triton(x, weight, EPS, out=poisoned(shape, dtype))
    assert_close(y, rmsnorm_ref(x, weight, EPS), dtype)

    y_ref, r_ref = rmsnorm_ref(x, weight, EPS, residual=residual)
    y, r = rmsnorm_triton(x, weight, EPS, residual=residual, out=poisoned(shape, dtype),
                          residual_out=poisoned(shape, dtype))
    assert torch.equal(r, r_ref), "x + residual must round exactly as torch does"
    assert_close(y, y_ref, dtype)


def test_residual_updated_in_place():
    x, residual, weight = make_inputs((6, 40), torch.bfloat16, seed=3)
    expected_res = (x.float() + residual.float()).to(torch.bfloat16)
    y_ref, _ = rmsnorm_ref(x, weight, EPS, residual=residual)
    y, r = rmsnorm_triton(x, weight, EPS, residual=residual, residual_out=residual)
    assert r is residual and torch.equal(residual, expected_res)
    assert_close(y, y_ref)


def test_strided_head_view():
    """q_norm input: the q half of a per-head [q | gate] projection, a strided view of shape [N, H, hd]."""
    gen = torch.Generator().manual_seed(4)
    N, H, hd = 3, 4, 24
    qg = torch.randn(N, H, 2 * hd, generator=gen)
    q = qg[..., :hd]
    weight = torch.randn(hd, generator=gen) * 0.1
    y = rmsnorm_triton(q, weight, EPS)
    assert y.shape == q.shape
    assert_close(y, rmsnorm_ref(q, weight, EPS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ref_matches_transformers(dtype):
    import transformers.models.qwen3_5.modeling_qwen3_5 as hf
    x, residual, weight = make_inputs((4, 3, 48), dtype, seed=5)
    norm = hf.Qwen3_5RMSNorm(48, eps=EPS).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        assert torch.equal(rmsnorm_ref(x, weight, EPS), norm(x))
        y, new_res = rmsnorm_ref(x, weight, EPS, residual=residual)
        h = x + residual  # the decoder layer's residual stream, in the model dtype
        assert torch.equal(new_res, h)
        assert torch.equal(y, norm(h))


def test_dispatch(monkeypatch):
    x, _, weight = make_inputs((2, 8), torch.float32)
    assert_dispatches_to_triton(monkeypatch, "kernels.rmsnorm.rmsnorm_triton", rmsnorm, x, weight, EPS)


def test_bad_inputs_raise_clear_errors():
    x, residual, weight = make_inputs((2, 8), torch.float32)
    with pytest.raises(ValueError, match="weight must be"):
        rmsnorm_triton(x, weight[:4], EPS)
    with pytest.raises(ValueError, match="residual must match"):
        rmsnorm_triton(x, weight, EPS, residual=residual.to(torch.bfloat16))
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        rmsnorm_triton(x.t(), torch.zeros(2), EPS)


def test_pdl_needs_a_gpu():
    """Programmatic dependent launch is PTX (griddepcontrol) the interpreter cannot run: a clear error, not a crash
    (kernels.compile_check compiles every pdl variant for sm_90 instead)."""
    with pytest.raises(ValueError, match="needs a GPU"):
        rmsnorm_triton(torch.zeros(2, 8), torch.zeros(8), 1e-6, pdl=True)
    with pytest.raises(ValueError, match="pdl must be a bool"):
        rmsnorm_triton(torch.zeros(2, 8), torch.zeros(8), 1e-6, pdl=2)
