"""Sampling with speculation is lossless in the engine: requests sampled at temperature 1 through the speculative
path (drafts drawn from a random DFlash drafter, verified by rejection sampling in engine/spec_sampling) come out
distributed as plain sampling's. The rejection rule itself is tested in test_spec_sampling; this is the engine
around it: the drafter's draws and distributions, the target's, the noise per request, the emitted tokens.

The target has a 6-token vocabulary and an untied head whose logits are O(1), so every token has a fair share of
each next-token distribution and a chi-square test over a few hundred sequences sees a drafter's bias. (Tied to the
embedding, the head makes the drafter, whose block rows enter as the mask token's embedding, put most of its mass on
the mask token, where drafting its top token or a draw from it differs little.)"""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)

import numpy as np
import pytest
import torch
from test_spec_sampling import chi2_critical

from engine.checkpoint import expected_tensors
from engine.config import ModelConfig, parse_text_config
from engine.interface import SamplingParams
from engine.llm_engine import Engine, EngineOptions
from engine.speculative import SpecDecoder
from engine.testing import TINY_TEXT, random_tensor, write_random_drafter

V, BLOCK, N = 6, 4, 800
PROMPT = [1, 3, 2, 5, 0, 4]
MAX_TOKENS = BLOCK + 1  # a sequence's first verify step holds a whole block: drafts at output positions 1 .. 3
# output positions compared alone and in adjacent pairs (position 0 is the prefill's draw, the same path in both)
COMPARED = [(k,) for k in range(1, MAX_TOKENS)] + [(k, k + 1) for k in range(MAX_TOKENS - 1)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Every op here is tiny: on a small shared CPU a second OpenMP thread per op costs more than it gives (a run
    of these tests took 50x longer with two threads on two busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target():
    """One GDN and one attention layer (the verify path needs both), random weights, built in memory."""
    text = parse_text_config(dict(TINY_TEXT, vocab_size=V, num_hidden_layers=2, tie_word_embeddings=False,
                                  layer_types=["linear_attention", "full_attention"]))
    cfg = ModelConfig(model_type="qwen3_5_text", text=text)
    gen = torch.Generator().manual_seed(0)
    return cfg, {n: random_tensor(n, s, torch.float32, gen) for n, s in expected_tensors(cfg, True).items()}


@pytest.fixture(scope="module", params=["dflash", "dflash2"])
def drafter(target, tmp_path_factory, request):
    """A random DFlash drafter, and a DFlash2 one (its sampled drafts drawn over the selector's candidates)."""
    return write_random_drafter(tmp_path_factory.mktemp("drafter"), target[0].text, block_size=BLOCK, num_taps=1,
                                seed=3, dflash2=request.param == "dflash2")


def engine(target, drafter=None) -> Engine:
    cfg, weights = target
    return Engine(cfg, weights.items(), "cpu", "float32", expected=expected_tensors(cfg, True),
                  options=EngineOptions(max_num_seqs=128, num_blocks=400, block_size=8,
                                        speculative=dict(drafter=drafter, max_batch=None)))


def sample(eng: Engine, seeds) -> list:
    return eng.generate([dict(prompt_token_ids=PROMPT, ignore_eos=True,
                              sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=s))
                         for s in seeds])


def tokens(outs) -> torch.Tensor:
    return torch.tensor([o.output_token_ids for o in outs])


@pytest.fixture(scope="module")
def plain(target):
    """Plain sampling's outputs [N, MAX_TOKENS]. Seeds apart from the speculative runs': a shared seed gives both
    the same prefill draw, and correlated samples would make the test's chi-square reference wrong."""
    return tokens(sample(engine(target), range(10**6, 10**6 + N)))


def two_sample_chi2(a: torch.Tensor, b: torch.Tensor, cells: int) -> tuple[float, int]:
    """Chi-square of homogeneity of two equally sized samples of cell ids, and its degrees of freedom (the cells
    either sample reached, less one)."""
    ca, cb = (torch.bincount(x, minlength=cells).double() for x in (a, b))
    seen = ca + cb > 0
    return float(((ca - cb)[seen] ** 2 / (ca + cb)[seen]).sum()), int(seen.sum()) - 1


def check_ratios(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Each compared position (or pair) -> its chi-square over the one-sided 1e-4 critical value (> 1 fails)."""
    ratios = {}
    for ks in COMPARED:
        ids_a, ids_b = (sum(x[:, k] * V ** i for i, k in enumerate(ks)) for x in (a, b))
        stat, df = two_sample_chi2(ids_a, ids_b, V ** len(ks))
        ratios[ks] = round(stat / chi2_critical(df), 3)
    return ratios


@pytest.mark.timeout(120)
def test_sampled_speculation_matches_plain_sampling(target, drafter, plain):
    """N sequences each way; output positions 1-4 alone and in adjacent pairs, each two-sample chi-square below
    its one-sided 1e-4 critical value (at N = 800 they reach about half of it; drafting the drafter's top token
    instead of a draw puts them at 2.7x with the DFlash2 drafter, 10x with the DFlash one)."""
    outs = sample(engine(target, str(drafter)), range(N))
    drafted = np.sum([o.spec.drafted_by_pos for o in outs], 0)
    accepted = np.sum([o.spec.accepted_by_pos for o in outs], 0)
    # drafts accepted and rejected at every block position: accepted runs, residual draws and bonus draws all ran
    assert len(drafted) == BLOCK - 1 and (0 < accepted).all() and (accepted < drafted).all(), (accepted, drafted)
    ratios = check_ratios(plain, tokens(outs))
    assert max(ratios.values()) < 1, ratios


@pytest.mark.timeout(120)
def test_the_check_catches_drafts_taken_as_the_drafters_top_token(target, drafter, plain, monkeypatch):
    """Sampled rows given the drafter's top token instead of a draw from its distribution (still verified against
    that distribution) no longer come out as the target's samples: the same check must fail."""
    propose = SpecDecoder.propose

    def top_token(self, *args):
        # unit noise turns the exponential race argmax(q / E) into argmax(q), in propose and the DFlash2 selector
        self._exp_noise = lambda seq, shape: torch.ones(tuple(shape), device=seq.generator.device)
        try:
            return propose(self, *args)
        finally:
            del self._exp_noise  # the acceptance's own noise stays random

    monkeypatch.setattr(SpecDecoder, "propose", top_token)
    ratios = check_ratios(plain, tokens(sample(engine(target, str(drafter)), range(N))))
    assert max(ratios.values()) > 1, ratios
