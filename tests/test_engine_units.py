"""Engine building blocks vs references: chunked GDN prefill, varlen conv prefill, mRoPE ids, vision positions."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import numpy as np
import pytest
import torch

from engine.models.gdn_prefill import chunked_delta_rule_torch, conv1d_prefill_varlen
from engine.rope import mrope_positions
from engine.step_metadata import chunked_layout
from kernels.conv1d_update import causal_conv1d_prefill_ref
from kernels.gdn_recurrent import gdn_recurrent_ref


@pytest.mark.parametrize("lens", [[1], [37], [64], [150], [37, 1, 150, 64, 5], [200, 3]])
def test_chunked_delta_rule_matches_recurrence(lens):
    """All sequences of a step in one call (packed, zero-padded chunks) vs the token-by-token recurrence per sequence,
    each from its own state."""
    g = torch.Generator().manual_seed(sum(lens) * len(lens))
    N, S, Hk, Hv, dk, dv = sum(lens), len(lens), 2, 6, 16, 24
    q = torch.randn(N, Hk, dk, generator=g)
    k = torch.randn(N, Hk, dk, generator=g)
    v = torch.randn(N, Hv, dv, generator=g)
    gate = -torch.rand(N, Hv, generator=g) * 0.3
    beta = torch.rand(N, Hv, generator=g)
    s0 = torch.randn(S, Hv, dk, dv, generator=g) * 0.1
    rows, n_chunks = chunked_layout(lens)
    o, s = chunked_delta_rule_torch(q, k, v, gate, beta, s0, torch.from_numpy(rows), n_chunks)
    start = 0
    for i, n in enumerate(lens):
        sl = slice(start, start + n)
        state = s0[i:i + 1].clone()
        o_ref = gdn_recurrent_ref(q[None, sl], k[None, sl], v[None, sl], gate[None, sl], beta[None, sl], state,
                                  torch.tensor([0]))
        torch.testing.assert_close(o[sl], o_ref[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(s[i], state[0], atol=2e-5, rtol=1e-4)
        start += n


def test_conv_prefill_varlen_matches_per_sequence_reference():
    g = torch.Generator().manual_seed(0)
    C, K = 10, 4
    lens, slots = [5, 1, 9, 2], [3, 0, 2, 1]
    x = torch.randn(sum(lens), C, generator=g)
    w = torch.randn(C, K, generator=g)
    state = torch.randn(4, C, K - 1, generator=g)
    ref_state = state.clone()
    y = conv1d_prefill_varlen(x, w, state, slots, lens)
    start = 0
    for slot, n in zip(slots, lens):
        y_ref, final = causal_conv1d_prefill_ref(x[start:start + n], w, ref_state[slot], "silu")
        torch.testing.assert_close(y[start:start + n], y_ref)
        torch.testing.assert_close(state[slot], final)
        start += n


def test_mrope_positions_match_transformers():
    from transformers import Qwen3_5Config
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model

    img = 7
    grids = [(1, 4, 6), (1, 8, 2)]
    ids = [1, 2, 3] + [img] * 6 + [4, 5] + [img] * 4 + [6, 8, 9]
    pos, delta = mrope_positions(ids, img, grids, 2)
    cfg = Qwen3_5Config(vision_config={"spatial_merge_size": 2})
    ref, ref_delta = Qwen3_5Model.get_rope_index(
        type("M", (), {"config": cfg, "get_vision_position_ids": Qwen3_5Model.get_vision_position_ids})(),
        torch.tensor([ids]), mm_token_type_ids=(torch.tensor([ids]) == img).int(), image_grid_thw=torch.tensor(grids))
    np.testing.assert_array_equal(pos, ref[:, 0].numpy())
    assert delta == int(ref_delta[0, 0])


def test_mrope_positions_reject_mismatched_images():
    with pytest.raises(ValueError, match="expected 4 consecutive image tokens"):
        mrope_positions([1, 9, 9, 2], 9, [(1, 4, 4)], 2)
    with pytest.raises(ValueError, match="2 images given"):
        mrope_positions([1, 9, 9, 9, 9, 2], 9, [(1, 4, 4), (1, 4, 4)], 2)


def test_vision_position_interpolation_matches_transformers():
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    from engine.config import VisionConfig
    from engine.models.qwen3_5_vision import VisionModel

    cfg = VisionConfig(depth=0, hidden_size=8, intermediate_size=8, num_heads=2, in_channels=3, patch_size=16,
                       spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=8, num_position_embeddings=36)
    vm = VisionModel(cfg, torch.float32, "cpu")
    vm.pos_embed.weight.data = torch.randn(36, 8, generator=torch.Generator().manual_seed(0))
    grids = [(1, 4, 6), (1, 10, 2), (1, 2, 2)]
    idx, wts = get_vision_interpolation_indices_and_weights(torch.tensor(grids), 6, mode="bilinear",
                                                            align_corners=True, spatial_merge_size=2)
    ref = (vm.pos_embed.weight[idx] * wts[:, :, None]).sum(1)
    torch.testing.assert_close(vm.interpolated_positions(grids), ref, atol=0, rtol=0)


def test_glue_traces_as_one_graph_with_dynamic_sizes():
    """The glue ops compile with fullgraph=True (no graph breaks) and match eager at several sizes; the "eager"
    compiler backend keeps this fast on CPU while exercising the same tracing the CUDA path relies on."""
    from engine.models.glue import Glue

    compiled, eager = Glue(True, backend="eager"), Glue(False)
    gen = torch.Generator().manual_seed(0)
    for n in (1, 5, 17):
        qkv = torch.randn(n, (2 * 4 + 2 * 2) * 32, generator=gen)
        args = (qkv, torch.randn(32, generator=gen), torch.randn(32, generator=gen), torch.randn(n, 8, generator=gen),
                torch.randn(n, 8, generator=gen), 1e-6, 4, 2, 32)
        for x, y in zip(compiled.attention_inputs(*args), eager.attention_inputs(*args)):
            torch.testing.assert_close(x, y)
        q, _, _, gate = eager.attention_inputs(*args)
        torch.testing.assert_close(compiled.gated_output(q, gate), eager.gated_output(q, gate))
        gates = (torch.randn(n, 8, generator=gen), torch.randn(4, generator=gen), torch.randn(4, generator=gen))
        for x, y in zip(compiled.gdn_gates(*gates), eager.gdn_gates(*gates)):
            torch.testing.assert_close(x, y)


def test_runner_glue_check_accepts_a_working_compiler(tmp_path):
    """The start-up check that guards the compiled glue (CUDA) runs clean with a working compiler backend."""
    import warnings

    from dataclasses import replace

    from engine.interface import SamplingParams
    from engine.llm_engine import Engine
    from engine.testing import build_checkpoint

    ckpt = build_checkpoint(tmp_path / "c", vision=False)
    eng = Engine.from_checkpoint(ckpt, num_blocks=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        glue = eng.runner._compiled_glue(backend="eager")
    assert glue.compiled
    ref = eng.generate([dict(prompt_token_ids=list(range(3, 30)), sampling=SamplingParams(max_tokens=6))])
    eng.model.use(replace(eng.model.path, glue=glue))
    out = eng.generate([dict(prompt_token_ids=list(range(3, 30)), sampling=SamplingParams(max_tokens=6))])
    assert out[0].output_token_ids == ref[0].output_token_ids


def test_each_tuning_switch_reaches_the_model(tmp_path):
    """DecodeTuning, handed to the engine whole: flipping one switch changes exactly what it names in the model the
    runner built (no positional mix-ups), and PDL is resolved off where the device has none (here, the CPU)."""
    from engine.llm_engine import Engine
    from engine.options import DEFAULT_TUNING, DecodeTuning
    from engine.testing import build_checkpoint

    ckpt = build_checkpoint(tmp_path / "c", vision=False)

    def seen(tuning):
        import os
        os.environ["OCRIA_FORCE_TRITON"] = "1"  # the GEMV's workspace is sized where its kernels would run
        try:
            eng = Engine.from_checkpoint(ckpt, num_blocks=16, max_num_seqs=2, tuning=tuning)
        finally:
            os.environ.pop("OCRIA_FORCE_TRITON")
        lm = eng.model.language_model
        attn = next(layer.self_attn for layer in lm.layers if layer.kind == "full_attention")
        return dict(fused_attention_decode=attn.fused_inputs, gemv=attn.proj.workspace is not None,
                    swiglu_epilogue=attn.proj.swiglu_epilogue, pdl=eng.runner.config.tuning.pdl,
                    prefill_min_seqs=eng.scheduler.min_admit,
                    spec_fold_after=eng.runner.config.tuning.spec_fold_after)

    base = seen(DEFAULT_TUNING)
    assert base["gemv"] and base["swiglu_epilogue"] and base["fused_attention_decode"] and not base["pdl"]
    for name, value in (("fused_attention_decode", False), ("gemv", False), ("prefill_min_seqs", 3),
                        ("spec_fold_after", 2)):
        got = seen(DecodeTuning(**{name: value}))
        assert {k for k in got if got[k] != base[k]} == ({name, "swiglu_epilogue"} if name == "gemv" else {name})
    got = seen(DecodeTuning(swiglu_epilogue=False))
    assert {k for k in got if got[k] != base[k]} == {"swiglu_epilogue"}


def test_drafter_glue_traces_as_one_graph_and_the_runner_check_accepts_it(tmp_path):
    """The drafter's glue (engine/models/dflash_glue.py) compiles with fullgraph=True and matches eager at several
    sizes; the runner's start-up check of it runs clean, and speculative decoding through the compiled glue gives
    the same tokens."""
    import warnings

    from engine.interface import SamplingParams
    from engine.llm_engine import Engine
    from engine.models.dflash_glue import DraftGlue
    from engine.testing import build_checkpoint, write_random_drafter

    compiled, eager = DraftGlue(True, backend="eager"), DraftGlue(False)
    gen = torch.Generator().manual_seed(0)
    for n in (1, 5, 17):
        def r(*s):
            return torch.randn(*s, generator=gen)
        cos, sin = r(n, 8), r(n, 8)
        calls = (("norm", (r(n, 24), r(24), 1e-6)), ("add_norm", (r(n, 24), r(n, 24), r(24), 1e-6)),
                 ("qkv_heads", (r(n, 8 * 8), r(8), r(8), cos, sin, 1e-6, 4, 2, 8)),
                 ("kv_heads", (r(n, 4 * 8), r(8), cos, sin, 1e-6, 2, 8)),
                 ("rotary", (torch.arange(n) + 3, r(4), r(1))))
        for name, a in calls:
            for x, y in zip(getattr(compiled, name)(*a), getattr(eager, name)(*a)):
                torch.testing.assert_close(x, y)
    ckpt = build_checkpoint(tmp_path / "c", vision=False)
    drafter = write_random_drafter(tmp_path / "d", ckpt, block_size=4)
    eng = Engine.from_checkpoint(ckpt, num_blocks=32, speculative=dict(drafter=str(drafter)))
    req = [dict(prompt_token_ids=list(range(3, 30)), sampling=SamplingParams(max_tokens=9))]
    ref = eng.generate(req)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        glue = eng.runner._compiled_draft_glue(backend="eager")
    assert glue.compiled
    eng.spec.drafter.use_glue(glue)
    out = eng.generate(req)[0]
    assert out.output_token_ids == ref[0].output_token_ids
    assert out.spec.steps > 0 and ref[0].spec.steps > 0


def test_drafter_projections_are_views_of_one_fused_weight():
    """q/k/v and gate/up become views of one weight each (one GEMM at inference) sharing memory with the
    parameters, so training or loading into the parameters changes the fused weight too; replacing the parameters
    (.to()) fuses again."""
    from engine.models.dflash import DFlashConfig, DFlashDrafter

    cfg = DFlashConfig(hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=20,
                       target_layer_ids=(0,), mask_token_id=19, block_size=4)
    d = DFlashDrafter(cfg)
    d.init_for_training(torch.Generator().manual_seed(0))
    layer = d.layers[0]
    want = torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight]).clone()
    d.fuse_projections()
    assert torch.equal(layer.qkv_weight, want)
    with torch.no_grad():
        layer.k_proj.weight.add_(1.0)
        layer.up_proj.weight.mul_(2.0)
    assert torch.equal(layer.qkv_weight[16:24], layer.k_proj.weight)
    assert torch.equal(layer.gate_up_weight[24:], layer.up_proj.weight)
    d.to(torch.float64)
    d.fuse_projections()
    assert layer.qkv_weight.dtype == torch.float64
    assert layer.qkv_weight.data_ptr() == layer.q_proj.weight.data_ptr()


def test_glue_check_falls_back_to_eager_when_a_compiled_function_is_wrong(tmp_path):
    """The start-up check compares every compiled glue function with the eager one: one that differs (here the
    drafter's norm off by a factor) sends the runner back to the eager glue, with a warning naming it."""
    import warnings

    from engine.llm_engine import Engine
    from engine.models.dflash_glue import DraftGlue
    from engine.testing import build_checkpoint, write_random_drafter

    ckpt = build_checkpoint(tmp_path / "c", vision=False)
    eng = Engine.from_checkpoint(ckpt, num_blocks=32,
                                 speculative=dict(drafter=str(write_random_drafter(tmp_path / "d", ckpt,
                                                                                   block_size=4))))
    wrong = DraftGlue(True, backend="eager")
    right_norm = wrong.norm
    wrong.norm = lambda x, w, eps: 2 * right_norm(x, w, eps)
    eager = DraftGlue(False)
    calls = lambda n, rand: [("norm", (rand(n, 8), rand(8), 1e-6))]  # noqa: E731
    with pytest.warns(UserWarning, match="the drafter's glue failed"):
        assert eng.runner._checked(eager, wrong, calls, "the drafter's glue") is eager
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert eng.runner._checked(eager, DraftGlue(True, backend="eager"), calls, "the drafter's glue").compiled


def test_prefill_min_seqs_batches_admissions_and_keeps_every_answer(tmp_path):
    """prefill_min_seqs=3 over 4 seats: prompts wait for 3 free seats while others decode, so fewer prefill steps
    admit more prompts each; every answer is the one admitting at once gives. 1 is the plain scheduler."""
    from engine.interface import SamplingParams
    from engine.llm_engine import Engine
    from engine.options import DecodeTuning
    from engine.testing import build_checkpoint

    ckpt = build_checkpoint(tmp_path / "c", vision=False)
    reqs = [dict(request_id=f"r{i}", prompt_token_ids=list(range(3, 9 + 3 * i)), ignore_eos=True,
                 sampling=SamplingParams(max_tokens=2 + (5 * i) % 11)) for i in range(10)]
    runs = {}
    for min_seqs in (1, 3):
        eng = Engine.from_checkpoint(ckpt, num_blocks=64, max_num_seqs=4, tuning=DecodeTuning(prefill_min_seqs=min_seqs))
        eng.record_steps = True
        outs = eng.generate([dict(r) for r in reqs])
        admitted = [r.num_seqs for r in eng.step_log if r.is_prefill]
        runs[min_seqs] = ({o.request_id: o.output_token_ids for o in outs}, admitted)
    (plain, plain_steps), (batched, batched_steps) = runs[1], runs[3]
    assert batched == plain and [len(v) for v in plain.values()] == [r["sampling"].max_tokens for r in reqs]
    assert sum(plain_steps) == sum(batched_steps) == len(reqs)  # every prompt fits one step: one step admits it
    assert len(batched_steps) < len(plain_steps)
    assert min(batched_steps[1:-1]) >= 3  # after the first fill, every admission but the tail's is of >= 3 prompts
    with pytest.raises(ValueError, match="prefill_min_seqs=0: give an integer >= 1"):
        Engine.from_checkpoint(ckpt, num_blocks=64, tuning=DecodeTuning(prefill_min_seqs=0))
