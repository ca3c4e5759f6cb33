"""Processor vs transformers: identical pixel patches, grids, rendered prompt and token ids."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import numpy as np
import torch
import pytest

from engine.config import load_config
from engine.processor import ImageProcessor, Processor, ProcessorError, smart_resize
from engine.testing import build_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("vl"), seed=0)


@pytest.fixture(scope="module")
def hf(ckpt):
    from transformers import AutoTokenizer
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(ckpt, backend="pil"), AutoTokenizer.from_pretrained(ckpt)


def test_smart_resize_matches_transformers():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

    rng = np.random.default_rng(0)
    for _ in range(500):
        h, w = (int(v) for v in rng.integers(1, 4000, 2))
        if max(h, w) / min(h, w) > 200:
            continue
        lo = int(rng.integers(32 * 32, 512 * 512))
        hi = lo + int(rng.integers(0, 4000 * 4000))
        assert smart_resize(h, w, 32, lo, hi) == hf_smart_resize(h, w, 32, lo, hi), (h, w, lo, hi)


@pytest.mark.parametrize("h, w", [(100, 80), (333, 517), (20, 900), (1200, 700), (64, 64)])
def test_patches_and_prompt_ids_match_transformers(ckpt, hf, h, w):
    image_processor, tokenizer = hf
    proc = Processor(ckpt, load_config(ckpt))
    img = np.random.default_rng(h * w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    ids, patches, grids = proc.page_inputs(img, "Convert this page to markdown.")

    ref = image_processor(images=[img], return_tensors="np", input_data_format="channels_last")
    np.testing.assert_array_equal(patches, ref["pixel_values"])
    assert [list(g) for g in grids] == ref["image_grid_thw"].tolist()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Convert this page to markdown."}]}]
    ref_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ref_ids = list(ref_ids["input_ids"] if not isinstance(ref_ids, list) else ref_ids)
    n = int(np.prod(grids[0])) // 4
    at = ref_ids.index(proc.cfg.image_token_id)
    assert ids == ref_ids[:at] + [proc.cfg.image_token_id] * n + ref_ids[at + 1:]
    assert proc.decode(proc.encode("Hello, world.")) == tokenizer.decode(tokenizer.encode("Hello, world."))

    # the compact form (uint8, expanded on the engine's device) gives the same patches bit for bit
    ids_c, raw, grids_c = proc.page_inputs(img, "Convert this page to markdown.", compact=True)
    assert ids_c == ids and grids_c == grids and raw.dtype == np.uint8
    assert raw.shape == (patches.shape[0], patches.shape[1] // proc.image_processor.temporal_patch_size)
    np.testing.assert_array_equal(proc.image_processor.expand_patches(torch.from_numpy(raw)).numpy(), patches)


def test_bad_images_are_rejected_clearly(ckpt):
    proc = Processor(ckpt, load_config(ckpt))
    with pytest.raises(ProcessorError, match="H x W x 3 uint8"):
        proc.page_inputs(np.zeros((10, 10), dtype=np.uint8), "x")
    with pytest.raises(ProcessorError, match="aspect ratio"):
        proc.page_inputs(np.zeros((1, 500, 3), dtype=np.uint8), "x")


def test_image_processor_bounds():
    ip = ImageProcessor(min_pixels=64 * 64, max_pixels=256 * 256)
    _, (t, gh, gw) = ip(np.zeros((2000, 1500, 3), dtype=np.uint8))
    assert (gh * 16) * (gw * 16) <= 256 * 256 and gh % 2 == 0 and gw % 2 == 0
    _, (t, gh, gw) = ip(np.zeros((10, 10, 3), dtype=np.uint8))
    assert (gh * 16) * (gw * 16) >= 64 * 64
