"""research.ocria_tiny.chunked_gdn against its reference, transformers' torch fallback of the chunked gated delta rule: outputs,
final states and gradients on fresh random inputs, lengths that are and are not multiples of the chunk."""
from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5

from research.ocria_tiny.chunked_gdn import chunked_gated_delta_rule, chunked_gdn_in

REFERENCE = modeling_qwen3_5.torch_chunk_gated_delta_rule


def _inputs(b: int, t: int, h: int, dk: int, dv: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, t, h, dk, generator=gen) for _ in range(2))
    v = torch.randn(b, t, h, dv, generator=gen)
    g = -torch.rand(b, t, h, generator=gen) * 0.5  # log decay <= 0, as the layer makes it
    beta = torch.rand(b, t, h, generator=gen)
    return [x.requires_grad_() for x in (q, k, v, g, beta)]


@pytest.mark.parametrize("b, t, h, dk, dv, chunk", [(2, 37, 3, 16, 24, 16), (1, 64, 2, 32, 32, 16),
                                                    (3, 150, 4, 64, 64, 64), (2, 5, 1, 8, 12, 64)])
def test_chunked_gated_delta_rule_matches_the_reference_with_gradients(b, t, h, dk, dv, chunk):
    inputs = _inputs(b, t, h, dk, dv, seed=t * 7 + h)
    state0 = torch.randn(b, h, dk, dv) * 0.1
    results = []
    for fn in (REFERENCE, chunked_gated_delta_rule):
        args = [x.detach().clone().requires_grad_() for x in inputs]
        out, state = fn(*args[:3], g=args[3], beta=args[4], chunk_size=chunk, initial_state=state0,
                        output_final_state=True, use_qk_l2norm_in_kernel=True)
        (out.square().sum() + state.sum()).backward()
        results.append((out, state, [a.grad for a in args]))
    (out_ref, state_ref, grads_ref), (out, state, grads) = results
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, state_ref, rtol=1e-4, atol=1e-4)
    for name, got, want in zip(["q", "k", "v", "g", "beta"], grads, grads_ref):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3, msg=lambda m, name=name: f"grad {name}: {m}")


def test_without_a_state_and_in_bf16_as_training_calls_it():
    q, k, v, g, beta = (x.detach() for x in _inputs(2, 70, 2, 16, 16, seed=3))
    bf16 = [x.bfloat16() for x in (q, k, v)]
    out, state = chunked_gated_delta_rule(*bf16, g=g, beta=beta.bfloat16(), use_qk_l2norm_in_kernel=True)
    ref, _ = REFERENCE(*bf16, g=g, beta=beta.bfloat16(), use_qk_l2norm_in_kernel=True)
    assert out.dtype == torch.bfloat16 and state is None
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_packed_sequences_are_refused():
    q, k, v, g, beta = _inputs(1, 8, 1, 4, 4, seed=0)
    with pytest.raises(ValueError, match="cu_seqlens"):
        chunked_gated_delta_rule(q, k, v, g=g, beta=beta, cu_seqlens=torch.tensor([0, 4, 8]))


def test_the_swap_is_scoped_to_the_block():
    for chunk in (64, 128):  # train.gdn_chunk reaches the rule
        with chunked_gdn_in(modeling_qwen3_5, chunk):
            swapped = modeling_qwen3_5.torch_chunk_gated_delta_rule
            assert swapped.func is chunked_gated_delta_rule and swapped.keywords == {"chunk_size": chunk}
        assert modeling_qwen3_5.torch_chunk_gated_delta_rule is REFERENCE
    with pytest.raises(RuntimeError), chunked_gdn_in(modeling_qwen3_5):
        raise RuntimeError("a failing step")
    assert modeling_qwen3_5.torch_chunk_gated_delta_rule is REFERENCE


def test_under_training_autocast_it_still_runs_in_fp32():
    """Training runs under bf16 autocast: the rule ignores it (fp32 state and products), so it equals the fp32
    reference computed without autocast."""
    q, k, v, g, beta = (x.detach() for x in _inputs(2, 130, 2, 16, 16, seed=5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, state = chunked_gated_delta_rule(q, k, v, g=g, beta=beta, output_final_state=True,
                                              use_qk_l2norm_in_kernel=True)
    ref, ref_state = REFERENCE(q, k, v, g=g, beta=beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert state.dtype == torch.float32 and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, ref_state, rtol=1e-4, atol=1e-4)
