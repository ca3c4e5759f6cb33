"""Beam search in the native engine vs transformers' generate(num_beams=k, early_stopping=True) (torch path, fp32,
CPU): the same best sequence, token for token, for text-only and VL requests, batched with greedy requests, with the
prompt prefilled in chunks, and after preemption. Each engine gets two extra stop tokens taken from a greedy run, so
beams do finish early (a random model rarely says <|im_end|>) and both ways a search ends are covered."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import numpy as np
import pytest
import torch

from engine.beam_search import BeamChoice
from engine.block_manager import blocks_for
from engine.checkpoint import inspect_checkpoint, iter_checkpoint_tensors
from engine.interface import SamplingParams
from engine.llm_engine import Engine, EngineOptions
from engine.processor import Processor
from engine.testing import tokenizer_texts

MAX_NEW = 14


def engine(path, stop_token_ids=(), **options) -> Engine:
    info = inspect_checkpoint(path)
    return Engine(info.config, iter_checkpoint_tensors(info), dtype="float32", stop_token_ids=stop_token_ids,
                  processor=Processor(path, info.config), options=EngineOptions(**options))


def stops_from_greedy(path, **request) -> list[int]:
    """Two stop tokens from a greedy reading: its own third token, and the runner-up of its first step. The best
    beam then ends early on some prompts, and other beams hold finished candidates while they run on."""
    out = engine(path, max_num_seqs=2, num_blocks=64, block_size=16).generate(
        [dict(request, sampling=SamplingParams(max_tokens=4), keep_logits=True)])[0]
    ranked = out.logits.argsort(dim=-1, descending=True)
    picks = sorted({int(ranked[2, 0]), int(ranked[0, 1])})
    assert len(picks) == 2, picks
    return picks


def hf_generate(path, vl: bool, ids, stop_ids, num_beams: int, max_new=MAX_NEW, pixel_values=None, grids=None,
                image_token_id=None) -> list[int]:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    model = (Qwen3_5ForConditionalGeneration if vl else Qwen3_5ForCausalLM).from_pretrained(
        path, dtype=torch.float32).eval()
    kw = {}
    if pixel_values is not None:
        kw = dict(pixel_values=torch.as_tensor(pixel_values), image_grid_thw=torch.tensor(grids),
                  mm_token_type_ids=(torch.tensor([ids]) == image_token_id).int())
    out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new, do_sample=False, num_beams=num_beams, early_stopping=num_beams > 1,
                         eos_token_id=sorted(stop_ids), pad_token_id=min(stop_ids, default=1), **kw)
    return out[0, len(ids):].tolist()


def words(n: int, seed: int) -> str:
    text = tokenizer_texts()[seed % 50].split()
    return " ".join((text * (n // max(len(text), 1) + 1))[:n])


# [3, 3, 3]: the three requests are selected together (one select_beams call, one cache copy) though their prompts
# and so the blocks each copies differ; [2, 3, 4]: one selection per width
@pytest.mark.parametrize("beams", [[2, 3, 4], [3, 3, 3]])
def test_text_beams_and_greedy_batched_match_transformers(text_ckpt, beams):
    tok = Processor(text_ckpt, inspect_checkpoint(text_ckpt).config).tokenizer
    prompts = [tok.encode(words(n, s)).ids for n, s in ((5, 1), (90, 2), (30, 3))]
    eng = engine(text_ckpt, stops_from_greedy(text_ckpt, prompt_token_ids=prompts[0]), max_num_seqs=12, num_blocks=96,
                 block_size=16)
    reqs = [dict(prompt_token_ids=p, sampling=SamplingParams(max_tokens=MAX_NEW, num_beams=k))
            for p, k in zip(prompts, beams)]
    reqs.append(dict(prompt_token_ids=prompts[1], sampling=SamplingParams(max_tokens=MAX_NEW)))  # greedy beside
    outs = eng.generate(reqs)
    assert {o.finish_reason for o in outs[:3]} == {"stop", "length"}, [o.output_token_ids for o in outs]
    for o, k in zip(outs, beams + [1]):
        ref = hf_generate(text_ckpt, False, o.prompt_token_ids, eng.stop_token_ids, k)
        assert o.output_token_ids == ref, (k, o.output_token_ids, ref)
    assert eng.block_manager.num_free == eng.block_manager.num_blocks  # every member's blocks came back
    assert eng.scheduler.states.num_free == 12


def test_vl_beams_with_chunked_prefill_match_transformers(vl_ckpt):
    img = np.random.default_rng(5).integers(0, 256, (250, 200, 3), dtype=np.uint8)
    page = dict(prompt="Convert this page.", image=img)
    # a 40-token budget prefills the page's prompt over several steps (chunks cut the image span)
    eng = engine(vl_ckpt, stops_from_greedy(vl_ckpt, **page), max_num_seqs=5, num_blocks=128, block_size=16,
                 max_num_batched_tokens=40)
    out = eng.generate([dict(page, sampling=SamplingParams(max_tokens=MAX_NEW, num_beams=3))])[0]
    ids, pv, grids = eng.processor.page_inputs(img, page["prompt"])
    assert out.prompt_token_ids == ids and len(ids) > 40
    ref = hf_generate(vl_ckpt, True, ids, eng.stop_token_ids, 3, pixel_values=pv, grids=grids,
                      image_token_id=eng.cfg.image_token_id)
    assert out.output_token_ids == ref


def test_beam_request_preempted_restarts_and_matches(text_ckpt):
    # 20 blocks of 8 tokens: all three requests are admitted (3 x 3 + 2 + 3 x 2 = 17 blocks for the prompts), but
    # growing by 24 tokens each does not fit (3 x 6 + 5 + 3 x 5 = 38), so decode preempts whole beam requests
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 500, n).tolist() for n in (17, 14)]
    eng = engine(text_ckpt, max_num_seqs=7, num_blocks=20, block_size=8)
    sp = SamplingParams(max_tokens=24, num_beams=3)
    outs = eng.generate([dict(prompt_token_ids=prompts[0], sampling=sp, ignore_eos=True),
                         dict(prompt_token_ids=prompts[1], sampling=SamplingParams(max_tokens=24), ignore_eos=True),
                         dict(prompt_token_ids=prompts[1], sampling=sp, ignore_eos=True)])
    assert [o.finish_reason for o in outs] == ["length"] * 3
    assert sum(o.num_preemptions for o in outs) > 0
    for o, k in zip(outs, (3, 1, 3)):
        assert o.output_token_ids == hf_generate(text_ckpt, False, o.prompt_token_ids, [], k, max_new=24)


@pytest.mark.parametrize("triton", [False, True], ids=["torch", "triton"])
def test_members_get_their_parents_caches(text_ckpt, monkeypatch, triton):
    """The cache copy of one step, checked directly (random tiny checkpoints barely use attention, so a wrong KV
    block would hardly change their tokens): two requests selected together, with prompts that end in different
    blocks, their caches marked with each block's and slot's own number; after the copy each member holds what the
    parent it was given held, in every block written since the prompt's last full one. `triton`: the copy by the
    GPU's kernel (kernels/copy_rows, interpreted), which leaves the members that continue themselves alone."""
    rng = np.random.default_rng(2)
    eng = engine(text_ckpt, max_num_seqs=6, num_blocks=40, block_size=8)
    sp = SamplingParams(max_tokens=30, num_beams=3)
    for i, n in enumerate((13, 22)):
        eng.add_request(f"r{i}", prompt_token_ids=rng.integers(0, 500, n).tolist(), sampling=sp, ignore_eos=True)
    for _ in range(12):  # prefill, fork, decode past a block boundary
        eng.step()
    groups = list(dict.fromkeys(s.beam for s in eng.scheduler.running))
    assert len(groups) == 2 and all(g.forked for g in groups) and len({g.shape_key() for g in groups}) == 1
    run = eng.runner
    for cache in (run.k_cache, run.v_cache):
        cache.copy_(torch.arange(cache.shape[1], dtype=cache.dtype).view(1, -1, *[1] * (cache.dim() - 2)))
    for cache in (run.conv_state, run.ssm_state):
        cache.copy_(torch.arange(cache.shape[1], dtype=cache.dtype).view(1, -1, *[1] * (cache.dim() - 2)))
    parents = torch.tensor([[2, 0, 0], [1, 1, 2]])
    choice = BeamChoice(parents, parents, parents, parents, parents.float(), parents > 9, 3)
    if triton:
        monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    eng.beams.copy_to_members([(groups, choice)])
    checked = 0
    for g, row in zip(groups, parents.tolist()):
        first = g.leader.prompt_len // 8
        for m, p in zip(g.members, row):
            parent = g.members[p]
            assert run.ssm_state[:, m.state_slot].eq(parent.state_slot).all()
            assert run.conv_state[:, m.state_slot].eq(parent.state_slot).all()
            for b in range(first, blocks_for(g.leader.num_computed, 8)):
                assert run.k_cache[:, m.block_table[b]].eq(parent.block_table[b]).all()
                assert run.v_cache[:, m.block_table[b]].eq(parent.block_table[b]).all()
                checked += 1
    assert checked >= 6 * 2


@pytest.mark.parametrize("sampling, why", [
    (SamplingParams(num_beams=0), "bad sampling"),
    (SamplingParams(num_beams=2, temperature=0.7), "temperature 0"),
    (SamplingParams(num_beams=9), "num_beams <= max_num_seqs"),
])
def test_bad_beam_requests_are_rejected(text_ckpt, sampling, why):
    eng = engine(text_ckpt, max_num_seqs=8, num_blocks=64, block_size=16)
    out = eng.generate([dict(prompt_token_ids=[5, 6, 7], sampling=sampling)])[0]
    assert out.finish_reason == "error" and why in out.error
