"""The engine's GPU code path on CPU: every kernel forced to its Triton version (run by the Triton interpreter),
greedy tokens and logits still match transformers."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import numpy as np
import pytest
import torch

from engine import ops
from engine.interface import SamplingParams
from engine.llm_engine import Engine
from engine.options import DEFAULT_TUNING, DecodeTuning
from engine.testing import build_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("vl"), seed=8)


@pytest.mark.parametrize("tuning", [DEFAULT_TUNING, DecodeTuning(swiglu_epilogue=False)],
                         ids=["default", "swiglu_unfused"])
def test_triton_kernels_in_engine_match_transformers(ckpt, monkeypatch, tuning):
    """Default decode path (GEMVs on kernels/small_m_linear, SwiGLU applied by the gate_up GEMV) and the plain GEMVs
    with SwiGLU as its own kernel."""
    from transformers import Qwen3_5ForConditionalGeneration

    from kernels.rmsnorm import _rmsnorm_kernel

    kernels.testing.require_interpreted(_rmsnorm_kernel)
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    import kernels.small_m_linear as sml

    calls = []
    for name in ("small_m_linear_triton", "linear_silu_mul_triton"):
        fn = getattr(sml, name)
        monkeypatch.setattr(sml, name, lambda *a, _fn=fn, _n=name, **k: (calls.append(_n), _fn(*a, **k))[1])
    eng = Engine.from_checkpoint(ckpt, dtype="float32", max_num_seqs=2, num_blocks=32, block_size=16, tuning=tuning)
    img = np.random.default_rng(0).integers(0, 256, (70, 90, 3), dtype=np.uint8)
    sp = SamplingParams(max_tokens=5)
    outs = eng.generate([dict(prompt="Read.", image=img, sampling=sp, keep_logits=True, ignore_eos=True),
                         dict(prompt_token_ids=list(range(5, 75)), sampling=sp, keep_logits=True, ignore_eos=True)])
    hf = Qwen3_5ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    for o, image in zip(outs, [img, None]):
        kw = {}
        if image is not None:
            _, pv, grids = eng.processor.page_inputs(image, "Read.")
            kw = dict(pixel_values=torch.as_tensor(pv), image_grid_thw=torch.tensor(grids),
                      mm_token_type_ids=(torch.tensor([o.prompt_token_ids]) == eng.cfg.image_token_id).int())
        ref = hf.generate(input_ids=torch.tensor([o.prompt_token_ids]), max_new_tokens=5, do_sample=False,
                          eos_token_id=[], output_logits=True, return_dict_in_generate=True,
                          attention_mask=torch.ones(1, o.prompt_tokens, dtype=torch.long), **kw)
        assert o.output_token_ids == ref.sequences[0, o.prompt_tokens:].tolist()
        torch.testing.assert_close(o.logits, torch.stack([x[0] for x in ref.logits]), atol=2e-4, rtol=0)
    called = set(calls)
    assert "small_m_linear_triton" in called  # decode projections went through the GEMV
    assert ("linear_silu_mul_triton" in called) == tuning.swiglu_epilogue, sorted(called)


def test_decode_pdl_reaches_every_decode_kernel(ckpt, monkeypatch):
    """DecodeTuning(pdl=True), the default, on a GPU launches every decode kernel with programmatic dependent launch. The
    interpreter has no griddepcontrol, so each Triton launcher is wrapped here by a recorder of its pdl flag that
    runs the Triton kernel without PDL, and the model runner is told that the device has PDL. Its tokens are then
    those of the Triton path, compared with the torch references' (OCRIA_FORCE_TRITON off)."""
    import kernels.conv1d_update as conv
    import kernels.fused_attn_decode as fa
    import kernels.gated_rmsnorm as gn
    import kernels.gdn_recurrent as gdn
    import kernels.paged_attention as pa
    import kernels.rmsnorm as rn
    import kernels.small_m_linear as sml

    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    calls = []
    launchers = [(rn, "rmsnorm_triton", rn.rmsnorm_ref), (gn, "gated_rmsnorm_triton", gn.gated_rmsnorm_ref),
                 (conv, "causal_conv1d_update_triton", conv.causal_conv1d_update_ref),
                 (gdn, "gdn_recurrent_triton", gdn.gdn_recurrent_ref),
                 (pa, "paged_decode_attention_triton", pa.paged_decode_attention_ref),
                 (fa, "fused_attn_decode_inputs_triton", fa.fused_attn_decode_inputs_ref),
                 (sml, "small_m_linear_triton", sml.small_m_linear_ref),
                 (sml, "linear_silu_mul_triton", sml.linear_silu_mul_ref)]
    for mod, name, _ in launchers:  # launch options (workspace, pdl, ...) are keywords; the op's inputs positional
        monkeypatch.setattr(mod, name, lambda *a, _n=name, _fn=getattr(mod, name), pdl=False, **launch: (
            calls.append((_n, pdl)), _fn(*a, pdl=False, **launch))[1])
    # the model runner turns PDL on where the device has it: here it is told the CPU does (every launcher above
    # drops the flag, so no PDL launch reaches the interpreter)
    monkeypatch.setattr("engine.ops.pdl_supported", lambda device: True)
    eng = Engine.from_checkpoint(ckpt, dtype="float32", max_num_seqs=2, num_blocks=32, block_size=16)
    img = np.random.default_rng(0).integers(0, 256, (70, 90, 3), dtype=np.uint8)
    reqs = [dict(prompt="Read.", image=img, sampling=SamplingParams(max_tokens=4), ignore_eos=True)]
    got = eng.generate(reqs)[0].output_token_ids
    assert {n for n, _ in calls} == {name for _, name, _ in launchers}, sorted({n for n, _ in calls})
    assert all(pdl is True for _, pdl in calls), sorted({(n, p) for n, p in calls if p is not True})
    monkeypatch.delenv("OCRIA_FORCE_TRITON")
    plain = Engine.from_checkpoint(ckpt, dtype="float32", max_num_seqs=2, num_blocks=32, block_size=16)
    assert got == plain.generate(reqs)[0].output_token_ids


def test_pdl_is_the_default_only_where_the_gpu_has_it(ckpt, monkeypatch):
    """PDL is on in the default tuning, but the engine turns it on only for sm_90+ CUDA devices: on CPU (here with
    the Triton interpreter forced, which would refuse a pdl launch) no module launches with it."""
    from engine.models.qwen3_5_text import RMSNorm

    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    eng = Engine.from_checkpoint(ckpt, dtype="float32", max_num_seqs=2, num_blocks=32, block_size=16)
    assert DEFAULT_TUNING.pdl and not eng.runner.config.tuning.pdl
    assert not ops.pdl_supported(torch.device("cpu"))
    lm = eng.model.language_model
    assert any(isinstance(m, RMSNorm) for m in lm.modules())
    assert not any(getattr(m, "pdl", False) for m in lm.modules())
    assert "pdl" not in eng.model.path.proj.launch
