"""GDN speculative verify + commit: Triton (interpreter) vs reference, and both vs plain recurrent decoding of the
accepted prefix (the state a commit leaves must be the one the tokens' plain decode steps leave)."""
import pytest
import torch

from kernels.testing import assert_close, poisoned, require_interpreted  # sets TRITON_INTERPRET first
from kernels.conv1d_update import causal_conv1d_update_ref, causal_conv1d_update_triton
from kernels.gdn_recurrent import gdn_recurrent_ref
from kernels.gdn_verify import (
    _conv_commit_kernel, _conv_verify_kernel, _gdn_commit_kernel, _gdn_verify_chunk_kernel, _gdn_verify_kernel,
    causal_conv1d_verify, causal_conv1d_verify_ref, causal_conv1d_verify_triton, conv_state_commit,
    conv_state_commit_ref, conv_state_commit_triton, gdn_commit_ref, gdn_commit_triton, gdn_verify_chunk_triton,
    gdn_verify_ref, gdn_verify_triton)

NUM_SLOTS = 6
STATE_IDX = [4, -1, 0, 2]  # the second row is padding


def inputs(B=4, T=5, Hk=2, Hv=6, dk=24, dv=40, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(q=rnd(B, T, Hk, dk).to(dtype), k=rnd(B, T, Hk, dk).to(dtype), v=rnd(B, T, Hv, dv).to(dtype),
                g=rnd(B, T, Hv).to(dtype), beta=rnd(B, T, Hv).to(dtype),
                A_log=torch.rand(Hv, generator=gen), dt_bias=rnd(Hv) * 0.5,
                state=rnd(NUM_SLOTS, Hv, dk, dv) * 0.5)


def kept(B, T, Hk, dk, Hv, dv, extra=1):
    return (poisoned((B + extra, T + extra, Hk, dk), torch.float32), poisoned((B + extra, T + extra, Hv, dv), torch.float32),
            poisoned((B + extra, T + extra, Hv), torch.float32))


@pytest.mark.parametrize("form", ["steps", "steps unrolled", "chunk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,dk,dv,aligned", [(5, 24, 40, False), (1, 24, 24, False), (7, 24, 17, False),
                                            (16, 20, 17, False), (11, 64, 72, False), (16, 24, 40, True)])
def test_verify_and_commit_triton_match_ref(form, dtype, T, dk, dv, aligned):
    """Both verify kernels (token by token, looped or unrolled, and the chunk form that solves the block with matrix
    products) against the token-by-token reference: outputs, kept k / u / g, and the state a commit of each row's
    accepted prefix leaves. `aligned`: nearly parallel keys, beta near 1 and almost no decay, where the chunk form's triangular
    system is ill-conditioned and every row of its solve matters (with random keys a missing row would pass)."""
    kernel, verify = {"steps": (_gdn_verify_kernel, gdn_verify_triton),
                      "steps unrolled": (_gdn_verify_kernel, lambda *a, **k: gdn_verify_triton(*a, unroll=True, **k)),
                      "chunk": (_gdn_verify_chunk_kernel, gdn_verify_chunk_triton)}[form]
    require_interpreted(kernel)
    require_interpreted(_gdn_commit_kernel)
    Hk, Hv = 2, 6
    x = inputs(T=T, dk=dk, dv=dv, dtype=dtype, seed=100 + T + dv)
    if aligned:
        x["k"] = (x["k"][:, :1] + 0.05 * x["k"]).to(dtype)
        x["beta"] = torch.full_like(x["beta"], 6.0)  # raw: sigmoid -> 0.998
        x["g"] = torch.full_like(x["g"], -12.0)  # raw: softplus -> ~6e-6, decay ~1
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    B = len(STATE_IDX)
    raw = (x["A_log"], x["dt_bias"])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    s_ref, s_tri = x["state"].clone(), x["state"].clone()
    kr, ur, gr = kept(B, T, Hk, dk, Hv, dv)
    kt, ut, gt = kept(B, T, Hk, dk, Hv, dv)
    o_ref = gdn_verify_ref(*args, s_ref, idx, kr, ur, gr, raw_gates=raw)
    o_tri = verify(*args, s_tri, idx, kt, ut, gt, raw_gates=raw, out=poisoned(x["v"].shape, dtype))
    assert torch.equal(s_ref, x["state"]) and torch.equal(s_tri, x["state"]), "verify must not write the state"
    assert_close(o_tri, o_ref, dtype)
    assert torch.equal(o_tri[1], torch.zeros_like(o_tri[1]))
    live = [0, 2, 3]
    for a, b in ((kt, kr), (ut, ur), (gt, gr)):
        assert_close(a[live, :T], b[live, :T], torch.float32)
        assert a[1].isnan().all(), "a padding row's kept values must not be written"
    n = torch.tensor([T, 3, 0, min(2, T)], dtype=torch.int32)
    gdn_commit_ref(s_ref, idx, kr, ur, gr, n)
    gdn_commit_triton(s_tri, idx, kt, ut, gt, n)
    assert_close(s_tri, s_ref, torch.float32)
    assert torch.equal(s_tri[0], x["state"][0]), "a row that accepted nothing keeps its state"
    untouched = [s for s in range(NUM_SLOTS) if s not in STATE_IDX]
    assert torch.equal(s_tri[untouched], x["state"][untouched])


def test_verify_dispatches_to_the_chunk_form_when_asked(monkeypatch):
    from kernels.gdn_verify import gdn_verify
    from kernels.testing import assert_dispatches_to_triton

    x = inputs()
    k = kept(4, 5, 2, 24, 6, 40)
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], idx, *k)
    assert_dispatches_to_triton(monkeypatch, "kernels.gdn_verify.gdn_verify_chunk_triton",
                                lambda *a: gdn_verify(*a, chunk=True), *args)
    assert_dispatches_to_triton(monkeypatch, "kernels.gdn_verify.gdn_verify_triton", gdn_verify, *args)


@pytest.mark.parametrize("n", [0, 1, 3, 5])
def test_commit_equals_plain_decoding_of_the_prefix(n):
    """Verify + commit of n accepted tokens == n plain recurrent steps (outputs and state), to fp32 rounding (the
    batched einsums may sum in another order than the per-token ones)."""
    T, Hk, Hv, dk, dv = 5, 2, 6, 24, 40
    x = inputs(T=T, seed=10 + n)
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    B = len(STATE_IDX)
    raw = (x["A_log"], x["dt_bias"])
    s_plain = x["state"].clone()
    outs = [gdn_recurrent_ref(x["q"][:, t:t + 1], x["k"][:, t:t + 1], x["v"][:, t:t + 1], x["g"][:, t:t + 1],
                              x["beta"][:, t:t + 1], s_plain, idx, raw_gates=raw) for t in range(n)]
    for commit, verify in ((gdn_commit_ref, gdn_verify_ref), (gdn_commit_triton, gdn_verify_triton)):
        s = x["state"].clone()
        kk, uk, gk = kept(B, T, Hk, dk, Hv, dv)
        o = verify(x["q"], x["k"], x["v"], x["g"], x["beta"], s, idx, kk, uk, gk, raw_gates=raw)
        commit(s, idx, kk, uk, gk, torch.full((B,), n, dtype=torch.int64))
        if n:
            assert_close(o[:, :n], torch.cat(outs, 1), torch.float32, rtol=1e-6, atol=1e-6)
            assert_close(s, s_plain, torch.float32, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(s, x["state"])


@pytest.mark.parametrize("n", [0, 2, 6])
def test_conv_verify_and_commit_equal_token_by_token_updates(n):
    B, T, C, K = 3, 6, 37, 4
    gen = torch.Generator().manual_seed(n)
    xs = torch.randn(B, T, C, generator=gen)
    w = torch.randn(C, K, generator=gen)
    state0 = torch.randn(5, C, K - 1, generator=gen)
    idx = torch.tensor([3, 0, 4])
    plain = state0.clone()
    ys = [causal_conv1d_update_ref(xs[:, t], plain, w, idx) for t in range(T)]
    assert torch.equal(plain[[1, 2]], state0[[1, 2]])
    s = state0.clone()
    y = causal_conv1d_verify(xs, s, w, idx)
    assert torch.equal(s, state0)
    torch.testing.assert_close(y, torch.stack(ys, 1), rtol=1e-6, atol=1e-6)
    plain = state0.clone()
    for t in range(n):
        causal_conv1d_update_ref(xs[:, t], plain, w, idx)
    conv_state_commit(xs, s, idx, torch.full((B,), n))
    assert torch.equal(s, plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,C,K", [(5, 37, 4), (16, 130, 4), (3, 20, 3)])
def test_conv_verify_and_commit_kernels_match_the_reference(T, C, K, dtype):
    """The Triton conv verify / commit against the torch reference, on fresh inputs of odd sizes, in the engine's
    layout (x a [:B, :T] view of a larger kept buffer); padding rows (state slot -1) are read as slot 0 by verify,
    as the reference reads them, and left alone by commit. Verify's outputs equal the decode kernel's for the same
    tokens bit for bit: the same sum over the taps."""
    require_interpreted(_conv_verify_kernel)
    require_interpreted(_conv_commit_kernel)
    B, gen = len(STATE_IDX), torch.Generator().manual_seed(T * C + K)
    kept_x = torch.randn(B + 2, T + 3, C, generator=gen).to(dtype)
    x = kept_x[:B, :T]
    w = torch.randn(C, K, generator=gen).to(dtype)
    state0 = torch.randn(NUM_SLOTS, C, K - 1, generator=gen).to(dtype)
    idx = torch.tensor(STATE_IDX)
    s = state0.clone()
    keep = poisoned((B, T, C), dtype)  # the engine keeps the block's inputs for the commit in the same launch
    y = causal_conv1d_verify_triton(x, s, w, idx, keep=keep)
    assert torch.equal(s, state0) and torch.equal(keep, x)
    assert_close(y, causal_conv1d_verify_ref(x, state0, w, idx), dtype)
    assert torch.equal(causal_conv1d_verify_triton(x, s, w, idx), y)  # without keep: the same outputs
    plain = state0.clone()
    live = idx >= 0
    for t in range(T):  # the decode kernel, one token at a time, from the same states
        y_t = causal_conv1d_update_triton(x[:, t].contiguous(), plain, w, idx)
        assert torch.equal(y[live, t], y_t[live]), t
    for n in ([0] * B, [T] * B, [1, 2, T, T - 1]):
        num = torch.tensor(n)
        s, want = state0.clone(), state0.clone()
        conv_state_commit_triton(x, s, idx, num)
        conv_state_commit_ref(x[live], want, idx[live], num[live])
        assert torch.equal(s, want), n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_commit_of_every_layer_in_one_launch_equals_each_layer_alone(dtype):
    """The engine commits all GDN layers at once (state and kept buffers with a leading layer axis): each layer
    must end as a commit of that layer alone leaves it, the conv states as well, padding rows untouched, and a
    layer's buffers never read for another (every layer gets its own inputs)."""
    require_interpreted(_gdn_commit_kernel)
    require_interpreted(_conv_commit_kernel)
    L, T, Hk, Hv, dk, dv, C, K = 3, 5, 2, 6, 24, 17, 37, 4
    B, gen = len(STATE_IDX), torch.Generator().manual_seed(7)
    state0 = torch.randn(L, NUM_SLOTS, Hv, dk, dv, generator=gen)
    kk = torch.randn(L, B + 1, T + 1, Hk, dk, generator=gen)
    uk = torch.randn(L, B + 1, T + 1, Hv, dv, generator=gen)
    gk = -torch.rand(L, B + 1, T + 1, Hv, generator=gen)
    x = torch.randn(L, B + 2, T, C, generator=gen).to(dtype)[:, :B]
    conv0 = torch.randn(L, NUM_SLOTS, C, K - 1, generator=gen).to(dtype)
    idx = torch.tensor(STATE_IDX)
    n = torch.tensor([T, 3, 0, 2])
    s, conv = state0.clone(), conv0.clone()
    gdn_commit_triton(s, idx, kk, uk, gk, n)
    conv_state_commit_triton(x, conv, idx, n)
    live = idx >= 0
    for i in range(L):
        want = state0[i].clone()
        gdn_commit_ref(want, idx, kk[i], uk[i], gk[i], n)
        assert_close(s[i], want, torch.float32)
        want_conv = conv0[i].clone()
        conv_state_commit_ref(x[i][live], want_conv, idx[live], n[live])
        assert torch.equal(conv[i], want_conv), i
    ref = state0.clone()
    gdn_commit_ref(ref, idx, kk, uk, gk, n)  # the reference's layered form
    assert_close(s, ref, torch.float32)
