"""Native engine vs transformers (torch path, fp32, CPU): greedy tokens identical, logits within LOGITS_ATOL.

Covers text-only (qwen3_5_text, tied head) and VL (qwen3_5, untied) checkpoints, prompts shorter and longer than
the 64-token GDN chunk, batches of mixed lengths, chunked prefill (chunks splitting image spans), requests arriving
mid-decode, and preemption with recompute.
"""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import numpy as np
import torch

from engine.interface import SamplingParams
from engine.llm_engine import Engine
from engine.testing import tokenizer_texts

# Per-step logits of the engine vs transformers' generate(); measured max |diff| is ~2e-5 on these models.
LOGITS_ATOL = 2e-4
MAX_NEW = 24


def hf_model(path, vl):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    cls = Qwen3_5ForConditionalGeneration if vl else Qwen3_5ForCausalLM
    return cls.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(model, ids, stop_ids, pixel_values=None, grids=None, image_token_id=None, max_new=MAX_NEW):
    kw = {}
    if pixel_values is not None:
        kw = dict(pixel_values=torch.as_tensor(pixel_values), image_grid_thw=torch.tensor(grids),
                  mm_token_type_ids=(torch.tensor([ids]) == image_token_id).int())
    out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new, do_sample=False, eos_token_id=sorted(stop_ids),
                         output_logits=True, return_dict_in_generate=True, **kw)
    return out.sequences[0, len(ids):].tolist(), torch.stack([x[0] for x in out.logits])


def check_same(engine_out, ref):
    ref_tokens, ref_logits = ref
    assert engine_out.output_token_ids == ref_tokens
    assert engine_out.logits.shape == ref_logits.shape
    torch.testing.assert_close(engine_out.logits, ref_logits, atol=LOGITS_ATOL, rtol=0)


def text_prompt(eng, n_words, seed):
    words = tokenizer_texts()[seed % 50].split()
    words = (words * (n_words // max(len(words), 1) + 1))[:n_words]
    return " ".join(words)


def image(h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_text_only_batch_matches_transformers(text_ckpt):
    eng = Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=4, num_blocks=64, block_size=16)
    assert eng.text_only
    prompts = [text_prompt(eng, 5, 1), text_prompt(eng, 120, 2), text_prompt(eng, 40, 3)]
    reqs = [dict(prompt=p, sampling=SamplingParams(max_tokens=MAX_NEW), keep_logits=True) for p in prompts]
    outs = eng.generate(reqs)
    lens = [o.prompt_tokens for o in outs]
    assert min(lens) < 64 < max(lens), lens
    hf = hf_model(text_ckpt, vl=False)
    for o in outs:
        check_same(o, hf_greedy(hf, o.prompt_token_ids, eng.stop_token_ids))


def test_vl_batch_matches_transformers(vl_ckpt):
    eng = Engine.from_checkpoint(vl_ckpt, dtype="float32", max_num_seqs=4, num_blocks=96, block_size=16)
    cases = [(image(40, 50, 1), "Convert this page to markdown."),  # short prompt, 4 image tokens
             (image(250, 200, 2), "Read it."),  # 56 image tokens: > 64 total
             (None, text_prompt(eng, 30, 4)),
             (image(120, 300, 3), text_prompt(eng, 60, 5))]
    outs = eng.generate([dict(prompt=p, image=im, sampling=SamplingParams(max_tokens=MAX_NEW), keep_logits=True)
                         for im, p in cases])
    lens = [o.prompt_tokens for o in outs]
    assert min(lens) < 64 < max(lens), lens
    hf = hf_model(vl_ckpt, vl=True)
    for (im, p), o in zip(cases, outs):
        ids, pv, grids = eng.processor.page_inputs(im, p)
        assert ids == o.prompt_token_ids
        check_same(o, hf_greedy(hf, ids, eng.stop_token_ids, pv, grids, eng.cfg.image_token_id))


def test_chunked_prefill_and_arrivals_mid_decode(vl_ckpt):
    # 40-token budget: long prompts are prefilled over several steps and chunks cut image spans.
    eng = Engine.from_checkpoint(vl_ckpt, dtype="float32", max_num_seqs=3, num_blocks=96, block_size=16,
                                 max_num_batched_tokens=40)
    cases = {"a": (image(250, 200, 7), "Convert this page."), "b": (None, text_prompt(eng, 70, 8)),
             "c": (image(64, 96, 9), "x"), "d": (image(100, 100, 10), "Read.")}
    sp = SamplingParams(max_tokens=MAX_NEW)
    eng.add_request("a", prompt=cases["a"][1], image=cases["a"][0], sampling=sp, keep_logits=True)
    outs, steps, prefill_steps = {}, 0, 0
    while eng.has_unfinished() or len(outs) < len(cases):
        if steps == 6:
            eng.add_request("b", prompt=cases["b"][1], sampling=sp, keep_logits=True)
        if steps == 9:
            eng.add_request("c", prompt=cases["c"][1], image=cases["c"][0], sampling=sp, keep_logits=True)
            eng.add_request("d", prompt=cases["d"][1], image=cases["d"][0], sampling=sp, keep_logits=True)
        decoding_before = sum(s.num_output > 0 for s in eng.scheduler.running)
        for o in eng.step():
            outs[o.request_id] = o
        steps += 1
        prefill_steps += decoding_before > 0 and steps in (7, 10)
    assert prefill_steps == 2  # b, c, d were prefilled while others were mid-decode
    hf = hf_model(vl_ckpt, vl=True)
    for rid, (im, p) in cases.items():
        ids, pv, grids = eng.processor.page_inputs(im, p)
        check_same(outs[rid], hf_greedy(hf, ids, eng.stop_token_ids, pv, grids, eng.cfg.image_token_id))


def test_preemption_recompute_keeps_outputs(text_ckpt):
    # 10 blocks of 8 tokens; 3 prompts fit (2-3 blocks each) but growing by 24 tokens each does not: decode must
    # preempt and recompute.
    eng = Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=3, num_blocks=10, block_size=8)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 500, n).tolist() for n in (14, 11, 16)]
    outs = eng.generate([dict(prompt_token_ids=p, sampling=SamplingParams(max_tokens=MAX_NEW), ignore_eos=True)
                         for p in prompts])
    assert sum(o.num_preemptions for o in outs) > 0
    hf = hf_model(text_ckpt, vl=False)
    for o in outs:
        ref, _ = hf_greedy(hf, o.prompt_token_ids, [], max_new=MAX_NEW)
        assert o.output_token_ids == ref


def test_kept_logits_survive_the_next_step_overwriting_the_decode_output(text_ckpt):
    """A decode step's logits may live in a buffer the next step overwrites (a CUDA graph's static output; fp32
    models return it without a copy), and the next step is launched before the previous one is collected: the
    logits a request keeps must still be each step's own. The runner is made to hand out one reused buffer."""
    prompts = [text_prompt(None, 7, 4), text_prompt(None, 30, 5)]
    reqs = [dict(prompt=p, sampling=SamplingParams(max_tokens=12), keep_logits=True) for p in prompts]
    want = Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=4, num_blocks=64,
                                  block_size=16).generate(reqs)
    eng = Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=4, num_blocks=64, block_size=16)
    run_decode, static = eng.runner.run_decode, {}

    def graph_like(*args, **kw):
        logits = run_decode(*args, **kw)
        buf = static.setdefault(logits.shape, torch.empty_like(logits))
        return buf.copy_(logits)  # the same storage every step, as graph replays give

    eng.runner.run_decode = graph_like
    got = eng.generate(reqs)
    assert static, "no decode step went through the reused buffer: the test did not test anything"
    for g, w in zip(got, want):
        assert g.output_token_ids == w.output_token_ids
        torch.testing.assert_close(g.logits, w.logits, atol=0, rtol=0)
