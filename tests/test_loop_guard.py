"""engine/loop_guard.py: the incremental guard against its brute-force reference, and the engine ending looping
answers with it (finish_reason "loop", one copy of the unit kept) while leaving every other answer as it was."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import numpy as np
import pytest

from engine.interface import SamplingParams
from engine.llm_engine import Engine, RequestRejected
from engine.loop_guard import LoopGuard, find_loop
from engine.testing import build_checkpoint


def guard_fires(tokens, min_tokens, start=0):
    guard = LoopGuard(min_tokens)
    for end in range(start + 1, len(tokens) + 1):
        keep = guard.push(tokens, start, end)
        if keep is not None:
            return keep
    return None


@pytest.mark.parametrize("min_tokens", [3, 7, 10, 13])
def test_guard_matches_brute_force_reference(min_tokens):
    rng = np.random.default_rng(min_tokens)
    fired = 0
    for trial in range(300):
        # small vocabularies and spliced repeats make loops of every period, and near-loops that must not fire
        vocab = int(rng.integers(2, 6))
        toks = rng.integers(0, vocab, int(rng.integers(1, 40))).tolist()
        if trial % 2:
            unit = rng.integers(0, vocab, int(rng.integers(1, min_tokens // 3 + 2))).tolist()
            reps = -(-int(rng.integers(1, 2 * min_tokens)) // len(unit))  # spans below and above min_tokens
            toks += unit * reps + rng.integers(0, vocab, int(rng.integers(0, 5))).tolist()
        prompt = rng.integers(0, vocab, int(rng.integers(0, 9))).tolist()  # never part of a loop
        want = find_loop(toks, min_tokens)
        assert guard_fires(prompt + toks, min_tokens, start=len(prompt)) == want, (toks, min_tokens)
        fired += want is not None
    assert 45 < fired < 255, fired  # both outcomes well covered


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


def test_engine_rejects_bad_loop_settings(eng):
    for sp in (SamplingParams(loop_stop_tokens=2), SamplingParams(loop_stop_tokens=8, num_beams=2)):
        with pytest.raises(RequestRejected, match="loop_stop_tokens"):
            eng.add_request("bad", prompt_token_ids=[1, 2, 3], sampling=sp)
