"""GDN speculative verify with a ring of pending updates, its advance and fold: Triton (interpreter) vs reference,
and both vs plain recurrent decoding of the accepted tokens (the state a fold leaves must be the one the tokens'
plain decode steps leave, however the steps were split and whenever the state was written back)."""
import pytest
import torch

from kernels.testing import assert_close, poisoned, require_interpreted  # sets TRITON_INTERPRET first
from kernels.conv1d_update import causal_conv1d_update_ref, causal_conv1d_update_triton
from kernels.gdn_recurrent import gdn_recurrent_ref, l2norm_ref
from kernels.gdn_verify import (
    _conv_commit_kernel, _conv_verify_kernel, _gdn_fold_kernel, _gdn_verify_kernel, _ring_advance_kernel,
    causal_conv1d_verify, causal_conv1d_verify_ref, causal_conv1d_verify_triton, conv_state_commit,
    conv_state_commit_ref, conv_state_commit_triton, gdn_fold_ref, gdn_fold_triton, gdn_ring_advance,
    gdn_ring_advance_triton, gdn_verify_ref, gdn_verify_triton)

NUM_SLOTS = 6
STATE_IDX = [4, -1, 0, 2]  # the second row is padding


def inputs(B=4, T=5, Hk=2, Hv=6, dk=24, dv=40, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(q=rnd(B, T, Hk, dk).to(dtype), k=rnd(B, T, Hk, dk).to(dtype), v=rnd(B, T, Hv, dv).to(dtype),
                g=rnd(B, T, Hv).to(dtype), beta=rnd(B, T, Hv).to(dtype),
                A_log=torch.rand(Hv, generator=gen), dt_bias=rnd(Hv) * 0.5,
                state=rnd(NUM_SLOTS, Hv, dk, dv) * 0.5)


def make_ring(P, Hk, dk, Hv, dv, pending, seed=0, layers=()):
    """A ring whose slots hold random pending tokens, pending = {slot: (start, count)}; every other row NaN, so a
    read of a row that is not pending shows. `layers`: (L,) for a leading layer axis."""
    gen = torch.Generator().manual_seed(seed)
    lead = (*layers, NUM_SLOTS, P)
    rk, ru, rg = (poisoned((*lead, *d), torch.float32) for d in ((Hk, dk), (Hv, dv), (Hv,)))
    pos = torch.zeros(NUM_SLOTS, 2, dtype=torch.int32)
    for slot, (start, h) in pending.items():
        pos[slot] = torch.tensor([start, h])
        for j in range(h):
            r = (start + j) % P
            rk[..., slot, r, :, :] = l2norm_ref(torch.randn(*layers, Hk, dk, generator=gen))
            ru[..., slot, r, :, :] = torch.randn(*layers, Hv, dv, generator=gen)
            rg[..., slot, r, :] = -0.3 * torch.rand(*layers, Hv, generator=gen)
    return rk, ru, rg, pos


def clone_ring(ring):
    return tuple(t.clone() for t in ring)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,dk,dv,aligned", [(5, 24, 40, False), (1, 24, 24, False), (7, 24, 17, False),
                                            (16, 20, 17, False), (11, 64, 72, False), (16, 24, 40, True),
                                            (20, 24, 17, True)])
def test_verify_advance_and_fold_triton_match_ref(dtype, T, dk, dv, aligned):
    """The verify kernel against the token-by-token reference, from rings whose pending tokens wrap past the last
    row: outputs, the state written back where more than fold_after tokens were pending (and nowhere else), the
    block's k / u / g in the rows after the pending ones (and nowhere else), then the advance and the fold.
    `aligned`: a stress case, nearly parallel keys, beta near 1 and almost no decay."""
    require_interpreted(_gdn_verify_kernel)
    require_interpreted(_gdn_fold_kernel)
    require_interpreted(_ring_advance_kernel)
    Hk, Hv, fold_after = 2, 6, 2
    P = fold_after + 2 * T + 1
    x = inputs(T=T, dk=dk, dv=dv, dtype=dtype, seed=100 + T + dv)
    if aligned:
        x["k"] = (x["k"][:, :1] + 0.05 * x["k"]).to(dtype)
        x["beta"] = torch.full_like(x["beta"], 6.0)  # raw: sigmoid -> 0.998
        x["g"] = torch.full_like(x["g"], -12.0)  # raw: softplus -> ~6e-6, decay ~1
    # slot 4: 3 pending from the second-to-last row (> fold_after: written back); slot 0 none; slot 2: 2 pending
    pending = {4: (P - 2, 3), 0: (0, 0), 2: (1, 2)}
    ring_ref = make_ring(P, Hk, dk, Hv, dv, pending, seed=T)
    ring_tri = clone_ring(ring_ref)
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    raw = (x["A_log"], x["dt_bias"])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    s_ref, s_tri = x["state"].clone(), x["state"].clone()
    o_ref = gdn_verify_ref(*args, s_ref, idx, ring_ref, fold_after, raw_gates=raw)
    o_tri = gdn_verify_triton(*args, s_tri, idx, ring_tri, fold_after, raw_gates=raw,
                              out=poisoned(x["v"].shape, dtype))
    assert_close(o_tri, o_ref, dtype)
    assert torch.equal(o_tri[1], torch.zeros_like(o_tri[1]))
    assert_close(s_tri, s_ref, torch.float32)
    kept_slots = [s for s in range(NUM_SLOTS) if s != 4]
    assert torch.equal(s_tri[kept_slots], x["state"][kept_slots]), "only a slot past fold_after is written back"
    assert not torch.equal(s_tri[4], x["state"][4])
    written = torch.zeros(NUM_SLOTS, P, dtype=torch.bool)  # pending rows and the block's rows after them
    for slot, (start, h) in pending.items():
        written[slot, [(start + j) % P for j in range(h + T)]] = True
    for a, b in zip(ring_tri[:3], ring_ref[:3]):
        assert_close(a[written], b[written], torch.float32)
        assert a[~written].isnan().all(), "no ring row but the block's may be written"
    live = idx >= 0
    n = torch.tensor([T, 3, 0, min(2, T)], dtype=torch.int32)[live]
    gdn_ring_advance(ring_ref[3], idx[live], n, fold_after, P)
    gdn_ring_advance_triton(ring_tri[3], idx[live], n, fold_after, P)
    assert torch.equal(ring_tri[3], ring_ref[3])
    assert ring_ref[3][[4, 0, 2]].tolist() == [[(P - 2 + 3) % P, T], [0, 0], [1, 2 + min(2, T)]]
    gdn_fold_ref(s_ref, idx[live], ring_ref)
    gdn_fold_triton(s_tri, idx[live], ring_tri)
    assert_close(s_tri, s_ref, torch.float32)
    assert ring_tri[3][idx[live].long(), 1].eq(0).all() and ring_ref[3][idx[live].long(), 1].eq(0).all()
    assert torch.equal(s_tri[0], x["state"][0]), "a slot with nothing pending keeps its state"
    untouched = [s for s in range(NUM_SLOTS) if s not in STATE_IDX]
    assert torch.equal(s_tri[untouched], x["state"][untouched])


def test_verify_dispatches_to_triton(monkeypatch):
    from kernels.gdn_verify import gdn_verify
    from kernels.testing import assert_dispatches_to_triton

    x = inputs()
    ring = make_ring(10, 2, 24, 6, 40, {})
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], idx, ring)
    assert_dispatches_to_triton(monkeypatch, "kernels.gdn_verify.gdn_verify_triton", gdn_verify, *args)


@pytest.mark.parametrize("fold_after", [0, 3])
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_speculative_steps_equal_plain_decoding_of_the_accepted_tokens(impl, fold_after):
    """Steps of verify + advance, with blocks whose rejected tail is garbage, then a fold == plain recurrent
    decoding of the accepted tokens alone: each accepted token's output and the final state, to fp32 rounding (the
    batched einsums may sum in another order than the per-token ones), however many tokens were pending when."""
    if impl == "triton":
        require_interpreted(_gdn_verify_kernel)
        require_interpreted(_gdn_fold_kernel)
    verify, fold, advance = {"reference": (gdn_verify_ref, gdn_fold_ref, gdn_ring_advance),
                             "triton": (gdn_verify_triton, gdn_fold_triton, gdn_ring_advance_triton)}[impl]
    T, Hk, Hv, dk, dv = 5, 2, 6, 24, 40
    accepted = [[3, 5, 1, 2], [1, 1, 5, 4], [5, 2, 2, 1]]  # per step, per row: tokens accepted
    x = inputs(B=3, T=sum(max(r) for r in accepted), seed=10 + fold_after)  # the stream each row decodes
    garbage = inputs(B=3, T=T, seed=99)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    raw = (x["A_log"], x["dt_bias"])
    P = fold_after + 2 * T
    ring = make_ring(P, Hk, dk, Hv, dv, {})
    s_plain, s = x["state"].clone(), x["state"].clone()
    pos = [0, 0, 0]
    for step in range(4):
        n = [accepted[r][step] for r in range(3)]
        block = {key: garbage[key].clone() for key in ("q", "k", "v", "g", "beta")}
        for r in range(3):
            for key in block:
                block[key][r, :n[r]] = x[key][r, pos[r]:pos[r] + n[r]]
        o = verify(block["q"], block["k"], block["v"], block["g"], block["beta"], s, idx, ring, fold_after,
                   raw_gates=raw)
        advance(ring[3], idx, torch.tensor(n, dtype=torch.int32), fold_after, P)
        for r in range(3):
            one = idx[r:r + 1]
            for t in range(n[r]):
                p = pos[r] + t
                want = gdn_recurrent_ref(*(x[key][r:r + 1, p:p + 1] for key in ("q", "k", "v", "g", "beta")),
                                         s_plain, one, raw_gates=raw)
                assert_close(o[r, t], want[0, 0], torch.float32, rtol=1e-5, atol=1e-5)
            pos[r] += n[r]
    assert int(ring[3][idx.long(), 1].max()) > 0
    fold(s, idx, ring)
    assert_close(s, s_plain, torch.float32, rtol=1e-5, atol=1e-5)


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
def test_fold_and_conv_commit_of_every_layer_in_one_launch_equal_each_layer_alone(dtype):
    """The engine folds all GDN layers at once and commits all conv states at once (a leading layer axis): each
    layer must end as that layer alone would, other slots untouched, and a layer's ring never read for another
    (every layer gets its own tokens)."""
    require_interpreted(_gdn_fold_kernel)
    require_interpreted(_conv_commit_kernel)
    L, T, Hk, Hv, dk, dv, C, K, P = 3, 5, 2, 6, 24, 17, 37, 4, 7
    gen = torch.Generator().manual_seed(7)
    state0 = torch.randn(L, NUM_SLOTS, Hv, dk, dv, generator=gen)
    ring = make_ring(P, Hk, dk, Hv, dv, {4: (5, 4), 0: (0, 0), 2: (2, 5)}, layers=(L,))
    idx = torch.tensor([4, 0, 2])
    s = state0.clone()
    r_tri = clone_ring(ring)
    gdn_fold_triton(s, idx, r_tri)
    assert r_tri[3][[4, 0, 2], 1].eq(0).all()
    for i in range(L):
        want = state0[i].clone()
        gdn_fold_ref(want, idx, (ring[0][i], ring[1][i], ring[2][i], ring[3].clone()))
        assert_close(s[i], want, torch.float32)
        assert torch.equal(s[i, [1, 3, 5]], state0[i, [1, 3, 5]])
    ref = state0.clone()
    gdn_fold_ref(ref, idx, clone_ring(ring))  # the reference's layered form
    assert_close(s, ref, torch.float32)
    B, sidx = len(STATE_IDX), torch.tensor(STATE_IDX)
    x = torch.randn(L, B + 2, T, C, generator=gen).to(dtype)[:, :B]
    conv0 = torch.randn(L, NUM_SLOTS, C, K - 1, generator=gen).to(dtype)
    n = torch.tensor([T, 3, 0, 2])
    conv = conv0.clone()
    conv_state_commit_triton(x, conv, sidx, n)
    live = sidx >= 0
    for i in range(L):
        want_conv = conv0[i].clone()
        conv_state_commit_ref(x[i][live], want_conv, sidx[live], n[live])
        assert torch.equal(conv[i], want_conv), i


def test_verify_steps_each_token_as_the_decode_kernel_does():
    """With nothing pending, the verify's outputs are the decode kernel's over the same tokens, bit for bit, and so
    is the state once the block is accepted and folded: plain and speculative decoding must step alike."""
    from kernels.gdn_recurrent import _gdn_recurrent_kernel, gdn_recurrent_triton

    require_interpreted(_gdn_verify_kernel)
    require_interpreted(_gdn_recurrent_kernel)
    require_interpreted(_gdn_fold_kernel)
    T, Hk, Hv, dk, dv = 6, 2, 6, 24, 40
    x = inputs(T=T, dk=dk, dv=dv, seed=7)
    idx = torch.tensor(STATE_IDX, dtype=torch.int32)
    raw = (x["A_log"], x["dt_bias"])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    ring = make_ring(2 * T, Hk, dk, Hv, dv, {})
    s_verify, s_decode = x["state"].clone(), x["state"].clone()
    o_verify = gdn_verify_triton(*args, s_verify, idx, ring, 0, raw_gates=raw)
    o_decode = gdn_recurrent_triton(*args, s_decode, idx, raw_gates=raw)
    assert torch.equal(o_verify, o_decode)
    # every token accepted, then folded: the state plain decoding left
    live = idx[idx >= 0]
    gdn_ring_advance_triton(ring[3], live, torch.full((len(live),), T, dtype=torch.int32), 0, 2 * T)
    gdn_fold_triton(s_verify, live, ring)
    assert torch.equal(s_verify, s_decode)
