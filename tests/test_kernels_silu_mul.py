"""SwiGLU activation on a fused gate_up tensor: Triton (interpreter) vs reference vs the unfused MLP form."""
import pytest
import torch
import torch.nn.functional as F

from kernels.testing import (  # sets TRITON_INTERPRET first
    assert_close, assert_dispatches_to_triton, poisoned, require_interpreted)
from kernels.silu_mul import _silu_mul_kernel, silu_mul, silu_mul_ref, silu_mul_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,I,block", [(3, 37, None), (2, 300, 128)])
def test_triton_matches_ref(N, I, block, dtype):
    require_interpreted(_silu_mul_kernel)
    gate_up = (torch.randn(N, 2 * I, generator=torch.Generator().manual_seed(I)) * 3).to(dtype)
    y = silu_mul_triton(gate_up, out=poisoned((N, I), dtype), block=block)
    assert_close(y, silu_mul_ref(gate_up), dtype)


def test_ref_matches_unfused_mlp():
    gen = torch.Generator().manual_seed(1)
    x, w_gate, w_up = torch.randn(4, 16, generator=gen), torch.randn(24, 16, generator=gen), torch.randn(24, 16, generator=gen)
    expected = F.silu(x @ w_gate.t()) * (x @ w_up.t())
    gate_up = x @ torch.cat([w_gate, w_up]).t()
    torch.testing.assert_close(silu_mul_ref(gate_up), expected, rtol=1e-5, atol=1e-5)


def test_dispatch_and_errors(monkeypatch):
    with pytest.raises(ValueError, match="gate_up must be"):
        silu_mul_triton(torch.zeros(2, 7))
    assert_dispatches_to_triton(monkeypatch, "kernels.silu_mul.silu_mul_triton", silu_mul, torch.zeros(2, 8))
