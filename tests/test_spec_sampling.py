"""Acceptance rules of speculative decoding (engine/spec_sampling.py): greedy prefix matching, and rejection sampling
whose output must be distributed exactly as sampling from the target, whatever the drafter proposes."""
import math

import torch

from engine.spec_sampling import greedy_accept, rejection_accept


def test_greedy_accepts_the_matching_prefix_within_valid():
    V = 7
    post = torch.tensor([[3, 1, 4, 1, 5], [2, 2, 2, 2, 2], [6, 0, 6, 0, 6]])
    logits = torch.nn.functional.one_hot(post, V).float()
    drafts = torch.tensor([[3, 1, 0, 1], [2, 2, 2, 2], [1, 0, 6, 0]])
    tokens, emitted = greedy_accept(drafts, logits, torch.tensor([5, 3, 5]))
    assert torch.equal(tokens, post)
    assert emitted.tolist() == [3, 3, 1]  # row 1: all drafts right, but only 2 may be taken (valid 3)


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square (Wilson-Hilferty), z = 3.719: one-sided 1e-4."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def generate(p_abs, q_abs, n_rows, L, T, gen, valid_random=True, accept=rejection_accept):
    """Sample n_rows sequences of L tokens by repeated draft/verify steps: the target's distribution of the token
    at absolute position k is p_abs[k] (context-free), the drafter's q_abs[k] (both L + 2T rows); block caps drawn
    at random."""
    V = p_abs.shape[1]
    out = torch.full((n_rows, L + T), -1, dtype=torch.int64)
    pos = torch.zeros(n_rows, dtype=torch.int64)
    rows = torch.arange(n_rows)
    while (pos < L).any():
        j = torch.arange(T)
        p = p_abs[pos[:, None] + j[None, :]]  # [n, T, V]
        q = q_abs[pos[:, None] + j[None, :-1]]  # [n, T-1, V]
        drafts = torch.multinomial(q.reshape(-1, V), 1, generator=gen).view(n_rows, T - 1)
        valid = torch.randint(1, T + 1, (n_rows,), generator=gen) if valid_random else torch.full((n_rows,), T)
        u = torch.rand(n_rows, T - 1, generator=gen)
        rn = torch.empty(n_rows, T - 1, V).exponential_(generator=gen)
        bn = torch.empty(n_rows, T, V).exponential_(generator=gen)
        tokens, emitted = accept(drafts, q, p, valid, u, rn, bn)
        assert (emitted >= 1).all() and (emitted <= valid).all()
        active = pos < L  # rows already L long stand still
        for k in range(T):
            take = (k < emitted) & active
            out[rows[take], pos[take] + k] = tokens[take, k]
        pos = pos + emitted * active
    return out[:, :L]


def test_rejection_sampling_matches_the_target_distribution():
    gen = torch.Generator().manual_seed(0)
    V, T, L, N = 6, 4, 6, 40_000
    p_abs = torch.softmax(torch.randn(L + 2 * T, V, generator=gen) * 1.5, -1)
    q_abs = torch.softmax(torch.randn(L + 2 * T, V, generator=gen) * 1.5, -1)
    q_abs[:, 0] = 0  # a token the drafter never proposes (must still come out at its target rate)
    q_abs /= q_abs.sum(-1, keepdim=True)
    out = generate(p_abs, q_abs, N, L, T, gen)
    crit = chi2_critical(V - 1)
    for k in range(L):
        stat = chi2(torch.bincount(out[:, k], minlength=V).float(), p_abs[k])
        assert stat < crit, (k, stat, crit)
    joint = torch.bincount(out[:, 1] * V + out[:, 2], minlength=V * V).float()
    assert chi2(joint, torch.outer(p_abs[1], p_abs[2]).flatten()) < chi2_critical(V * V - 1)


def test_rejection_sampling_with_a_top_k_proposal_matches_the_target_distribution():
    """DFlash2's selector drafts from a softmax over a few candidates: q is zero outside 2 of the 6 tokens at every
    position, and the output must still be the target's distribution."""
    gen = torch.Generator().manual_seed(2)
    V, T, L, N = 6, 4, 5, 40_000
    p_abs = torch.softmax(torch.randn(L + 2 * T, V, generator=gen) * 1.5, -1)
    scores = torch.randn(L + 2 * T, V, generator=gen)
    keep = torch.zeros(L + 2 * T, V, dtype=torch.bool).scatter_(1, scores.topk(2, -1).indices, True)
    q_abs = torch.where(keep, torch.softmax(scores.masked_fill(~keep, -torch.inf), -1), 0.0)
    out = generate(p_abs, q_abs, N, L, T, gen)
    crit = chi2_critical(V - 1)
    for k in range(L):
        stat = chi2(torch.bincount(out[:, k], minlength=V).float(), p_abs[k])
        assert stat < crit, (k, stat, crit)


def test_the_statistical_check_catches_a_lossy_rule():
    """The same check fails for a sampler that keeps every draft the target finds likely enough (no rejection
    sampling): the test has teeth."""
    gen = torch.Generator().manual_seed(1)
    V, T, L, N = 6, 4, 4, 40_000
    p_abs = torch.softmax(torch.randn(L + 2 * T, V, generator=gen) * 1.5, -1)
    q_abs = torch.softmax(torch.randn(L + 2 * T, V, generator=gen) * 1.5, -1)

    def lossy(drafts, q, p, valid, u, rn, bn):  # as if the drafter were sure of its drafts (q(x) = 1/2)
        return rejection_accept(drafts, torch.nn.functional.one_hot(drafts, V).float() * 0.5, p, valid, u, rn, bn)

    out = generate(p_abs, q_abs, N, L, T, gen, valid_random=False, accept=lossy)
    stats = [chi2(torch.bincount(out[:, k], minlength=V).float(), p_abs[k]) for k in range(1, L)]
    assert max(stats) > chi2_critical(V - 1), stats


def test_the_blocks_last_draft_is_checked_and_the_cut_holds():
    """Rows of four kinds: a whole block (valid = T) or a cut one (valid < T) whose last draft is wrong, the ones
    before it right; and a whole or cut block whose drafts are all right, in a cut block the one after the cut too.
    A wrong last draft must be rejected and replaced by the target's token (greedy) or a draw from the residual
    max(0, p - q) (sampling), whatever the uniform and noise draws; all-right rows keep their drafts up to the cut
    and get the bonus token there. An acceptance off by one at the block's last position (or at the cut) keeps a
    draft it must not: in greedy acceptance only the engine's oracle test would show it otherwise, in minutes."""
    gen = torch.Generator().manual_seed(4)
    S, T, V = 256, 5, 7
    rows = torch.arange(S)
    kind = rows % 4
    wrong, cut = kind < 2, kind % 2 == 1
    valid = torch.where(cut, torch.randint(2, T, (S,), generator=gen), T)
    last = valid - 2  # the row's last draft that may be accepted
    want = torch.where(wrong, valid - 1, valid)  # tokens emitted

    # greedy: the drafts are the target's argmax, but the last one in the wrong rows
    post = torch.randint(0, V, (S, T), generator=gen)
    drafts = post[:, :-1].clone()
    drafts[wrong, last[wrong]] = (post[wrong, last[wrong]] + 1) % V
    tokens, emitted = greedy_accept(drafts, torch.nn.functional.one_hot(post, V).float(), valid)
    assert torch.equal(emitted, want), rows_off(emitted, want, kind, valid)
    assert torch.equal(tokens, post)  # the kept drafts, then the argmax in place of the wrong one or as the bonus

    # sampling: p(x) > q(x) for a right draft x (accepted whatever u < 1); a wrong draft has p(x) = 0 (rejected
    # whatever u), its mass moved to one token y, the residual's only one, while p stays spread over the others; in
    # all-right rows p is one-hot on y where the bonus is drawn (in a cut block y is the draft after the cut, which
    # is then right too)
    q = torch.softmax(torch.randn(S, T - 1, V, generator=gen), -1)
    drafts = torch.randint(0, V, (S, T - 1), generator=gen)
    p = torch.cat([(q + torch.nn.functional.one_hot(drafts, V)) / 2,
                   torch.softmax(torch.randn(S, 1, V, generator=gen), -1)], 1)
    x = drafts[rows, last]
    y = torch.where(wrong, (x + torch.randint(1, V, (S,), generator=gen)) % V,  # any token but the draft
                    torch.cat([drafts, drafts[:, :1]], 1)[rows, valid - 1])
    w = rows[wrong]
    p[w, last[w]] = q[w, last[w]]
    p[w, last[w], y[w]] += q[w, last[w], x[w]]
    p[w, last[w], x[w]] = 0
    r = rows[~wrong]
    p[r, valid[r] - 1] = torch.nn.functional.one_hot(y[r], V).float()
    u = torch.rand(S, T - 1, generator=gen)
    rn = torch.empty(S, T - 1, V).exponential_(generator=gen)
    bn = torch.empty(S, T, V).exponential_(generator=gen)
    tokens, emitted = rejection_accept(drafts, q, p, valid, u, rn, bn)
    assert torch.equal(emitted, want), rows_off(emitted, want, kind, valid)
    kept = torch.arange(T - 1)[None, :] < (want - 1)[:, None]
    assert torch.equal(tokens[:, :-1][kept], drafts[kept])
    assert torch.equal(tokens[rows, want - 1], y), rows_off(tokens[rows, want - 1], y, kind, valid)


def rows_off(got, want, kind, valid):
    """The first rows where got != want: (row, kind, valid, got, want)."""
    off = (got != want).nonzero()[:4, 0].tolist()
    return [(r, int(kind[r]), int(valid[r]), int(got[r]), int(want[r])) for r in off]
