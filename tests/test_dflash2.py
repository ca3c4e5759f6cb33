"""DFlash2's drafter parts (engine/models/dflash.py): the grouped dynamic convolution stays inside each block and
starts as the identity, the candidate selector scores unary + predecessor-successor terms, the engine's paged draft
pass equals the dense training pass, and configs that carry half of DFlash2 are refused naming the missing field.
The engine's lossless tests run a DFlash2 drafter too (tests/test_engine_speculative.py)."""
import json

import pytest
import torch

from engine.models.dflash import (
    CandidateSelector, DFlashConfig, DFlashDrafter, DrafterConfigError, GroupedConv, load_dflash_config)
from engine.testing import write_random_drafter


def test_convolution_starts_as_the_identity_and_never_crosses_a_block_start():
    torch.manual_seed(0)
    conv = GroupedConv(hidden=8, taps=2, group=4)
    x = torch.randn(6, 8)  # two blocks of three rows
    prepared, w = conv.prepare(x, block=3)
    torch.testing.assert_close(prepared, x)
    torch.testing.assert_close(conv.finish(x, w, block=3), x)
    with torch.no_grad():  # tap 1 alone: each row takes the row before it in its block; a block's first row gets 0
        conv.base_kernel.zero_()
        conv.base_kernel[:, 1] = 1.0
    shifted, _ = conv.prepare(x, block=3)
    want = torch.stack([torch.zeros(8), x[0], x[1], torch.zeros(8), x[3], x[4]])
    torch.testing.assert_close(shifted, want)


def test_predicted_kernels_are_shared_by_each_group_of_channels():
    torch.manual_seed(1)
    conv = GroupedConv(hidden=8, taps=2, group=4)
    with torch.no_grad():
        conv.kernel_projection.weight.normal_()
    x = torch.randn(3, 8)
    _, w = conv.prepare(x, block=3)  # the finish side's kernels [rows, taps, channels]
    delta = w - conv.base_kernel[1]
    assert torch.equal(delta[..., :4], delta[..., :1].expand(-1, -1, 4))
    assert torch.equal(delta[..., 4:], delta[..., 4:5].expand(-1, -1, 4))
    assert not torch.equal(delta[..., 0], delta[..., 4])


def test_selector_scores_unary_plus_predecessor_successor_term():
    sel = CandidateSelector(hidden=2, vocab=6, rank=2)
    with torch.no_grad():
        sel.hidden_projection.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        sel.predecessor_codebook[3] = torch.tensor([0.5, -1.0])
        sel.successor_codebook[1] = torch.tensor([4.0, 1.0])
        sel.successor_codebook[5] = torch.tensor([-2.0, 3.0])
    scores = sel.score(torch.tensor([[1, 5]]), torch.tensor([[0.25, -0.75]]), torch.tensor([[3.0, 1.0]]),
                       torch.tensor([3]))
    state = torch.tensor([0.5 * 3.0, -1.0 * 2.0])  # A[3] * P h
    want = torch.tensor([[0.25 + 4.0 * state[0] + 1.0 * state[1], -0.75 - 2.0 * state[0] + 3.0 * state[1]]])
    torch.testing.assert_close(scores, want)


def _dflash2_config(**kw) -> DFlashConfig:
    return DFlashConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=50,
                        target_layer_ids=(0, 2), mask_token_id=49, block_size=5, conv_kernel_size=2,
                        conv_group_size=8, selector_rank=4, selector_top_k=3, **kw)


@pytest.mark.parametrize("dflash2", [False, True])
def test_paged_draft_pass_equals_the_training_pass(dflash2):
    """What the drafter learns is what it drafts with: the engine's pass (context K/V written to the paged cache,
    block rows attending through it) and the dense masked pass of training give the same hidden states."""
    torch.manual_seed(2)
    cfg = _dflash2_config() if dflash2 else DFlashConfig(**{**_dflash2_config().__dict__, "conv_kernel_size": 0,
                                                             "selector_rank": 0})
    d = DFlashDrafter(cfg)
    with torch.no_grad():
        for name, p in d.hf_named():
            p.copy_(torch.randn(p.shape) * (0.3 if p.dim() > 1 else 0.1) + (1.0 if p.dim() == 1 else 0.0))
    L, B, page = 11, cfg.block_size, 4  # 11 context tokens; the block occupies indices 11 .. 15
    taps = {lid: torch.randn(L, 32) for lid in cfg.target_layer_ids}
    embeds = torch.randn(B, 32)
    d.alloc_kv(num_blocks=8, block_size=page)
    table = torch.tensor([5, 2, 7, 0], dtype=torch.int32)  # scattered physical blocks
    slots = lambda idx: (table[idx // page].long() * page + idx % page)  # noqa: E731
    d.write_context(taps, slots(torch.arange(L)), torch.arange(L))
    index = torch.arange(L, L + B)
    paged = d.draft_hidden(embeds, index, slots(index), table[None].expand(B, -1).contiguous(),
                           torch.full((B,), L + B, dtype=torch.int32), B)
    dense = d.train_hidden(taps, embeds[None], torch.tensor([L]))[0]
    torch.testing.assert_close(paged, dense, rtol=1e-4, atol=1e-4)


def test_half_a_dflash2_config_is_refused(text_ckpt, tmp_path):
    from engine.config import load_config

    target = load_config(text_ckpt).text
    d = write_random_drafter(tmp_path / "d", text_ckpt, dflash2=True)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert load_dflash_config(d, target).selector_rank == 8
    for drop, missing in (("selector_rank", "selector_rank"), ("conv_kernel_size", "conv_kernel_size")):
        (d / "config.json").write_text(json.dumps(dict(cfg, dflash_config={
            k: v for k, v in cfg["dflash_config"].items() if k != drop})))
        with pytest.raises(DrafterConfigError, match=missing):
            load_dflash_config(d, target)


def test_tau_estimate_drafts_as_the_engine_selects_them():
    """Training's tau estimate counts the drafts a greedy speculative step would make: with a selector, each picked
    among its position's top-k given the draft before it (engine/speculative's _select), which is not the argmax
    here; without one, the argmax."""
    from types import SimpleNamespace

    from engine.speculative import SpecDecoder
    from engine.drafter_training import BlockPass, greedy_drafts

    torch.manual_seed(4)
    d = DFlashDrafter(DFlashConfig(**{**_dflash2_config().__dict__, "selector_top_k": 5}))
    with torch.no_grad():
        for _, p in d.hf_named():
            p.copy_(torch.randn(p.shape))
    N, P, V = 6, 4, 50
    logits, hidden = torch.randn(N, P, V), torch.randn(N, P, 32)
    anchors = torch.randint(0, V, (N,))
    block = torch.cat([anchors[:, None], torch.full((N, P), 49)], 1)
    bp = BlockPass(logits, hidden, block, torch.zeros(N, P, dtype=torch.long), torch.ones(N, P, dtype=torch.bool),
                   None)
    with torch.no_grad():
        want, _ = SpecDecoder._select(SimpleNamespace(drafter=d), None, anchors, hidden, logits, [])
        got = greedy_drafts(d, bp)
    assert torch.equal(got, want) and not torch.equal(got, logits.argmax(-1))
    plain = DFlashDrafter(DFlashConfig(**{**_dflash2_config().__dict__, "conv_kernel_size": 0, "selector_rank": 0}))
    assert torch.equal(greedy_drafts(plain, bp), logits.argmax(-1))
