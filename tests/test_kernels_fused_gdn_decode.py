"""Fused GDN decode step (gate math + conv1d update + SiLU + gated delta rule + gated RMSNorm): Triton (interpreter)
vs reference, reference vs the engine's unfused decode ops, padding rows inert, several steps chained."""
import pytest
import torch

from kernels.testing import assert_close, poisoned, require_interpreted  # sets TRITON_INTERPRET first
from kernels.fused_gdn_decode import (_fused_gdn_decode_kernel, fused_gdn_decode, fused_gdn_decode_ref,
                                      fused_gdn_decode_triton)

EPS = 1e-6


def make_inputs(B, Hk, Hv, dk, dv, K, dtype, slots=6, seed=0):
    """(args, state_idx): a fused in_proj output split into strided views, as the model does."""
    gen = torch.Generator().manual_seed(seed)
    C = 2 * Hk * dk + Hv * dv
    proj = torch.randn(B, C + Hv * dv + 2 * Hv, generator=gen).to(dtype)
    qkv, z, ba = proj.split([C, Hv * dv, 2 * Hv], dim=-1)
    conv_state = torch.randn(slots, C, K - 1, generator=gen).to(dtype)
    conv_w = (0.5 * torch.randn(C, K, generator=gen)).to(dtype)
    A_log = torch.log(torch.rand(Hv, generator=gen) * 3.5 + 0.5)
    dt_bias = 0.5 * torch.randn(Hv, generator=gen)
    norm_w = (1 + 0.2 * torch.randn(dv, generator=gen)).to(dtype)
    ssm = 0.5 * torch.randn(slots, Hv, dk, dv, generator=gen)
    idx = torch.randperm(slots, generator=gen)[:B].to(torch.int32)
    idx[1::3] = -1  # padding rows
    args = [qkv, z.view(B, Hv, dv), ba[:, :Hv], ba[:, Hv:], conv_state, conv_w, A_log, dt_bias, norm_w, ssm]
    return args, idx


def cloned(args):
    return [a.clone() if i in (4, 9) else a for i, a in enumerate(args)]  # conv_state, ssm_state are updated


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,Hk,Hv,dk,dv,K", [(4, 2, 6, 12, 20, 4), (3, 1, 1, 16, 16, 3), (5, 3, 3, 8, 24, 4)])
def test_triton_matches_ref(B, Hk, Hv, dk, dv, K, dtype):
    require_interpreted(_fused_gdn_decode_kernel)
    args, idx = make_inputs(B, Hk, Hv, dk, dv, K, dtype, seed=dk + dv + B)
    ref_args, tri_args = cloned(args), cloned(args)
    want = fused_gdn_decode_ref(*ref_args, idx, EPS)
    got = fused_gdn_decode_triton(*tri_args, idx, EPS, out=poisoned((B, Hv, dv), dtype))
    assert got.dtype == dtype
    assert_close(got, want, dtype)
    assert torch.equal(tri_args[4], ref_args[4])  # conv state: a shift, exact
    assert_close(tri_args[9], ref_args[9], torch.float32, rtol=1e-5, atol=1e-5)


def test_padding_rows_are_inert_and_zero():
    args, idx = make_inputs(3, 2, 4, 8, 12, 4, torch.float32, seed=5)
    idx[:] = torch.tensor([-1, 2, -1], dtype=torch.int32)
    tri = cloned(args)
    y = fused_gdn_decode_triton(*tri, idx, EPS, out=poisoned((3, 4, 12), torch.float32))
    assert torch.equal(y[0], torch.zeros_like(y[0])) and torch.equal(y[2], torch.zeros_like(y[2]))
    others = [s for s in range(args[4].shape[0]) if s != 2]
    assert torch.equal(tri[4][others], args[4][others]) and torch.equal(tri[9][others], args[9][others])
    assert not torch.equal(tri[9][2], args[9][2])


def test_ref_matches_engine_unfused_ops_over_steps():
    """Three chained steps of the default decode path (glue.gdn_gates, conv1d update, gdn_recurrent, gated_rmsnorm)
    vs the fused kernel: outputs and both states agree at every step."""
    from engine import ops
    from engine.models.glue import gdn_gates

    B, Hk, Hv, dk, dv, K = 3, 2, 4, 12, 10, 4
    args, idx = make_inputs(B, Hk, Hv, dk, dv, K, torch.float32, seed=7)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    unf, fus = cloned(args), cloned(args)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        qkv = torch.randn(args[0].shape, generator=gen)
        ba = torch.randn(B, 2 * Hv, generator=gen)
        z = torch.randn(B, Hv, dv, generator=gen)
        g, beta = gdn_gates(ba, unf[6], unf[7])
        y = ops.causal_conv1d_update(qkv, unf[4], unf[5], idx, "silu")
        q, k, v = y.split([Hk * dk, Hk * dk, Hv * dv], dim=-1)
        o = ops.gdn_recurrent(q.reshape(B, 1, Hk, dk), k.reshape(B, 1, Hk, dk), v.reshape(B, 1, Hv, dv),
                              g[:, None], beta[:, None], unf[9], idx)[:, 0]
        want = ops.gated_rmsnorm(o, z, unf[8], EPS)
        got = fused_gdn_decode_triton(qkv, z, ba[:, :Hv], ba[:, Hv:], *fus[4:], idx, EPS)
        assert_close(got, want)
        assert torch.equal(fus[4], unf[4])
        assert_close(fus[9], unf[9])


def test_dispatch_and_bad_input(monkeypatch):
    args, idx = make_inputs(2, 1, 2, 8, 8, 4, torch.float32, seed=2)
    monkeypatch.delenv("OCRIA_FORCE_TRITON", raising=False)
    want = fused_gdn_decode(*cloned(args), idx, EPS)
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    assert_close(fused_gdn_decode(*cloned(args), idx, EPS), want)
    bad = cloned(args)
    bad[8] = bad[8][:-1]
    with pytest.raises(ValueError, match="norm_weight must be"):
        fused_gdn_decode(*bad, idx, EPS)
    bad = cloned(args)
    bad[4] = bad[4][:, :, :-1]
    with pytest.raises(ValueError, match="conv_state must be"):
        fused_gdn_decode(*bad, idx, EPS)
