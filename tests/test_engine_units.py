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
    eng.model.language_model.set_glue(glue)
    out = eng.generate([dict(prompt_token_ids=list(range(3, 30)), sampling=SamplingParams(max_tokens=6))])
    assert out[0].output_token_ids == ref[0].output_token_ids


def test_each_engine_option_reaches_its_decode_path_field():
    """EngineOptions.decode_path: flipping one option flips exactly its DecodePath field (no positional mix-ups)."""
    from dataclasses import fields

    from engine.llm_engine import EngineOptions
    from engine.model_runner import DecodePath

    option = {"gemv": "decode_gemv", "pdl": "decode_pdl"}  # DecodePath field -> EngineOptions name where they differ
    base = EngineOptions().decode_path()
    for f in fields(DecodePath):
        flipped = EngineOptions(**{option.get(f.name, f.name): not getattr(base, f.name)}).decode_path()
        assert [getattr(flipped, g.name) != getattr(base, g.name) for g in fields(DecodePath)] == \
            [g.name == f.name for g in fields(DecodePath)], f.name
