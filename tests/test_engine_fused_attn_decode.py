"""DecodeTuning(fused_attention_decode=True), the default: decode steps whose attention inputs come from
kernels/fused_attn_decode give the same greedy tokens (and logits within the exactness tolerance) as transformers and
as the per-op path; with every kernel forced to Triton (interpreter) and with decode batches padded as for CUDA
graphs, so padding rows go through the fused kernel. Also the decode step's kernel counts."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import pytest
import torch

from engine.interface import SamplingParams
from engine.llm_engine import Engine
from engine.options import DecodeTuning
from engine.model_runner import graph_batch_sizes
from engine.testing import build_checkpoint

LOGITS_ATOL = 2e-4  # as tests/test_engine_exactness.py
MAX_NEW = 6


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("txt"), vision=False, tie=True, seed=11)


def requests():
    # short prompts (prefill is not what is tested here); ids avoid the special tokens
    return [dict(prompt_token_ids=[(7 * i + 3 * n) % 500 + 5 for i in range(n)], keep_logits=True, ignore_eos=True,
                 sampling=SamplingParams(max_tokens=MAX_NEW)) for n in (9, 30, 23)]


def run(ckpt, fused: bool, padded: bool):
    eng = Engine.from_checkpoint(ckpt, dtype="float32", max_num_seqs=4, num_blocks=48, block_size=16,
                                 tuning=DecodeTuning(fused_attention_decode=fused))
    if padded:
        eng.runner.decode_sizes = graph_batch_sizes(4)  # 3 sequences decode as a batch of 4: one padding row
    return eng.generate(requests())


def hf_greedy(model, ids):
    out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=[], output_logits=True,
                         return_dict_in_generate=True)
    return out.sequences[0, len(ids):].tolist(), torch.stack([x[0] for x in out.logits])


def test_fused_attention_decode_on_triton_matches_transformers_and_unfused(ckpt, monkeypatch):
    import kernels.fused_attn_decode as fa

    kernels.testing.require_interpreted(fa._fused_attn_inputs_kernel)
    unfused = run(ckpt, fused=False, padded=False)  # reference ops (CPU default)
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    calls = []
    fn = fa.fused_attn_decode_inputs_triton
    monkeypatch.setattr(fa, "fused_attn_decode_inputs_triton", lambda *a, **k: (calls.append(1), fn(*a, **k))[1])
    fused = run(ckpt, fused=True, padded=True)
    # every decode step (MAX_NEW - 1 of them) went through the fused kernel, once per attention layer
    assert len(calls) == 1 * (MAX_NEW - 1)  # 1 attention layer in the tiny config
    from transformers import Qwen3_5ForCausalLM

    hf = Qwen3_5ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    for f, u in zip(fused, unfused):
        assert f.output_token_ids == u.output_token_ids
        torch.testing.assert_close(f.logits, u.logits, atol=LOGITS_ATOL, rtol=0)
        tokens, logits = hf_greedy(hf, f.prompt_token_ids)
        assert f.output_token_ids == tokens
        torch.testing.assert_close(f.logits, logits, atol=LOGITS_ATOL, rtol=0)


def test_fused_attention_decode_reference_path_matches_unfused(ckpt):
    """On CPU without forcing Triton the fused ops run their torch references: same tokens as the default path."""
    unfused = run(ckpt, fused=False, padded=True)
    fused = run(ckpt, fused=True, padded=True)
    for f, u in zip(fused, unfused):
        assert f.output_token_ids == u.output_token_ids
        torch.testing.assert_close(f.logits, u.logits, atol=1e-5, rtol=0)


def test_kernel_count_script():
    """bench/decode_kernel_count.py on a 4-layer stack (3 GDN + 1 attention). Default path: a GDN layer is 9
    kernels: its 4 projections (kernels/small_m_linear; gate_up applies the SwiGLU), two RMSNorms, conv, recurrence
    (the gates computed inside it) and gated norm; the attention inputs are one fused kernel (q/k norm, rotary, KV
    store). Without that kernel only the attention layers change."""
    import os

    from bench import decode_kernel_count

    r = decode_kernel_count.main(["--layers", "4", "--variants", "default,unfused_attn"])
    assert "OCRIA_FORCE_TRITON" not in os.environ
    d, u = r["default"], r["unfused_attn"]
    assert d["linear_attention"]["layers"] == 3 and d["full_attention"]["layers"] == 1
    assert d["linear_attention"]["per_layer"] == {
        "triton _small_m_linear_kernel": 4, "triton _conv1d_update_kernel": 1, "triton _gdn_recurrent_kernel": 1,
        "triton _gated_rmsnorm_kernel": 1, "triton _rmsnorm_kernel": 2}
    assert d["full_attention"]["per_layer"]["triton _small_m_linear_kernel"] == 4
    assert d["full_attention"]["per_layer"]["triton _fused_attn_inputs_kernel"] == 1
    assert "triton _store_kvcache_kernel" not in d["full_attention"]["per_layer"]
    assert u["linear_attention"] == d["linear_attention"]
    assert "triton _fused_attn_inputs_kernel" not in u["full_attention"]["per_layer"]
    assert "triton _store_kvcache_kernel" in u["full_attention"]["per_layer"]


def test_kernel_count_script_speculative_step():
    """--spec: one greedy speculative step on a 4-layer stack (3 GDN + 1 attention), block 4. The verify pass's GDN
    layer is 8 kernels (4 projections, two RMSNorms, conv verify keeping the block's inputs, GDN verify, gated norm);
    the commit is one ring advance (no GDN state is written) and one conv launch for all layers; the drafter's 4
    layers run fused projections and compiled glue."""
    from bench import decode_kernel_count

    r = decode_kernel_count.main(["--layers", "4", "--variants", "default", "--spec", "4"])["default"]
    gdn = dict(r["linear_attention"]["per_layer"])
    gdn.pop("torch add")  # the residual add that forms a tapped layer's output (the drafter's context), 1 of 3 layers
    assert gdn == {"triton _small_m_linear_kernel": 4, "triton _conv_verify_kernel": 1, "triton _gdn_verify_kernel": 1,
                   "triton _gated_rmsnorm_kernel": 1, "triton _rmsnorm_kernel": 2}
    commit = r["commit"]["per_layer"]
    assert commit["triton _ring_advance_kernel"] == 1 and commit["triton _conv_commit_kernel"] == 1
    assert r["commit"]["total"] == 6
    # the draft pass: per layer one norm, qkv GEMM, q/k norm + rotary, KV store, attention (2), o_proj, norm,
    # gate_up, SwiGLU, down; then the head (a GEMV of 4 x 3 rows), block set-up and argmax
    draft = r["draft"]["per_layer"]
    assert draft["inductor qkv_heads"] == 4 and draft["triton _silu_mul_kernel"] == 4 and draft["gemm (mm)"] == 16
    assert r["draft"]["total"] == 53 and r["drafter context"]["total"] == 16


def test_fused_attention_decode_only(ckpt, monkeypatch):
    """DecodeTuning(fused_attention_decode=True), the default: the attention layers decode through their fused
    kernel, the GDN layers keep the per-op path; greedy outputs as the fully unfused path's."""
    unfused = run(ckpt, fused=False, padded=False)
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    import kernels.fused_attn_decode as fa
    import kernels.gdn_recurrent as gr

    calls = []
    for mod, name in ((fa, "fused_attn_decode_inputs_triton"), (gr, "gdn_recurrent_triton")):
        fn = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _fn=fn, _n=name, **k: (calls.append(_n), _fn(*a, **k))[1])
    eng = Engine.from_checkpoint(ckpt, dtype="float32", max_num_seqs=4, num_blocks=48, block_size=16,
                                 tuning=DecodeTuning(fused_attention_decode=True))
    outs = eng.generate(requests())
    assert set(calls) == {"fused_attn_decode_inputs_triton", "gdn_recurrent_triton"}
    for a, b in zip(outs, unfused):
        assert a.output_token_ids == b.output_token_ids
        torch.testing.assert_close(a.logits, b.logits, atol=LOGITS_ATOL, rtol=0)
