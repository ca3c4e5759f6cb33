"""Gated delta rule recurrent kernel: Triton (interpreter) vs reference, reference vs independent formulations."""
import pytest
import torch

from kernels.testing import (  # sets TRITON_INTERPRET first
    assert_close, assert_dispatches_to_triton, poisoned, require_interpreted)
from kernels.gdn_recurrent import _gdn_recurrent_kernel, gdn_recurrent, gdn_recurrent_ref, gdn_recurrent_triton

NUM_SLOTS = 5
STATE_IDX = [3, -1, 0]  # the middle row is CUDA-graph padding


def make_inputs(B=3, T=1, Hk=2, Hv=6, dk=24, dv=40, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q = rnd(B, T, Hk, dk).to(dtype)
    k = rnd(B, T, Hk, dk).to(dtype)
    v = rnd(B, T, Hv, dv).to(dtype)
    g = -torch.rand(B, T, Hv, generator=gen) * 2.0  # log-decay <= 0
    beta = torch.rand(B, T, Hv, generator=gen).to(dtype)
    state = rnd(NUM_SLOTS, Hv, dk, dv) * 0.5
    return q, k, v, g, beta, state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("launch", [{}, dict(block_v=16), dict(block_v=8, num_warps=2)])
def test_triton_matches_ref(T, dtype, launch):
    """The default launch (32-wide tiles wider than dv = 40 leave a part-empty tile) and narrower tiles."""
    require_interpreted(_gdn_recurrent_kernel)
    q, k, v, g, beta, state = make_inputs(T=T, dtype=dtype, seed=T)
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    s_ref, s_tri = state.clone(), state.clone()

    o_ref = gdn_recurrent_ref(q, k, v, g, beta, s_ref, idx)
    o_tri = gdn_recurrent_triton(q, k, v, g, beta, s_tri, idx, out=poisoned(v.shape, dtype), **launch)

    assert o_tri.dtype == dtype
    assert_close(o_tri, o_ref, dtype)
    assert torch.equal(o_tri[1], torch.zeros_like(o_tri[1])), "padding row output must be zero"
    assert_close(s_tri, s_ref, torch.float32)
    untouched = [s for s in range(NUM_SLOTS) if s not in STATE_IDX]
    assert torch.equal(s_tri[untouched], state[untouched]), "state rows not in state_idx were modified"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_gates_match_glue(dtype):
    """raw_gates=(A_log, dt_bias): the kernel computes g and beta from the raw a, b projections (strided views of
    one [B, 2*Hv] tensor, as the engine passes them), like the model's glue does before the plain kernel."""
    from engine.models.glue import gdn_gates

    require_interpreted(_gdn_recurrent_kernel)
    B, T, Hv = 3, 1, 6
    q, k, v, _, _, state = make_inputs(B=B, T=T, dtype=dtype, seed=21)
    gen = torch.Generator().manual_seed(5)
    ba = (torch.randn(B, 2 * Hv, generator=gen) * 4).to(dtype)
    ba[0, Hv] = 30.0  # a past softplus's linear threshold
    A_log, dt_bias = torch.randn(Hv, generator=gen), torch.randn(Hv, generator=gen)
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    g, beta = gdn_gates(ba, A_log, dt_bias)
    s_ref, s_tri = state.clone(), state.clone()
    o_ref = gdn_recurrent_ref(q, k, v, g[:, None], beta[:, None], s_ref, idx)
    o_tri = gdn_recurrent_triton(q, k, v, ba[:, None, Hv:], ba[:, None, :Hv], s_tri, idx, raw_gates=(A_log, dt_bias),
                                 out=poisoned(v.shape, dtype))
    assert_close(o_tri, o_ref, dtype)
    assert_close(s_tri, s_ref, torch.float32, rtol=1e-4, atol=1e-4)
    o_ref2 = gdn_recurrent_ref(q, k, v, ba[:, None, Hv:], ba[:, None, :Hv], state.clone(), idx,
                               raw_gates=(A_log, dt_bias))
    assert torch.equal(o_ref2, o_ref)
    with pytest.raises(ValueError, match="raw_gates"):
        gdn_recurrent_triton(q, k, v, g[:, None], beta[:, None], state.clone(), idx, raw_gates=(A_log[:2], dt_bias))


def test_real_head_dims():
    """dk = dv = 128 as in the 4B model (fewer heads to keep the interpreter quick)."""
    q, k, v, g, beta, state = make_inputs(B=2, T=1, Hk=1, Hv=2, dk=128, dv=128, seed=7)
    idx = torch.tensor([4, 1], dtype=torch.int64)
    s_ref, s_tri = state.clone(), state.clone()
    o_ref = gdn_recurrent_ref(q, k, v, g, beta, s_ref, idx)
    o_tri = gdn_recurrent_triton(q, k, v, g, beta, s_tri, idx, out=poisoned(v.shape, v.dtype))
    assert_close(o_tri, o_ref)
    assert_close(s_tri, s_ref)


def test_strided_inputs_and_custom_scale():
    """q, k, v as slices of one fused projection output (row strides != contiguous), explicit scale."""
    B, T, Hk, Hv, dk, dv = 2, 2, 2, 4, 16, 24
    gen = torch.Generator().manual_seed(3)
    fused = torch.randn(B, T, 2 * Hk * dk + Hv * dv, generator=gen)
    q = fused[..., : Hk * dk].view(B, T, Hk, dk)
    k = fused[..., Hk * dk: 2 * Hk * dk].view(B, T, Hk, dk)
    v = fused[..., 2 * Hk * dk:].view(B, T, Hv, dv)
    ba = torch.randn(B, T, 2 * Hv, generator=gen)
    beta, g = ba[..., :Hv].sigmoid(), -torch.nn.functional.softplus(ba[..., Hv:])
    state = torch.randn(3, Hv, dk, dv, generator=gen)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    s_ref, s_tri = state.clone(), state.clone()
    o_ref = gdn_recurrent_ref(q, k, v, g, beta, s_ref, idx, scale=0.3)
    o_tri = gdn_recurrent_triton(q, k, v, g, beta, s_tri, idx, scale=0.3)
    assert_close(o_tri, o_ref)
    assert_close(s_tri, s_ref)


def delta_rule_float64(q, k, v, g, beta, S0, scale):
    """Independent formulation, one head at a time in float64: S_t = a_t (I - b_t k k^T) S + b_t k v^T, o = S^T q."""
    T, dk = q.shape
    S = S0.double()
    eye = torch.eye(dk, dtype=torch.float64)
    outs = []
    for t in range(T):
        qt = q[t].double() / (q[t].double().norm() ** 2 + 1e-6) ** 0.5 * scale
        kt = k[t].double() / (k[t].double().norm() ** 2 + 1e-6) ** 0.5
        a, b = float(g[t].double().exp()), float(beta[t])
        S = a * (eye - b * torch.outer(kt, kt)) @ S + b * torch.outer(kt, v[t].double())
        outs.append(S.t() @ qt)
    return torch.stack(outs), S


def test_ref_matches_independent_float64_loop():
    B, T, Hk, Hv, dk, dv = 2, 4, 2, 4, 8, 12
    q, k, v, g, beta, state = make_inputs(B=B, T=T, Hk=Hk, Hv=Hv, dk=dk, dv=dv, seed=11)
    state = state[:3]
    idx = torch.tensor([2, 0])
    s_ref = state.clone()
    o_ref = gdn_recurrent_ref(q, k, v, g, beta, s_ref, idx)
    for b in range(B):
        for h in range(Hv):
            o, S = delta_rule_float64(q[b, :, h // 2], k[b, :, h // 2], v[b, :, h], g[b, :, h], beta[b, :, h],
                                      state[idx[b], h], dk ** -0.5)
            torch.testing.assert_close(o_ref[b, :, h].double(), o, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(s_ref[idx[b], h].double(), S, rtol=1e-5, atol=1e-5)


def test_ref_matches_transformers():
    import transformers.models.qwen3_5.modeling_qwen3_5 as hf
    B, T, Hk, Hv, dk, dv = 2, 5, 2, 4, 16, 16
    q, k, v, g, beta, state = make_inputs(B=B, T=T, Hk=Hk, Hv=Hv, dk=dk, dv=dv, seed=5)
    idx = torch.tensor([1, 4])
    s_ref = state.clone()
    o_ref = gdn_recurrent_ref(q, k, v, g, beta, s_ref, idx)
    o_hf, s_hf = hf.torch_recurrent_gated_delta_rule(
        q.repeat_interleave(Hv // Hk, dim=2), k.repeat_interleave(Hv // Hk, dim=2), v, g, beta,
        initial_state=state[idx], output_final_state=True, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(o_ref, o_hf, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s_ref[idx], s_hf, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", [gdn_recurrent_ref, gdn_recurrent_triton])
def test_multi_token_equals_sequential_steps(impl):
    """T tokens in one call == T single-token calls (the verify path must agree with plain decode)."""
    B, T = 3, 3
    q, k, v, g, beta, state = make_inputs(B=B, T=T, seed=21)
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    s_all, s_seq = state.clone(), state.clone()
    o_all = impl(q, k, v, g, beta, s_all, idx)
    o_seq = torch.cat([impl(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1], s_seq, idx)
                       for t in range(T)], dim=1)
    assert_close(o_all, o_seq)
    assert_close(s_all, s_seq)


def test_dispatch(monkeypatch):
    q, k, v, g, beta, state = make_inputs()
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    monkeypatch.delenv("OCRIA_FORCE_TRITON", raising=False)
    o_cpu = gdn_recurrent(q, k, v, g, beta, state.clone(), idx)  # CPU tensors -> reference
    assert_dispatches_to_triton(monkeypatch, "kernels.gdn_recurrent.gdn_recurrent_triton", gdn_recurrent,
                                q, k, v, g, beta, state.clone(), idx, returns=o_cpu)


def test_bad_inputs_raise_clear_errors():
    q, k, v, g, beta, state = make_inputs()
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    with pytest.raises(ValueError, match="state must be float32 or bfloat16"):
        gdn_recurrent_triton(q, k, v, g, beta, state.to(torch.float16), idx)
    with pytest.raises(ValueError, match="multiple of key heads"):
        gdn_recurrent_ref(q, k, v[:, :, :5], g[:, :, :5], beta[:, :, :5], state[:, :5], idx)
    with pytest.raises(ValueError, match="state_idx"):
        gdn_recurrent_triton(q, k, v, g, beta, state, idx[:2])


@pytest.mark.parametrize("T", [1, 3])
def test_bf16_state_pool(T):
    """A bf16 state pool (gdn_state_dtype): read into fp32, stepped in fp32, rounded once to nearest even on the
    write; the kernel and the reference agree on the output and on the stored bits' neighbourhood, and the stepped
    state stays within bf16 rounding of the fp32 pool's."""
    require_interpreted(_gdn_recurrent_kernel)
    q, k, v, g, beta, state = make_inputs(T=T, dtype=torch.bfloat16, seed=40 + T)
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    s16 = state.to(torch.bfloat16)
    s_ref, s_tri, s32 = s16.clone(), s16.clone(), s16.float()
    o_ref = gdn_recurrent_ref(q, k, v, g, beta, s_ref, idx)
    o_tri = gdn_recurrent_triton(q, k, v, g, beta, s_tri, idx, out=poisoned(v.shape, torch.bfloat16))
    gdn_recurrent_ref(q, k, v, g, beta, s32, idx)
    assert s_tri.dtype == torch.bfloat16
    assert_close(o_tri, o_ref, torch.bfloat16)
    assert_close(s_tri.float(), s_ref.float(), torch.bfloat16)
    assert torch.equal(s_ref.float(), s32.to(torch.bfloat16).float())  # one rounding of the fp32 step
    untouched = [s for s in range(NUM_SLOTS) if s not in STATE_IDX]
    assert torch.equal(s_tri[untouched], s16[untouched])
