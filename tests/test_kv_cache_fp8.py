"""kv_cache_dtype='fp8': attention K/V stored as E4M3 rows with a scale per (token, kv head), through prefill, plain
decode, speculative verify and beam search (tiny random checkpoints, CPU fp32 with the torch references)."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import numpy as np
import pytest
import torch

from engine.interface import SamplingParams
from engine.llm_engine import Engine
from engine.testing import write_random_drafter

REQS = [(40, 12), (9, 20), (70, 8)]  # (prompt tokens, max_tokens)


def requests(**extra):
    return [dict(prompt_token_ids=np.random.default_rng(i).integers(0, 500, n).tolist(), ignore_eos=True,
                 keep_logits=True, sampling=SamplingParams(max_tokens=m), **extra) for i, (n, m) in enumerate(REQS)]


def engine(ckpt, **opts):
    return Engine.from_checkpoint(ckpt, dtype="float32", max_num_seqs=3, num_blocks=64, block_size=8,
                                  max_num_batched_tokens=32, **opts)


@pytest.fixture(scope="module")
def bf16_kv(text_ckpt):
    return engine(text_ckpt).generate(requests())


def test_fp8_cache_layout_and_logits_near_full_precision(text_ckpt, bf16_kv):
    """The caches are E4M3 with fp32 scales, prefill (chunked: a 32-token budget) and decode read them, and the
    logits stay within FP8's rounding of the full-precision cache's (E4M3 keeps 3 mantissa bits: ~2 % a row) at
    every step up to and including the first where the greedy tokens part (a near-tie may flip)."""
    eng = engine(text_ckpt, kv_cache_dtype="fp8")
    runner = eng.runner
    assert runner.k_cache.dtype == torch.float8_e4m3fn and runner.kv_scales[0].dtype == torch.float32
    assert runner.kv_scales[0].shape == runner.k_cache.shape[:4]
    got = eng.generate(requests())
    assert (runner.kv_scales[0] != 1).any()  # the writers set the scales of the rows they stored
    for g, r in zip(got, bf16_kv):
        n = next((i for i, (x, y) in enumerate(zip(g.output_token_ids, r.output_token_ids)) if x != y),
                 len(r.output_token_ids) - 1)
        assert n >= 4  # parted no earlier than a near-tie could explain on this model
        for i in range(n + 1):
            rel = float((g.logits[i].float() - r.logits[i].float()).norm() / r.logits[i].float().norm())
            assert 0 < rel < 0.02, (i, rel)


def test_fp8_cache_speculative_greedy_equals_plain(text_ckpt, tmp_path):
    """Speculation stays lossless over an FP8 cache: the verify reads the same rows plain decoding would."""
    drafter = write_random_drafter(tmp_path / "d", text_ckpt, block_size=4, seed=5)
    plain = [o.output_token_ids for o in engine(text_ckpt, kv_cache_dtype="fp8").generate(requests())]
    spec_engine = engine(text_ckpt, kv_cache_dtype="fp8", speculative=dict(drafter=str(drafter)))
    spec = [o.output_token_ids for o in spec_engine.generate(requests())]
    assert spec == plain


def test_fp8_cache_copies_carry_rows_and_scales(text_ckpt):
    """A beam member continuing another's parent gets its KV blocks: over an FP8 cache the copy moves the E4M3 rows
    and their scales together (a block copied without its scales would be read at the destination's old scales);
    beam search over an FP8 cache runs."""
    eng = engine(text_ckpt, kv_cache_dtype="fp8")
    r = eng.runner
    gen = torch.Generator().manual_seed(0)
    r.k_cache.copy_(torch.randn(r.k_cache.shape, generator=gen).to(r.k_cache.dtype))
    for s in r.kv_scales:
        s.copy_(torch.rand(s.shape, generator=gen))
    before = [t.clone() for t in (r.k_cache, r.v_cache, *r.kv_scales)]
    src, dst = torch.tensor([5, 9]), torch.tensor([9, 2])  # a source may be a destination too
    none = torch.tensor([], dtype=torch.long)
    r.copy_caches(none, none, src, dst)
    for old, new in zip(before, (r.k_cache, r.v_cache, *r.kv_scales)):
        o, n = (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in (old, new))
        assert torch.equal(n[:, dst], o[:, src]) and torch.equal(n[:, 7], o[:, 7])
    sp = SamplingParams(max_tokens=6, num_beams=2)
    out = eng.generate([dict(r, sampling=sp, keep_logits=False) for r in requests()[:2]])
    assert all(len(o.output_token_ids) == 6 for o in out)


def test_unknown_kv_cache_dtype_refused_naming_the_option(text_ckpt):
    with pytest.raises(ValueError, match="kv_cache_dtype='int8'.*auto, fp8"):
        engine(text_ckpt, kv_cache_dtype="int8")
