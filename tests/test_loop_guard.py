"""engine/loop_guard.py: the incremental guard and drop against their brute-force references, and the engine ending
looping answers with the guard (finish_reason "loop", one copy of the unit kept) or leaving their repeats out with the
drop, while leaving every other answer as it was."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import numpy as np
import pytest

from engine.interface import SamplingParams
from engine.llm_engine import Engine, RequestRejected
from engine.loop_guard import LoopDrop, LoopGuard, drop_loops, drop_loops_reference, find_loop
from engine.testing import build_checkpoint


def guard_fires(tokens, min_tokens, start=0):
    guard = LoopGuard(min_tokens)
    for end in range(start + 1, len(tokens) + 1):
        keep = guard.push(tokens, start, end)
        if keep is not None:
            return keep
    return None


def random_answers(rng, min_tokens, n, loops_each=1):
    """Small vocabularies and spliced repeats: loops of every period, and near-loops that must not fire."""
    for trial in range(n):
        vocab = int(rng.integers(2, 6))
        toks = rng.integers(0, vocab, int(rng.integers(1, 40))).tolist()
        for _ in range(loops_each if trial % 2 else 0):
            unit = rng.integers(0, vocab, int(rng.integers(1, min_tokens // 3 + 2))).tolist()
            reps = -(-int(rng.integers(1, 2 * min_tokens)) // len(unit))  # spans below and above min_tokens
            toks += unit * reps + rng.integers(0, vocab, int(rng.integers(0, 5))).tolist()
        yield vocab, toks


@pytest.mark.parametrize("min_tokens", [3, 7, 10, 13])
def test_guard_matches_brute_force_reference(min_tokens):
    rng = np.random.default_rng(min_tokens)
    fired = 0
    for vocab, toks in random_answers(rng, min_tokens, 300):
        prompt = rng.integers(0, vocab, int(rng.integers(0, 9))).tolist()  # never part of a loop
        want = find_loop(toks, min_tokens)
        assert guard_fires(prompt + toks, min_tokens, start=len(prompt)) == want, (toks, min_tokens)
        fired += want is not None
    assert 45 < fired < 255, fired  # both outcomes well covered


@pytest.mark.parametrize("min_tokens", [3, 8, 11])
def test_drop_matches_brute_force_reference(min_tokens):
    rng = np.random.default_rng(100 + min_tokens)
    dropped = several = 0
    for _, toks in random_answers(rng, min_tokens, 200, loops_each=3):  # loops after loops, with text between
        got = drop_loops(toks, min_tokens)
        assert got == drop_loops_reference(toks, min_tokens), (toks, min_tokens)
        drop = LoopDrop.over(toks, min_tokens)
        assert len(toks) - len(got) == drop.left_out
        keep = find_loop(toks, min_tokens)
        if keep is not None:  # the drop keeps what the stop keeps, then reads on
            assert got[:keep] == toks[:keep] and len(got) >= keep
            dropped += 1
            several += len(drop.spans) > 1
    assert 30 < dropped < 170 and several > 5, (dropped, several)


def test_drop_keeps_one_unit_and_reads_on():
    toks = [5, 6, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 7, 8]
    assert drop_loops(toks, 10) == [5, 6, 1, 2, 3, 7, 8]  # "1 2 3 1 2 3 1" after the first unit left out
    assert drop_loops(toks, 11) == toks


def test_guard_keeps_one_unit():
    toks = [5, 6, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    # periodic tail 1 2 3 1 2 3 1 2 3 1 (10 tokens, period 3) starts at index 2; one unit kept
    assert find_loop(toks, 10) == 5 and guard_fires(toks, 10) == 5
    assert find_loop(toks, 11) is None and guard_fires(toks, 11) is None
    assert find_loop([4] * 9, 9) == 1  # a repeated single token keeps one copy
    with pytest.raises(ValueError, match="min_tokens >= 3"):
        LoopGuard(2)


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    # tied embeddings: a random model then mostly repeats its last token, so greedy answers fall into loops
    ckpt = build_checkpoint(tmp_path_factory.mktemp("loop"), seed=6, tie=True, vision=False)
    return Engine.from_checkpoint(ckpt, max_num_seqs=8, num_blocks=256, block_size=16, max_model_len=200)


def test_engine_ends_looping_answers_only(eng):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 500, int(rng.integers(5, 30))).tolist() for _ in range(8)]
    max_tokens = [120, 8, 120, 120, 8, 120, 8, 120]  # 8 tokens cannot hold a loop of 9
    span = 9
    free = eng.generate([dict(prompt_token_ids=p, sampling=SamplingParams(max_tokens=m), ignore_eos=True)
                         for p, m in zip(prompts, max_tokens)])
    guarded = eng.generate([dict(prompt_token_ids=p, sampling=SamplingParams(max_tokens=m, loop_stop_tokens=span),
                                 ignore_eos=True) for p, m in zip(prompts, max_tokens)])
    loops = 0
    for f, g in zip(free, guarded):
        keep = find_loop(f.output_token_ids, span)
        if keep is None:
            assert g.output_token_ids == f.output_token_ids and g.finish_reason == f.finish_reason == "length"
        else:
            loops += 1
            assert g.finish_reason == "loop" and g.output_token_ids == f.output_token_ids[:keep]
            assert g.output_tokens == keep < f.output_tokens
    assert loops == 5, loops


def free_and_ruled(eng, **loop_rule):
    """Eight random prompts' answers of 100 tokens, free and with the loop rule given."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 500, int(rng.integers(5, 30))).tolist() for _ in range(8)]
    return [eng.generate([dict(prompt_token_ids=p, sampling=SamplingParams(max_tokens=100, **rule), ignore_eos=True)
                          for p in prompts]) for rule in ({}, loop_rule)]


def test_engine_drops_loops_and_reads_on(eng):
    span = 9
    free, dropped = free_and_ruled(eng, loop_drop_tokens=span)
    loops = 0
    for f, d in zip(free, dropped):
        assert d.output_token_ids == f.output_token_ids and d.finish_reason == f.finish_reason == "length"
        kept = drop_loops(f.output_token_ids, span)
        assert d.text == eng.processor.decode(kept) and d.loop_dropped_tokens == f.output_tokens - len(kept)
        loops += len(kept) < f.output_tokens
    assert loops >= 4, loops


def test_engine_bans_the_token_that_goes_on_with_a_loop(eng):
    span = 9
    free, banned = free_and_ruled(eng, loop_drop_tokens=span, loop_ban_next=True)
    changed = 0
    for f, b in zip(free, banned):
        drop = LoopDrop.over(b.output_token_ids, span)
        assert b.text == eng.processor.decode(drop.kept(b.output_token_ids))
        # a loop is seen at its min_tokens-th token, with at most min_tokens - 1 repeats; the next token was already
        # on its way, and the one after that is banned
        assert all(e - s <= span for s, e in drop.spans), drop.spans
        first = drop_loops(f.output_token_ids, span) != f.output_token_ids
        if first:  # the same answer up to two tokens past where the free answer's first loop was seen
            seen = next(n for n in range(1, f.output_tokens + 1) if find_loop(f.output_token_ids[:n], span))
            assert b.output_token_ids[:seen + 1] == f.output_token_ids[:seen + 1]
            assert b.output_token_ids[seen + 1] != f.output_token_ids[seen + 1]
            changed += 1
        else:
            assert b.output_token_ids == f.output_token_ids
    assert changed >= 4, changed


def test_engine_rejects_bad_loop_settings(eng):
    for sp in (SamplingParams(loop_stop_tokens=2), SamplingParams(loop_stop_tokens=8, num_beams=2),
               SamplingParams(loop_drop_tokens=2), SamplingParams(loop_drop_tokens=8, num_beams=2),
               SamplingParams(loop_stop_tokens=8, loop_drop_tokens=8), SamplingParams(loop_ban_next=True)):
        with pytest.raises(RequestRejected, match="loop_stop_tokens and loop_drop_tokens"):
            eng.add_request("bad", prompt_token_ids=[1, 2, 3], sampling=sp)
