"""Causal depthwise conv1d decode update: Triton (interpreter) vs reference; references vs independent forms."""
import pytest
import torch
import torch.nn.functional as F

from kernels.testing import (  # sets TRITON_INTERPRET first
    assert_close, assert_dispatches_to_triton, poisoned, require_interpreted)
from kernels.conv1d_update import (_conv1d_update_kernel, causal_conv1d_prefill_ref, causal_conv1d_update,
                                   causal_conv1d_update_ref, causal_conv1d_update_triton)

STATE_IDX = [2, -1, 0, 4]  # the second row is CUDA-graph padding
NUM_SLOTS = 6


def make_inputs(B=4, C=37, K=4, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, C, generator=gen).to(dtype)
    conv_state = torch.randn(NUM_SLOTS, C, K - 1, generator=gen).to(dtype)
    weight = (torch.randn(C, K, generator=gen) * 0.5).to(dtype)
    return x, conv_state, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.parametrize("activation", ["silu", None])
def test_triton_matches_ref(dtype, K, activation):
    require_interpreted(_conv1d_update_kernel)
    x, conv_state, weight = make_inputs(K=K, dtype=dtype, seed=K)
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    s_ref, s_tri = conv_state.clone(), conv_state.clone()
    y_ref = causal_conv1d_update_ref(x, s_ref, weight, idx, activation)
    y_tri = causal_conv1d_update_triton(x, s_tri, weight, idx, activation, out=poisoned(x.shape, dtype), block_c=16)
    live = [0, 2, 3]
    assert_close(y_tri[live], y_ref[live], dtype)
    assert torch.equal(s_tri, s_ref), "conv state must be shifted exactly (it is a copy, no arithmetic)"
    untouched = [s for s in range(NUM_SLOTS) if s not in STATE_IDX]
    assert torch.equal(s_tri[untouched], conv_state[untouched]), "state rows not in state_idx were modified"
    assert torch.equal(s_tri[2], torch.cat([conv_state[2, :, 1:], x[0, :, None]], dim=1))


def test_default_block_and_checkpoint_weight_layout():
    x, conv_state, weight = make_inputs(B=2, C=300)
    idx = torch.tensor([5, 1], dtype=torch.int64)
    s_ref, s_tri = conv_state.clone(), conv_state.clone()
    y_ref = causal_conv1d_update_ref(x, s_ref, weight, idx)
    y_tri = causal_conv1d_update_triton(x, s_tri, weight[:, None, :], idx, out=poisoned(x.shape, x.dtype))
    assert_close(y_tri, y_ref)
    assert torch.equal(s_tri, s_ref)


def test_ref_matches_transformers_update():
    """transformers keeps K columns of state; its last K-1 columns are our state."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as hf
    x, conv_state, weight = make_inputs(B=3, C=21)
    idx = torch.tensor([0, 1, 2])
    hf_state = torch.cat([torch.randn(3, 21, 1), conv_state[:3]], dim=-1)
    y_hf = hf.causal_conv1d_update(x[:, :, None], hf_state, weight, None, "silu")[:, :, 0]
    s_ref = conv_state.clone()
    y_ref = causal_conv1d_update_ref(x, s_ref, weight, idx)
    torch.testing.assert_close(y_ref, y_hf, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s_ref[:3], hf_state[:, :, 1:])


def naive_prefill(x, weight, initial_state):
    """Independent form: y[t, c] = sum_j w[c, j] * u[t + j, c] with u = [initial_state^T; x]."""
    L, C = x.shape
    K = weight.shape[1]
    u = torch.cat([initial_state.t(), x], dim=0).double()
    y = torch.zeros(L, C, dtype=torch.float64)
    for t in range(L):
        for j in range(K):
            y[t] += weight[:, j].double() * u[t + j]
    return F.silu(y), u[L:].t()


@pytest.mark.parametrize("L", [1, 2, 9])
def test_prefill_ref_matches_naive_and_decode_steps(L):
    C, K = 13, 4
    gen = torch.Generator().manual_seed(L)
    x = torch.randn(L, C, generator=gen)
    weight = torch.randn(C, K, generator=gen)
    init = torch.randn(C, K - 1, generator=gen)
    y, final = causal_conv1d_prefill_ref(x, weight, init)
    y_naive, final_naive = naive_prefill(x, weight, init)
    torch.testing.assert_close(y.double(), y_naive, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final.double(), final_naive)
    # Decoding the same tokens one at a time from the same state gives the same outputs and final state.
    pool = init[None].clone()
    idx = torch.tensor([0], dtype=torch.int32)
    steps = [causal_conv1d_update_triton(x[t:t + 1], pool, weight, idx) for t in range(L)]
    assert_close(torch.cat(steps), y)
    assert torch.equal(pool[0], final)


def test_prefill_ref_zero_initial_state_is_plain_causal_conv():
    gen = torch.Generator().manual_seed(1)
    x, weight = torch.randn(6, 5, generator=gen), torch.randn(5, 3, generator=gen)
    y, _ = causal_conv1d_prefill_ref(x, weight, None, activation=None)
    expected = F.conv1d(x.t()[None], weight[:, None], padding=2, groups=5)[0, :, :6].t()
    torch.testing.assert_close(y, expected)


def test_dispatch(monkeypatch):
    x, conv_state, weight = make_inputs()
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    assert_dispatches_to_triton(monkeypatch, "kernels.conv1d_update.causal_conv1d_update_triton", causal_conv1d_update,
                                x, conv_state, weight, idx)


def test_bad_inputs_raise_clear_errors():
    x, conv_state, weight = make_inputs()
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    with pytest.raises(ValueError, match="conv_state must be"):
        causal_conv1d_update_triton(x, conv_state[:, :, :2], weight, idx)
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_update_ref(x, conv_state, weight, idx, activation="gelu")
