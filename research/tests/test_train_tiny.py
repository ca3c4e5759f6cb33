"""ocria-tiny training inputs and the image path: what the model is trained on, and whether the image reaches the loss.

Run 1's checkpoint learned a text-only language model: its vision tower emits one page-independent constant
(image-embedding spread 1.5e-4 of their size), so swapping or blanking the page image changes the answer loss by
< 0.001. These tests check the batch construction against an independent re-derivation, that the image reaches the
loss of a fresh model, and that the image_use diagnostic logged during training flags an image-blind checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import SHIPPED_PAGES, TRAIN_CONFIG, write_synth
from engine.hf_format import special_token_ids
from research.ocria_tiny.encoding import PromptBuilder, collate, encode_page, encoded_batch, load_image_processor
from research.ocria_tiny.train_config import curriculum_stage, load_config, synth_config
from research.ocria_tiny.train_tiny import hf_config, image_use, param_groups
from research.ocria_tiny.synthetic import TextPool, make_page

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "ocria-tiny"
CONFIG = TRAIN_CONFIG
MINI = [  # a miniature of the shipped architecture: same block types and layout, CPU-sized
    "model.text.hidden_size=64", "model.text.intermediate_size=128", "model.text.num_hidden_layers=4",
    "model.text.num_attention_heads=2", "model.text.num_key_value_heads=1", "model.text.linear_num_key_heads=1",
    "model.text.linear_num_value_heads=2", "model.text.linear_key_head_dim=32", "model.text.linear_value_head_dim=32",
    "model.vision.depth=2", "model.vision.hidden_size=64", "model.vision.intermediate_size=128",
    "model.vision.num_heads=2",
]


@pytest.fixture(scope="module")
def pool(licence_prose) -> TextPool:
    return TextPool(prose=licence_prose, code=[["def area(r):", "    return 3.14159 * r * r"]])


@pytest.fixture(scope="module")
def small_pages(pool):
    """Short pages rendered at 256 px (64 image tokens): the real generator, CPU-cheap."""
    cfg = load_config(CONFIG, ["image.target_longest_px=256", "image.max_pixels=65536", "data.max_chars=[40,120]",
                               "data.font_px=[14.0,20.0]"])
    return [make_page(77 + i, pool, synth_config(cfg)) for i in range(3)]


@pytest.fixture(scope="module")
def parts():
    return load_image_processor(MODEL), PromptBuilder(MODEL, load_config(CONFIG, [])["prompt"])


def test_batch_has_image_tokens_types_labels_and_answer(small_pages, parts):
    processor, builder = parts
    items = [encode_page(p.image, p.markdown, processor, builder, 2, 448) for p in small_pages]
    batch = collate(items, builder.ids.endoftext, builder.ids.image_pad)
    assert batch["image_grid_thw"].shape == (3, 3)
    assert batch["pixel_bytes"].dtype == torch.uint8  # shipped as bytes, made float on the device (model_batch)
    assert batch["pixel_bytes"].shape[0] == int(batch["image_grid_thw"].prod(-1).sum())
    for i, (page, item) in enumerate(zip(small_pages, items)):
        t, h, w = batch["image_grid_thw"][i].tolist()
        is_image = batch["input_ids"][i] == builder.ids.image_pad
        assert int(is_image.sum()) == t * h * w // 4
        assert torch.equal(batch["mm_token_type_ids"][i].bool(), is_image)
        labels = batch["labels"][i]
        answer = labels != -100
        first = int(answer.nonzero()[0])
        assert not answer[:first].any() and not is_image[first:].any()  # the prompt and image are never targets
        assert int(answer.sum()) == int(batch["attention_mask"][i].sum()) - first  # every answer token is a target
        assert builder.tok.decode(labels[answer].tolist(), skip_special_tokens=False) == page.markdown + "<|im_end|>"
        assert torch.equal(labels[answer], batch["input_ids"][i][answer])  # the model shifts labels itself


def test_collated_position_ids_are_transformers_rope_index(small_pages, parts):
    """The rotary positions made in the loader (engine.rope.mrope_positions) are the ones transformers would
    compute on the device, padding included, and the model's loss is the same with them."""
    processor, builder = parts
    model = _mini_model(load_config(CONFIG, MINI), builder)
    # the last page turned on its side: a landscape image advances the positions by its width, not its height
    images = [p.image for p in small_pages[:-1]] + [np.ascontiguousarray(np.rot90(small_pages[-1].image))]
    items = [encode_page(im, p.markdown, processor, builder, 2, 448) for im, p in zip(images, small_pages)]
    batch = encoded_batch(items, builder, processor)
    assert len({len(x["input_ids"]) for x in items}) > 1  # right padding is exercised
    grids = batch["image_grid_thw"].tolist()
    assert any(h > w for _, h, w in grids) and any(w > h for _, h, w in grids)
    ref, _ = model.model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"], batch["image_grid_thw"],
                                        attention_mask=batch["attention_mask"])
    assert torch.equal(batch["position_ids"], ref)
    without = {k: v for k, v in batch.items() if k != "position_ids"}
    with torch.no_grad():
        assert torch.equal(model(**batch).loss, model(**without).loss)


def test_a_cut_answer_has_no_stop_token(small_pages, parts):
    """An answer longer than max_answer_tokens keeps its first tokens and no <|im_end|>: a stop after the cut taught
    the model to stop in the middle of long pages (research/ocria_tiny/results/s16_answer_lengths.json)."""
    _, builder = parts
    page = max(small_pages, key=lambda p: len(p.markdown))
    full = builder.tok.encode(page.markdown, add_special_tokens=False).ids
    assert len(full) > 5
    assert builder.answer_ids(page.markdown, len(full) + 1) == full + [builder.ids.im_end]
    for cap in (len(full), len(full) - 3, 1):
        assert builder.answer_ids(page.markdown, cap) == full[:cap]


def test_pixel_values_are_the_normalised_page_in_merge_order(small_pages, parts):
    """Re-derive the page from the model's pixel_values: rows go merge-window by merge-window (2x2 patches of
    16x16), each row is (channel, time, y, x), both time frames equal, values (px/255 - mean) / std with the
    checkpoint's mean and std (1.0 and 0.5 for the shipped one: white paper is 0); and they are the HF Qwen2-VL
    processor's, bit for bit."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor, builder = parts
    page = small_pages[0]
    item = encode_page(page.image, page.markdown, processor, builder, 2, 448)
    pixel_values = encoded_batch([item], builder, processor)["pixel_values"]
    hf = Qwen2VLImageProcessorPil.from_pretrained(str(MODEL))(images=[page.image], return_tensors="pt")
    assert torch.equal(pixel_values, hf["pixel_values"]) and torch.equal(item["grid"], hf["image_grid_thw"][0])
    _, h, w = item["grid"].tolist()
    x = pixel_values.view(h // 2, w // 2, 2, 2, 3, 2, 16, 16)
    assert torch.equal(x[..., 0, :, :], x[..., 1, :, :])
    image = x[..., 0, :, :].permute(4, 0, 2, 5, 1, 3, 6).reshape(3, h * 16, w * 16).permute(1, 2, 0).numpy()
    resized = Image.fromarray(page.image).resize((w * 16, h * 16), Image.BICUBIC)
    mean, std = np.asarray(processor.image_mean, np.float32), np.asarray(processor.image_std, np.float32)
    expected = (np.asarray(resized, dtype=np.float32) / 255 - mean) / std
    np.testing.assert_allclose(image, expected, atol=1e-6)


def test_curriculum_stages_follow_the_page_index():
    cfg = load_config(CONFIG, ["data.curriculum=[{until_page: 100, font_px: [30, 40], max_chars: [10, 20]},"
                               " {until_page: 250, font_px: [20, 30], max_chars: [20, 80]}]"])
    assert synth_config(cfg, 0).font_px == (30, 40) and synth_config(cfg, 99).max_chars == (10, 20)
    assert synth_config(cfg, 100).font_px == (20, 30) and synth_config(cfg, 249).max_chars == (20, 80)
    assert synth_config(cfg, 250) == synth_config(cfg) == synth_config(load_config(CONFIG, []))
    assert curriculum_stage(load_config(CONFIG, []), 0) is not None  # no curriculum: the final distribution


def test_a_stage_mix_replaces_its_share_of_training_pages_only():
    stage = ("data.curriculum=[{until_page: 4000, font_px: [14, 24], max_chars: [60, 400], crop: true,"
             " mix: {share: 0.3, font_px: [22, 32], max_chars: [8, 40], crop: true, strict_chars: true}}]")
    cfg = load_config(CONFIG, [stage])
    mixed = [i for i in range(4000) if synth_config(cfg, i, mix=True).strict_chars]
    assert 0.27 < len(mixed) / 4000 < 0.33  # the share, spread over the stage
    assert all(synth_config(cfg, i, mix=True).font_px == (22, 32) for i in mixed)
    others = sorted(set(range(4000)) - set(mixed))
    assert all(synth_config(cfg, i, mix=True) == synth_config(cfg, i) for i in others)
    assert not any(synth_config(cfg, i).strict_chars for i in mixed)  # held-out/check pages: the stage's own settings
    assert mixed == [i for i in range(4000) if synth_config(cfg, i, mix=True).strict_chars]  # deterministic
    assert synth_config(cfg, 4000, mix=True) == synth_config(cfg)  # past the stage: the final distribution


def test_white_paper_normalises_to_zero(tmp_path):
    from engine.hf_format import write_preprocessor_config

    write_preprocessor_config(tmp_path, 16384, 589824, image_mean=1.0, image_std=0.5)
    assert json.loads((tmp_path / "video_preprocessor_config.json").read_text())["image_mean"] == [1.0] * 3
    px, _ = load_image_processor(tmp_path)(np.full((64, 64, 3), 255, np.uint8))
    assert np.abs(px).max() < 1e-6
    px, _ = load_image_processor(tmp_path)(np.zeros((64, 64, 3), np.uint8))
    assert np.allclose(px, -2.0)


def _mini_model(cfg, builder):
    from transformers import Qwen3_5ForConditionalGeneration

    torch.manual_seed(0)
    return Qwen3_5ForConditionalGeneration(hf_config(cfg, special_token_ids(builder.tok)))


def test_image_reaches_the_loss_of_a_fresh_model(small_pages, parts):
    processor, builder = parts
    cfg = load_config(CONFIG, MINI)
    model = _mini_model(cfg, builder)
    items = [encode_page(p.image, p.markdown, processor, builder, 2, 448) for p in small_pages]
    batch = encoded_batch(items, builder, processor)
    batch["pixel_values"].requires_grad_(True)
    model(**batch).loss.backward()
    assert batch["pixel_values"].grad.abs().mean() > 1e-6
    for name, p in model.model.visual.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    swapped = encoded_batch([encode_page(q.image, p.markdown, processor, builder, 2, 448)
                             for p, q in zip(small_pages, small_pages[1:] + small_pages[:1])], builder, processor)
    use = image_use(model, {k: v.detach() for k, v in batch.items()}, swapped)
    assert abs(use["img_gain"]) > 1e-4 and use["img_var"] > 0.05, use


def test_line_ctc_reads_line_characters_left_to_right_and_trains_the_vision_tower(pool, parts):
    """LineCTC: only single-line pages take part; each is its merged token columns (rows averaged) in order, every
    column split into `subframes` frames; the targets are the plain-text characters of the answer; the loss reaches
    the vision tower through the features of the same forward pass."""
    import torch.nn.functional as F

    from research.ocria_tiny.eval_ocr import levenshtein, markdown_to_text
    from research.ocria_tiny.text_line_ctc import CTC_CLASSES, ctc_greedy, ctc_min_frames
    from research.ocria_tiny.train_tiny import LineCTC

    processor, builder = parts
    cfg = load_config(CONFIG, MINI + [("data.curriculum=[{until_page: 10, font_px: [24, 30], max_chars: [8, 30], "
                                       "crop: true, strict_chars: true}]")])
    lines = [make_page(s, pool, synth_config(cfg, 0)) for s in range(3)]
    page = make_page(3, pool, dataclasses.replace(synth_config(cfg), max_chars=(300, 400)))  # a full page: skipped
    items = [encode_page(p.image, p.markdown, processor, builder, 2, 448) for p in lines + [page]]
    batch = encoded_batch(items, builder, processor)
    rows = (batch["image_grid_thw"][:, 1] // 2).tolist()
    assert max(rows[:3]) <= 3 < rows[3], rows
    model = _mini_model(cfg, builder)
    ctc = LineCTC(model, builder.tok, 0.5, 3, 2, 3, builder.ids.im_end)
    loss = model(**batch).loss
    feats = ctc.features
    aux = ctc.loss(batch["image_grid_thw"], batch["labels"])
    assert torch.isfinite(aux) and aux > 0 and ctc.features is None
    # the same number from an independent re-derivation of the first three pages' sequences
    sizes = (batch["image_grid_thw"].prod(-1) // 4).tolist()
    seqs, targets = [], []
    for i, x in enumerate(torch.split(feats, sizes)[:3]):
        _, h, w = batch["image_grid_thw"][i].tolist()
        cols = ctc.head(torch.stack([x.view(h // 2, w // 2, -1)[:, c].mean(0) for c in range(w // 2)]))
        frames = [cols[c, k * CTC_CLASSES:(k + 1) * CTC_CLASSES] for c in range(w // 2) for k in range(3)]
        seqs.append(torch.stack(frames).log_softmax(-1))
        text = markdown_to_text(lines[i].markdown)
        assert text and all(32 <= ord(ch) < 127 for ch in text), text
        targets.append([ord(ch) - 31 for ch in text])
    alignable = [(lp, t) for lp, t in zip(seqs, targets) if len(lp) >= ctc_min_frames(t)]  # the others are left out
    assert alignable
    expected = torch.stack([F.ctc_loss(lp, torch.tensor(t), [len(lp)], [len(t)], blank=0, reduction="sum")
                            / len(t) for lp, t in alignable]).mean()
    torch.testing.assert_close(aux, expected, rtol=1e-5, atol=1e-5)
    (loss + ctc.weight * aux).backward()
    assert all(p.grad is not None for p in ctc.parameters())
    assert model.model.visual.patch_embed.proj.weight.grad.abs().sum() > 0
    # the greedy reading check: best path of the same frames against the same characters
    reads = [ctc_greedy(lp.argmax(-1).tolist()) for lp, _ in alignable]
    expected_cer = sum(levenshtein(r, t) for r, (_, t) in zip(reads, alignable)) / sum(len(t) for _, t in alignable)
    assert ctc.reading_cer(model, batch) == pytest.approx(expected_cer) and expected_cer > 0.5  # untrained: no reading
    model.zero_grad()
    model(**encoded_batch(items[3:], builder, processor))
    assert ctc.loss(batch["image_grid_thw"][3:], batch["labels"][3:]) is None  # no line page in the batch
    assert ctc.reading_cer(model, encoded_batch(items[3:], builder, processor)) is None


def test_a_new_line_ctc_head_learns_alone_for_its_head_only_steps(pool, parts):
    """As the text-line head: with head_only_steps=1 the first loss trains the line CTC head only, the next one also
    reaches the vision tower (a resumed run whose line head was not saved starts it this way)."""
    from research.ocria_tiny.train_tiny import LineCTC

    cfg, _, batch = _line_pages(pool, parts, 3)
    model = _mini_model(cfg, parts[1])
    ctc = LineCTC(model, parts[1].tok, 1.0, 3, 2, 3, parts[1].ids.im_end, head_only_steps=1)
    _check_head_learns_alone_first(model, batch, ctc, lambda: ctc.loss(batch["image_grid_thw"], batch["labels"]))


def _line_pages(pool, parts, n: int):
    """n single-line pages (24-30 px glyphs, cropped) of the first curriculum stage: (cfg, encoded items, batch)."""
    processor, builder = parts
    cfg = load_config(CONFIG, MINI + [("data.curriculum=[{until_page: 10, font_px: [24, 30], max_chars: [8, 30], "
                                       "crop: true, strict_chars: true}]")])
    items = [encode_page(p.image, p.markdown, processor, builder, 2, 448)
             for p in (make_page(s, pool, synth_config(cfg, 0)) for s in range(n))]
    return cfg, items, encoded_batch(items, builder, processor)


def _check_head_learns_alone_first(model, batch: dict, aux, loss) -> None:
    """With aux.head_only_steps == 1: the first `loss()` after a forward trains aux's head only (no gradient reaches
    the vision tower), the next one reaches the vision tower too."""
    from research.ocria_tiny.encoding import model_inputs

    vision = model.model.visual.patch_embed.proj.weight
    for head_only in (True, False):
        model.zero_grad()
        aux.head.zero_grad()
        model(**model_inputs(batch))
        loss().backward()
        assert aux.head.weight.grad.abs().sum() > 0
        assert (vision.grad is None) == head_only, head_only
    assert aux.head_only_steps == 0


def test_line_ctc_leaves_out_line_pages_it_cannot_align(pool, parts):
    """With one frame per column most line pages have more characters than columns: exactly the pages whose columns
    can emit their characters (ctc_min_frames) are scored, and a batch without one gives None."""
    from research.ocria_tiny.text_line_ctc import ctc_min_frames
    from research.ocria_tiny.train_tiny import LineCTC

    assert ctc_min_frames([4, 4, 5]) == 4 and ctc_min_frames([1, 2, 3]) == 3 and ctc_min_frames([]) == 0
    _, builder = parts
    cfg, _, batch = _line_pages(pool, parts, 6)
    model = _mini_model(cfg, builder)
    scored = {}
    for subframes in (1, 4):
        ctc = LineCTC(model, builder.tok, 1.0, 3, 2, subframes, builder.ids.im_end)
        model(**batch)
        seqs, targets = ctc._line_sequences(batch["image_grid_thw"], batch["labels"])
        cols = (batch["image_grid_thw"][:, 2] // 2).tolist()
        lines = [i for i, r in enumerate((batch["image_grid_thw"][:, 1] // 2).tolist()) if r <= 3]
        alignable = [i for i in lines if cols[i] * subframes >= ctc_min_frames(ctc.targets(
            [t for t in batch["labels"][i].tolist() if t != -100]))]
        assert [len(x) for x in seqs] == [cols[i] * subframes for i in alignable]
        assert all(len(x) >= ctc_min_frames(t) for x, t in zip(seqs, targets))
        scored[subframes] = len(alignable)
    # 24-30 px glyphs: ~2.5 characters per 32 px column, so one frame per column aligns few of the lines, four most
    assert scored[1] < scored[4] and scored[4] >= len(lines) - 1, (scored, len(lines))


def test_text_line_geometry_covers_each_lines_ink_in_the_resized_image(pool, parts):
    """line_geometry against the pixels: on a real page, resized as the processor resizes it, the ink in the middle
    of each line's band lies in the line's token columns (at most one more on a side: a glyph box starts and ends a
    little beyond its ink), and its centre lies between the line's two token rows, in the line's quarter."""
    from research.ocria_tiny.text_line_ctc import ctc_chars, line_geometry

    processor, _ = parts
    checked = 0
    # full pages of the final distribution at 768 px (resized by ~1), one drawn at 2,048 px that the processor
    # shrinks to its pixel budget (1,536 px), and a paragraph cut to its ink (lines shifted by the crop)
    with_loss = "train.text_line_ctc_weight=1.0"  # the pages carry their text lines only for the loss that reads them
    assert make_page(5, pool, synth_config(load_config(CONFIG, []))).lines is None
    final = synth_config(load_config(CONFIG, [with_loss]))
    for seed, scfg in ((5, final), (6, final),
                       (7, synth_config(load_config(CONFIG, [with_loss, "image.target_longest_px=2048"]))),
                       (8, dataclasses.replace(final, crop=True, max_chars=(150, 300), font_px=(16.0, 22.0)))):
        page = make_page(seed, pool, scfg)
        h, w = processor.resized_size(*page.image.shape[:2])
        resized = np.asarray(Image.fromarray(page.image).resize((w, h), resample=processor.resample))
        ink = resized.min(axis=2) < 128
        _, (_, gh, gw) = processor.merge_order_patches(page.image)
        geom, chars = line_geometry(page.lines, page.image.shape[:2], (gh, gw), 16, 2)
        kept = [ln for ln in page.lines if ctc_chars(ln.text)]
        assert len(geom) == len(kept) > 2 and len(chars) == sum(len(ctc_chars(ln.text)) for ln in kept)
        cols = gw // 2
        for (token, ncols, next_row, bucket, n_chars, _), line in zip(geom.tolist(), kept):
            sx, sy = w / page.image.shape[1], h / page.image.shape[0]
            top, bottom = line.y0 * sy, line.y1 * sy
            band = ink[int(top + (bottom - top) / 3):int(bottom - (bottom - top) / 3) + 1, int(line.x0 * sx):
                       int(line.x1 * sx) + 1]
            xs = np.flatnonzero(band.any(axis=0)) + int(line.x0 * sx)
            if xs.size == 0:  # a line of punctuation only, thin enough to miss the middle band
                continue
            c0, r0 = token % cols, token // cols
            ink_c0, ink_c1 = xs[0] // 32, xs[-1] // 32
            assert ink_c0 - 1 <= c0 <= ink_c0 and ink_c1 <= c0 + ncols - 1 <= ink_c1 + 1, (line, c0, ncols)
            centre = (top + bottom) / 2 / 32 - 0.5
            assert r0 <= max(centre, 0) and (next_row == 0 or centre < r0 + 1), (line, r0)
            if 0 < centre < gh // 2 - 1:
                assert bucket == int((centre - r0) * 4), (line, centre, r0, bucket)
            assert n_chars == len(ctc_chars(line.text))
            checked += 1
    assert checked > 20


def test_text_line_ctc_loss_and_reading_match_a_line_by_line_rederivation(pool, parts):
    """TextLineCTC's batched loss and greedy reading equal the same computed one line at a time: each token column
    of the line, its two rows concatenated, read out by its quarter's slice of the head into `subframes` frames;
    lines that cannot emit their characters are left out. The loss reaches the vision tower."""
    import torch.nn.functional as F

    from research.ocria_tiny.eval_ocr import levenshtein
    from research.ocria_tiny.text_line_ctc import CTC_CLASSES, LINE_BUCKETS, TextLineCTC, ctc_greedy, ctc_min_frames
    from research.ocria_tiny.encoding import model_inputs

    processor, builder = parts
    cfg = load_config(CONFIG, MINI)
    small = load_config(CONFIG, ["image.target_longest_px=320", "image.max_pixels=102400", "data.max_chars=[150,300]",
                                 "data.font_px=[11.0,15.0]", "train.text_line_ctc_weight=1.0"])
    pages = [make_page(40 + i, pool, synth_config(small)) for i in range(3)]
    items = [encode_page(p.image, p.markdown, processor, builder, 2, 448, p.lines) for p in pages]
    batch = encoded_batch(items, builder, processor)
    model = _mini_model(cfg, builder)
    sub = 3  # few frames per column: some lines cannot be aligned
    ltc = TextLineCTC(model, 1.0, sub)
    loss = model(**model_inputs(batch)).loss
    feats = ltc.features
    aux = ltc.loss(batch["image_grid_thw"], batch["line_geom"], batch["line_chars"], 2)
    assert torch.isfinite(aux) and aux > 0 and ltc.features is None
    sizes = (batch["image_grid_thw"].prod(-1) // 4).tolist()
    span = sub * CTC_CLASSES
    seqs, targets, skipped = [], [], 0
    for i, x in enumerate(torch.split(feats, sizes)):
        _, h, w = batch["image_grid_thw"][i].tolist()
        grid = x.view(h // 2, w // 2, -1)
        for k, (token, ncols, next_row, bucket, n, min_frames) in enumerate(items[i]["line_geom"].tolist()):
            start = int(items[i]["line_geom"][:k, 4].sum())
            target = items[i]["line_chars"][start:start + n].tolist()
            assert ctc_min_frames(target) == min_frames
            if ncols * sub < min_frames:
                skipped += 1
                continue
            r0, c0 = divmod(token, w // 2)
            r1 = r0 + (1 if next_row else 0)
            frames = []
            for c in range(c0, c0 + ncols):
                out = F.linear(torch.cat([grid[r0, c], grid[r1, c]]), ltc.head.weight[bucket * span:(bucket + 1) * span],
                               ltc.head.bias[bucket * span:(bucket + 1) * span])
                frames.append(out.view(sub, CTC_CLASSES))
            seqs.append(torch.cat(frames).log_softmax(-1))
            targets.append(target)
    assert seqs and skipped, (len(seqs), skipped)
    assert LINE_BUCKETS == 4 and ltc.head.weight.shape[0] == 4 * span
    expected = torch.stack([F.ctc_loss(lp, torch.tensor(t), [len(lp)], [len(t)], blank=0, reduction="sum") / len(t)
                            for lp, t in zip(seqs, targets)]).mean()
    torch.testing.assert_close(aux, expected, rtol=1e-5, atol=1e-5)
    (loss + aux).backward()
    assert all(p.grad is not None for p in ltc.parameters())
    assert model.model.visual.patch_embed.proj.weight.grad.abs().sum() > 0
    reads = [ctc_greedy(lp.argmax(-1).tolist()) for lp in seqs]
    expected_cer = sum(levenshtein(r, t) for r, t in zip(reads, targets)) / sum(len(t) for t in targets)
    assert ltc.reading_cer(model, batch, 2) == pytest.approx(expected_cer) and expected_cer > 0.5  # untrained


def test_a_new_text_line_head_learns_alone_for_its_head_only_steps(pool, parts):
    """head_only_steps=1: the first loss trains the head only (the vision tower gets no gradient from it), the next
    one reaches the vision tower."""
    from research.ocria_tiny.text_line_ctc import TextLineCTC

    processor, builder = parts
    cfg = load_config(CONFIG, MINI)
    pages = [make_page(60 + i, pool, synth_config(load_config(CONFIG, ["image.target_longest_px=256",
                                                                       "image.max_pixels=65536",
                                                                       "train.text_line_ctc_weight=1.0"])))
             for i in range(2)]
    items = [encode_page(p.image, p.markdown, processor, builder, 2, 448, p.lines) for p in pages]
    batch = encoded_batch(items, builder, processor)
    model = _mini_model(cfg, builder)
    ltc = TextLineCTC(model, 1.0, 8, head_only_steps=1)
    _check_head_learns_alone_first(
        model, batch, ltc, lambda: ltc.loss(batch["image_grid_thw"], batch["line_geom"], batch["line_chars"], 2))


def test_prepare_image_sizes_only_changes_the_pixel_budget_and_nothing_else(tmp_path):
    """prepare --image-sizes-only on a copy of the shipped model folder: the processor files' pixel budget is the
    config's, every other file and setting is as it was (a checkpoint trained with the folder stays valid)."""
    import shutil

    from research.ocria_tiny.train_tiny import main

    model_dir = tmp_path / "model"
    shutil.copytree(MODEL, model_dir, ignore=shutil.ignore_patterns("*.safetensors"))
    assert main(["prepare", "--image-sizes-only", "--model-dir", str(model_dir), "--synth", str(tmp_path / "none"),
                 "--set", "image.max_pixels=589824", "--set", "image.min_pixels=4096"]) == 0
    for f in MODEL.iterdir():
        if f.suffix == ".safetensors":
            continue
        if "preprocessor_config" not in f.name:
            assert (model_dir / f.name).read_bytes() == f.read_bytes(), f.name
            continue
        old, new = json.loads(f.read_text()), json.loads((model_dir / f.name).read_text())
        assert new.pop("size") == {"longest_edge": 589824, "shortest_edge": 4096} != old.pop("size"), f.name
        assert new == old, f.name  # normalisation, patch and merge sizes kept
    assert load_image_processor(model_dir).resized_size(1536, 1188)[0] == 864  # shrunk to fit 768 x 768


def test_ctc_greedy_merges_repeats_then_drops_blanks():
    from research.ocria_tiny.text_line_ctc import ctc_greedy

    assert ctc_greedy([0, 5, 5, 0, 5, 3, 3, 0, 0]) == [5, 5, 3]
    assert ctc_greedy([7, 7, 7]) == [7] and ctc_greedy([0, 0]) == []


def test_vision_tower_has_its_own_learning_rate(parts):
    cfg = load_config(CONFIG, MINI + ["train.vision_lr_mult=3.0"])
    model = _mini_model(cfg, parts[1])
    groups = param_groups(model, cfg["train"])
    vision = {id(p) for p in model.model.visual.parameters()}
    for g in groups:
        assert all((id(p) in vision) == (g["lr_mult"] == 3.0) for p in g["params"])
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_image_use_shows_the_shipped_checkpoint_reads_the_image(pool, parts):
    """The diagnostic on the shipped checkpoint (run F2), on two short pages at its resolution: swapping the images
    raises the answer loss by nats, and the image embeddings vary over tokens. Run 1, the checkpoint shipped before,
    ignored the image (img_gain < 0.01, img_var 1.5e-4), which these bounds reject."""
    from transformers import Qwen3_5ForConditionalGeneration

    processor, builder = parts
    cfg = load_config(CONFIG, [*SHIPPED_PAGES, "data.max_chars=[150,300]"])
    pages = [make_page(cfg["data"]["heldout_seed"] + 300 + i, pool, synth_config(cfg)) for i in range(2)]
    model = Qwen3_5ForConditionalGeneration.from_pretrained(MODEL, dtype=torch.float32)
    items = [encode_page(p.image, p.markdown, processor, builder, 2, 448) for p in pages]
    swapped = [encode_page(q.image, p.markdown, processor, builder, 2, 448) for p, q in zip(pages, pages[::-1])]
    use = image_use(model, encoded_batch(items, builder, processor),
                    encoded_batch(swapped, builder, processor))
    assert use["img_gain"] > 2.0 and use["img_var"] > 0.3, use  # measured here: 4.74 nats, 0.67


def test_set_override_reads_exponent_floats_as_floats():
    cfg = load_config(CONFIG, ["train.lr=1e-3", "train.batch_size=16"])
    assert cfg["train"]["lr"] == 1e-3 and cfg["train"]["batch_size"] == 16
    with pytest.raises(ValueError):
        load_config(CONFIG, ["train.lr=fast"])


def test_cropped_curriculum_pages_keep_all_the_ink(pool):
    cfg = load_config(CONFIG, ["data.curriculum=[{until_page: 10, font_px: [24, 30], max_chars: [20, 60], crop: true}]"])
    assert synth_config(cfg, 0).crop and not synth_config(cfg, 10).crop
    full = make_page(5, pool, dataclasses.replace(synth_config(cfg, 0), crop=False))
    cut = make_page(5, pool, synth_config(cfg, 0))
    assert cut.markdown == full.markdown
    assert cut.image.shape[0] * cut.image.shape[1] < full.image.shape[0] * full.image.shape[1] / 4
    def ink(img):
        return int((img.min(axis=2) < 200).sum())

    assert ink(cut.image) == ink(full.image) > 0
    border = np.concatenate([cut.image[:4].reshape(-1, 3), cut.image[-4:].reshape(-1, 3),
                             cut.image[:, :4].reshape(-1, 3), cut.image[:, -4:].reshape(-1, 3)])
    assert border.min() >= 200  # a margin of paper all round


def test_canvas_px_renders_big_fonts_on_a_wider_page(pool):
    """canvas_px lays a stage's pages out on a bigger canvas: the same fonts in pixels wrap less, and a cropped line
    keeps its glyph size (the full-size canvas is not scaled down to the model's page size before the crop)."""
    stage = "{until_page: 10, font_px: [48, 56], max_chars: [30, 40], crop: true, strict_chars: true"
    narrow = load_config(CONFIG, [f"data.curriculum=[{stage}}}]"])
    wide = load_config(CONFIG, [f"data.curriculum=[{stage}, canvas_px: 2048}}]"])
    sc = synth_config(wide, 0)
    assert sc.target_longest_px == 2048 and sc.max_pixels >= 2048 * 2048 and synth_config(wide, 10) == synth_config(wide)
    rows = {}
    for name, cfg in (("narrow", narrow), ("wide", wide)):
        pages = [make_page(s, pool, synth_config(cfg, 0)) for s in range(4)]
        assert all(min(p.image.shape[:2]) > 0 for p in pages)
        rows[name] = sum(p.image.shape[0] for p in pages)
    assert rows["wide"] < rows["narrow"]  # fewer wrapped lines: shorter crops


def test_strict_chars_pages_stay_within_the_budget(pool):
    """Single-line curriculum pages: max_chars is a hard cap (a table keeps its header and one row), so the first
    block is cut to a few words instead of a whole paragraph."""
    from research.ocria_tiny.synthetic import Block, block_markdown, trim_block

    cfg = load_config(CONFIG, [("data.curriculum=[{until_page: 100, font_px: [24, 30], max_chars: [8, 40], crop: true,"
                                " strict_chars: true}]")])
    loose = dataclasses.replace(synth_config(cfg, 0), strict_chars=False)
    strict_md = [make_page(s, pool, synth_config(cfg, 0)).markdown for s in range(20)]
    loose_len = [len(make_page(s, pool, loose).markdown) for s in range(20)]
    assert max(len(md) for md in strict_md if not md.startswith("|")) <= 40, strict_md
    assert sum(map(len, strict_md)) < sum(loose_len) / 2, (strict_md, loose_len)
    para = Block("paragraph", ("one two three four five six",))
    assert block_markdown(trim_block(para, 14)) == "one two three"
    code = Block("code", ("a = 1", "b = 2", "c = 3"))
    assert trim_block(code, 22).lines == ("a = 1", "b = 2")
    table = Block("table", ("x\ty", "1\t2", "3\t4"))
    assert trim_block(table, 5).lines == ("x\ty", "1\t2")


@pytest.mark.timeout(300)
def _mini_training_setup(pool, tmp_path, overrides: list[str]):
    """A miniature model folder (the shipped tokenizer and processor, a MINI config) and a synth folder with `pool`
    as both text pools."""
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(MODEL, model_dir, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = load_config(CONFIG, MINI + ["image.target_longest_px=256", "image.max_pixels=65536",
                                      "data.max_chars=[40,120]", "train.batch_size=2", "train.num_workers=0"] + overrides)
    hf_config(cfg, special_token_ids(PromptBuilder(model_dir, cfg["prompt"]).tok)).save_pretrained(model_dir)
    synth = write_synth(tmp_path / "synth", heldout=pool, train=pool)
    return cfg, synth, model_dir


def test_profile_mode_times_steps_and_data_wait(pool, tmp_path):
    """`train --profile-steps N`: real steps of a miniature model on real synthetic pages, profiled; no checkpoint.
    Here with the vision tower's attention per image, transformers' own call (train.vision_attention; the other
    training tests run the default, packed)."""
    from research.ocria_tiny.train_tiny import train

    cfg, synth, model_dir = _mini_training_setup(pool, tmp_path, ["train.vision_attention=per_image"])
    out = tmp_path / "out"
    train(cfg, synth, model_dir, out, None, "cpu", profile_steps=2)
    res = json.loads((out / "train_profile.json").read_text())
    assert res["steps"] == 2 and res["batch_size"] == 2 and res["step_ms_median"] > 0 and res["tokens_per_step"] > 0
    assert 0 < res["data_wait_share"] < 1 and res["steps_per_s"] > 0
    assert res["recorded_steps"] == 2  # the 5 warm-up steps record no events
    assert "aten::" in (out / "train_profile.txt").read_text()
    assert not (out / "ckpt").exists()


def test_an_unknown_vision_attention_fails_before_anything_loads(tmp_path):
    from research.ocria_tiny.train_tiny import train

    cfg = load_config(CONFIG, ["train.vision_attention=flash"])
    with pytest.raises(ValueError, match="per_image or packed"):
        train(cfg, tmp_path / "missing_synth", tmp_path / "missing_model", tmp_path / "out", None, "cpu")


def test_chunked_gated_delta_rule_trains_the_same_steps(pool, tmp_path, monkeypatch):
    """train.gated_delta_rule=chunked: the Gated DeltaNet layers run research.ocria_tiny.chunked_gdn during training, and the losses
    of the first two steps (the second after an update from the first's gradients) equal the transformers
    fallback's on the same pages; an unknown value fails before anything loads."""
    import research.ocria_tiny.chunked_gdn
    from research.ocria_tiny.train_tiny import train

    calls = []
    chunked = research.ocria_tiny.chunked_gdn.chunked_gated_delta_rule
    monkeypatch.setattr(research.ocria_tiny.chunked_gdn, "chunked_gated_delta_rule", lambda *a, **k: calls.append(1) or chunked(*a, **k))
    losses = {}
    for gdn in ("transformers", "chunked"):
        cfg, synth, model_dir = _mini_training_setup(pool, tmp_path / gdn, [
            f"train.gated_delta_rule={gdn}", "train.max_run_steps=2", "train.total_train_s=600",
            "train.run_train_s=600", "train.image_check_every=0", "train.log_every=1", "train.eval_pages=0"])
        train(cfg, synth, model_dir, tmp_path / gdn / "run", None, "cpu")
        log = (tmp_path / gdn / "run" / "ckpt" / "train_log.jsonl").read_text().splitlines()
        losses[gdn] = [json.loads(r)["loss"] for r in log]
        assert bool(calls) == (gdn == "chunked"), (gdn, len(calls))
    assert len(losses["chunked"]) == 2 and losses["chunked"] == pytest.approx(losses["transformers"], abs=2e-3), losses
    with pytest.raises(ValueError, match="transformers or chunked"):
        train(load_config(CONFIG, ["train.gated_delta_rule=fla"]), tmp_path / "no_synth", tmp_path / "no_model",
              tmp_path / "out", None, "cpu")


def test_line_ctc_training_logs_its_reading_and_a_resumed_run_keeps_its_head(pool, tmp_path, capsys):
    """A short CPU run on line pages with both CTC losses logs their losses and readings (ctc, ctc_cer, line_ctc,
    line_ctc_cer) and saves the heads beside the weights; a run resumed with no training time left saves the heads it
    loaded, unchanged (fresh heads would differ)."""
    from research.ocria_tiny.text_line_ctc import TextLineCTC
    from research.ocria_tiny.train_tiny import LineCTC, train

    # a paragraph stage with line pages mixed in: the CTC loss trains on those, ctc_cer is checked on held-out ones
    lines = ("data.curriculum=[{until_page: 1000, font_px: [16, 20], max_chars: [200, 300], "
             "mix: {share: 0.5, font_px: [24, 30], max_chars: [8, 30], crop: true, strict_chars: true}}]")
    cfg, synth, model_dir = _mini_training_setup(pool, tmp_path, [
        lines, "train.ctc_weight=1.0", "train.ctc_subframes=3", "train.text_line_ctc_weight=1.0",
        "train.text_line_ctc_subframes=5", "train.text_line_ctc_head_steps=2", "train.total_train_s=600",
        "train.run_train_s=600",
        "train.max_run_steps=6", "train.image_check_every=2", "train.log_every=2", "train.eval_pages=0"])
    train(cfg, synth, model_dir, tmp_path / "run1", None, "cpu")  # 6 steps, however fast this machine is
    ckpt = tmp_path / "run1" / "ckpt"
    assert json.loads((ckpt / "train_state.json").read_text())["step"] == 6  # train.max_run_steps ended the run
    log = [json.loads(x) for x in (ckpt / "train_log.jsonl").read_text().splitlines()]
    assert any("ctc" in r for r in log) and any("ctc_cer" in r for r in log), log  # steps without a line page have none
    assert all("line_ctc" in r for r in log) and all("line_ctc_cer" in r for r in log if "img_gain" in r), log
    head = torch.load(ckpt / LineCTC.HEAD_FILE)
    assert head["weight"].shape[0] == 3 * 96
    line_head = torch.load(ckpt / TextLineCTC.HEAD_FILE)
    assert line_head["weight"].shape == (4 * 5 * 96, 2 * 64)
    spent = {**cfg, "train": {**cfg["train"], "total_train_s": 0.1}}  # less than run 1 took: no time left
    train(spent, synth, model_dir, tmp_path / "run2", ckpt, "cpu")
    state = json.loads((tmp_path / "run2" / "ckpt" / "train_state.json").read_text())
    assert state["step"] == json.loads((ckpt / "train_state.json").read_text())["step"] and state["runs"] == 2
    for k, v in torch.load(tmp_path / "run2" / "ckpt" / LineCTC.HEAD_FILE).items():
        assert torch.equal(v, head[k]), k
    for k, v in torch.load(tmp_path / "run2" / "ckpt" / TextLineCTC.HEAD_FILE).items():
        assert torch.equal(v, line_head[k]), k
    # a checkpoint without its heads (a shipped model with its train state beside it): new heads, learning alone first
    bare = tmp_path / "bare"
    shutil.copytree(ckpt, bare, ignore=shutil.ignore_patterns("*_head.pt"))
    train(spent, synth, model_dir, tmp_path / "run_bare", bare, "cpu")
    assert f"line CTC head: none saved in {bare}: a new head, alone for 100 steps" in capsys.readouterr().out
    assert not torch.equal(torch.load(tmp_path / "run_bare" / "ckpt" / LineCTC.HEAD_FILE)["weight"], head["weight"])
    # more frames per column: the run goes on with new heads of the new shapes instead of failing to load the old ones
    cfg4 = {**spent, "train": {**spent["train"], "ctc_subframes": 4, "text_line_ctc_subframes": 6}}
    train(cfg4, synth, model_dir, tmp_path / "run3", ckpt, "cpu")
    assert torch.load(tmp_path / "run3" / "ckpt" / LineCTC.HEAD_FILE)["weight"].shape[0] == 4 * 96
    assert torch.load(tmp_path / "run3" / "ckpt" / TextLineCTC.HEAD_FILE)["weight"].shape[0] == 4 * 6 * 96


def test_answer_token_noise_swaps_only_answer_tokens_for_plain_ones(small_pages, parts):
    """train.answer_token_noise: about its share of the answer tokens the model reads become random plain tokens;
    prompt, image and special tokens and the labels stay as they were."""
    from research.ocria_tiny.encoding import noisy_answer_inputs

    processor, builder = parts
    items = [encode_page(p.image, p.markdown, processor, builder, 2, 448) for p in small_pages] * 40
    batch = collate(items, builder.ids.endoftext, builder.ids.image_pad)
    ids, labels = batch["input_ids"], batch["labels"]
    n_plain = min(dataclasses.astuple(builder.ids))
    assert noisy_answer_inputs(ids, labels, 0.0, n_plain) is ids
    noisy = noisy_answer_inputs(ids, labels, 0.25, n_plain, torch.Generator().manual_seed(0))
    swappable = (labels != -100) & (ids < n_plain)
    changed = noisy != ids
    assert not (changed & ~swappable).any()  # the prompt, image tokens, <|im_end|> and padding are untouched
    assert (noisy[changed] < n_plain).all()
    share = changed.sum().item() / swappable.sum().item()  # a drawn token equal to the old one counts unchanged
    assert 0.22 < share < 0.26, share
    assert torch.equal(batch["labels"], labels)


def test_answer_token_noise_reaches_the_training_loss(pool, tmp_path):
    """One step of the miniature model on the same pages: two runs without swapped answer inputs log the same loss,
    a run with them another (of the same labels); a share outside [0, 1) fails before anything loads."""
    from research.ocria_tiny.train_tiny import train

    losses = []
    for k, noise in enumerate((0.0, 0.0, 0.5)):
        run = tmp_path / f"run_{k}"
        cfg, synth, model_dir = _mini_training_setup(pool, run, [
            f"train.answer_token_noise={noise}", "train.max_run_steps=1", "train.total_train_s=600",
            "train.run_train_s=600", "train.image_check_every=0", "train.log_every=1", "train.eval_pages=0"])
        train(cfg, synth, model_dir, run / "run", None, "cpu")
        losses.append(json.loads((run / "run" / "ckpt" / "train_log.jsonl").read_text().splitlines()[0])["loss"])
    assert losses[0] == losses[1] != losses[2], losses
    with pytest.raises(ValueError, match="answer_token_noise"):
        train(load_config(CONFIG, ["train.answer_token_noise=1.0"]), tmp_path / "no_synth", tmp_path / "no_model",
              tmp_path / "out", None, "cpu")


def test_every_run_warms_up_a_resumed_one_too(pool, tmp_path):
    """The optimizer's moments are not saved, so a resumed run starts a fresh AdamW: its first steps ramp up to the
    schedule's rate as a new run's do, instead of taking full-sized steps from the resumed step on."""
    from research.ocria_tiny.train_tiny import lr_at, train

    cfg, synth, model_dir = _mini_training_setup(pool, tmp_path, [
        "train.warmup_steps=4", "train.max_run_steps=2", "train.total_train_s=1000000", "train.run_train_s=600",
        "train.image_check_every=0", "train.log_every=1", "train.eval_pages=0"])
    train(cfg, synth, model_dir, tmp_path / "run1", None, "cpu")
    train(cfg, synth, model_dir, tmp_path / "run2", tmp_path / "run1" / "ckpt", "cpu")
    log = [json.loads(x) for x in (tmp_path / "run2" / "ckpt" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    for r, ramp in zip(log, (1 / 4, 2 / 4, 1 / 4, 2 / 4)):  # steps 3 and 4 begin the resumed run
        assert r["lr"] == pytest.approx(lr_at(r["elapsed_s"], cfg["train"]) * ramp, rel=1e-6), log
