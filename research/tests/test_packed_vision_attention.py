"""research/ocria_tiny/packed_vision_attention.py: the vision tower with every image of a batch in one padded SDPA call computes what
transformers' per-image attention computes, forward and backward (real model, real HF-format checkpoint)."""
import pytest
import torch

from engine.testing import build_checkpoint
from research.ocria_tiny.packed_vision_attention import NAME, packed_attention, use_packed_vision_attention


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=11)


def vision_run(model, pixels, grid):
    """The tower's merged output and the gradient of a fixed random projection of it w.r.t. the patch embedding."""
    model.zero_grad(set_to_none=True)
    out = model.model.visual(pixels, grid_thw=grid)
    out = out.pooler_output if hasattr(out, "pooler_output") else out
    out = out if torch.is_tensor(out) else out[0]
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * probe).sum().backward()
    return out.detach(), model.model.visual.patch_embed.proj.weight.grad.clone()


def test_packed_matches_per_image_attention(ckpt):
    from transformers import Qwen3_5ForConditionalGeneration

    model = Qwen3_5ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).train()
    vc = model.config.vision_config
    merge = vc.spatial_merge_size
    # three images of different sizes (in merged 2x2 cells: 3x5, 1x1, 4x2), as a training batch packs them
    grid = torch.tensor([[1, 3 * merge, 5 * merge], [1, merge, merge], [1, 4 * merge, 2 * merge]])
    patch_dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
    pixels = torch.randn(int(grid.prod(1).sum()), patch_dim, generator=torch.Generator().manual_seed(0))
    assert model.model.visual.config._attn_implementation != NAME
    want_out, want_grad = vision_run(model, pixels, grid)

    use_packed_vision_attention(model)
    assert model.model.visual.config._attn_implementation == NAME
    from transformers import AttentionInterface

    calls = []
    try:  # count calls: one per block for the whole batch, not one per image
        AttentionInterface.register(NAME, lambda *a, **k: (calls.append(1), packed_attention(*a, **k))[1])
        got_out, got_grad = vision_run(model, pixels, grid)
    finally:
        AttentionInterface.register(NAME, packed_attention)
    assert len(calls) == len(model.model.visual.blocks), len(calls)
    torch.testing.assert_close(got_out, want_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, atol=2e-5, rtol=1e-5)
