"""Pages cut into blocks of a few text lines (pipeline.blocks): the cut finds the lines and columns the layout drew,
each line falls in one block, and the blocks' answers join into the page's text."""
import numpy as np
import pytest

from conftest import CORPUS, require
from pipeline.blocks import (TextBlock, block_image, column_spans, ink_mask, join_block_texts, margin_strips, read_blocks, reading_regions, text_blocks, text_lines)

SEEDS = range(40)


def test_a_paragraph_is_cut_into_near_equal_parts_that_join_with_a_space():
    image = np.full((400, 300, 3), 255, np.uint8)
    for k in range(7):  # one paragraph of seven lines, 20 px high, 10 px apart
        image[20 + 30 * k: 40 + 30 * k, 20:280] = 0
    image[20 + 30 * 7 + 60: 20 + 30 * 7 + 80, 20:200] = 0  # a second paragraph after a wide gap
    blocks = text_blocks(image, max_lines=3)
    assert [(b.y0, b.y1) for b in blocks] == [(20, 70), (80, 160), (170, 220), (290, 310)]
    assert [b.joins for b in blocks] == ["", " ", " ", "\n\n"]
    assert blocks[3].x1 == 200


def test_a_thin_mark_joins_its_line():
    image = np.full((200, 300, 3), 255, np.uint8)
    image[20:23, 20:30] = 0  # i-dots 3 px above their line
    image[26:46, 20:280] = 0
    image[60:80, 20:280] = 0
    image[82:84, 20:280] = 0  # an underline just below
    assert text_lines(ink_mask(image)) == [(20, 46), (60, 84)]


def test_no_gutter_no_columns():
    image = np.full((200, 400, 3), 255, np.uint8)
    image[20:40, 20:380] = 0  # a full-width line over two half-width ones
    image[60:80, 20:170] = 0
    image[60:80, 230:380] = 0
    assert column_spans(ink_mask(image)) == [(20, 380)]
    image[20:40, 180:220] = 255  # now a gutter runs the whole height
    assert column_spans(ink_mask(image)) == [(20, 180), (220, 380)]
    assert text_blocks(np.full((50, 50, 3), 255, np.uint8)) == []


def two_column_page(rng, aligned: bool) -> np.ndarray:
    """A full-width title, then two columns of running text (lines filling their column, a paragraph's last line
    short) whose lines sit level with each other's or not, and a footer under the left column only."""
    image = np.full((900, 700, 3), 255, np.uint8)
    image[30:55, 40:660] = 0
    for x0, x1, y in ((40, 330, 100), (370, 660, 100 if aligned else 112)):
        for k in range(22):
            image[y + 30 * k: y + 30 * k + 18, x0: x1 if k % 6 != 5 else x0 + int(rng.integers(60, 200))] = 0
    image[800:818, 40:200] = 0
    return image


@pytest.mark.parametrize("aligned", [False, True])
def test_columns_under_a_full_width_title_are_read_one_after_the_other(aligned):
    image = two_column_page(np.random.default_rng(int(aligned)), aligned)
    mask = ink_mask(image)
    assert column_spans(mask) == [(40, 660)]  # the title crosses the gutter: no whole-height columns
    regions = reading_regions(mask)
    assert [r[2:] for r in regions] == [(40, 660), (40, 330), (370, 660)]
    assert regions[0][:2] == (30, 55) and regions[1][1] == 818  # the footer stays with its column
    blocks = text_blocks(image, max_lines=8)
    assert (blocks[0].x0, blocks[0].x1) == (40, 660)
    sides = [b.x0 >= 370 for b in blocks[1:]]
    assert sides == sorted(sides) and sum(sides) == 3  # left column's blocks, then the right's: 22 lines in 3 blocks
    assert all(b.joins == "\n\n" for b in (blocks[1], blocks[1 + sides.index(True)]))


def test_a_borderless_table_under_a_title_is_read_across():
    rng = np.random.default_rng(5)
    image = np.full((600, 700, 3), 255, np.uint8)
    image[30:55, 40:660] = 0
    for k in range(12):  # rows of short cells, ragged at their right edges, with a wide blank between the columns
        y = 100 + 30 * k
        image[y: y + 18, 40: 40 + int(rng.integers(60, 250))] = 0
        image[y: y + 18, 420: 420 + int(rng.integers(40, 240))] = 0
    mask = ink_mask(image)
    assert reading_regions(mask) == [(0, 600, 40, 660)]
    blocks = text_blocks(image, max_lines=8)
    assert len(blocks) == 3 and all(b.x1 - b.x0 > 500 for b in blocks)  # the title, the rows in two parts


def test_a_real_two_column_paper_under_its_running_head():
    """A journal page whose running head spans both columns: the head, then the left column, then the right."""
    import pymupdf

    require((CORPUS / "pymupdf__2201.00069.pdf").exists(), "../shared/corpus")
    from pipeline.rasterize import render_page

    with pymupdf.open(CORPUS / "pymupdf__2201.00069.pdf") as doc:
        image = render_page(doc[0], 1536, 1536 * 1536)
    mask = ink_mask(image)
    assert len(column_spans(mask)) == 1
    (head, left, right) = reading_regions(mask)
    width = mask.shape[1]
    assert head[1] - head[0] < 0.03 * mask.shape[0] and head[3] - head[2] > 0.8 * width
    assert left[:2] == right[:2] and left[3] < 0.5 * width < right[2]
    assert right[1] - left[0] > 0.8 * mask.shape[0]


def page_with_margin_stamp(stamp: str, rotate: int) -> np.ndarray:
    """A page of body text with `stamp` set down its left margin (PyMuPDF's rotate: 90 reads upwards, 270 down)."""
    import pymupdf

    from pipeline.rasterize import render_page

    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    body = "The committee met on Tuesday to review the budget and the quarterly figures. " * 24
    page.insert_textbox(pymupdf.Rect(90, 72, 540, 720), body, fontsize=11, fontname="tiro")
    page.insert_text((40, 600) if rotate == 90 else (32, 200), stamp, fontsize=10, rotate=rotate, fontname="helv")
    image = render_page(page, 1536, 1536 * 1536)
    doc.close()
    return image


@pytest.mark.parametrize("rotate", [90, 270])
def test_a_margin_stamp_is_read_last_and_turned_upright(rotate):
    image = page_with_margin_stamp("arXiv:2201.00069v1 [astro-ph.HE] 3 Jan 2022, Downloaded from the archive", rotate)
    mask = ink_mask(image)
    (x0, x1), = margin_strips(mask)
    assert x1 < 0.1 * image.shape[1]
    blocks = text_blocks(image, max_lines=8)
    *body, stamp = blocks
    assert (stamp.x0, stamp.x1, stamp.joins) == (x0, x1, "\n\n") and all(b.x0 > x1 for b in body)
    assert stamp.quarter_turns == (-1 if rotate == 90 else 1)  # the turn that undoes PyMuPDF's
    turned = block_image(image, stamp)
    assert turned.shape[1] > 10 * turned.shape[0]  # one line, lying down
    assert len(body) >= 3 and all(b.y1 - b.y0 < 0.4 * image.shape[0] for b in body)  # body lines not joined by the stamp


def test_a_column_of_list_bullets_is_no_margin_strip():
    image = np.full((800, 600, 3), 255, np.uint8)
    for k in range(12):  # bullets 10 px wide at the left, items beside them
        image[40 + 60 * k: 50 + 60 * k, 30:40] = 0
        image[35 + 60 * k: 55 + 60 * k, 70:560] = 0
    assert margin_strips(ink_mask(image)) == []


def paragraph_image(lines: int = 8) -> np.ndarray:
    import pymupdf

    from pipeline.rasterize import render_page

    doc = pymupdf.open()
    page = doc.new_page(width=420, height=300)
    for k in range(lines):
        page.insert_text((20, 30 + 16 * k), f"Line {k} of the minutes: the budget was approved as tabled.", fontsize=11)
    image = render_page(page, 1536, 1536 * 1536, 24.0)
    doc.close()
    return image


@pytest.mark.parametrize("halves_longer", [False, True])
def test_a_block_that_runs_on_is_read_again_in_halves(halves_longer):
    image = paragraph_image()
    calls = []

    def read(items):
        calls.append([(p, k) for p, k, _ in items])
        if len(calls) == 1:  # the model loses its place and writes on
            return ["the budget was approved " * 40 for _ in items]
        return [("approved " * 200 if halves_longer else f"half {k}") for _, k, _ in items]

    [(blocks, answers, spent)] = read_blocks([image], 8, 32, read)
    assert calls[0] == [(0, "0")] and calls[1] == [(0, "1"), (0, "2")]  # halves numbered on after the page's one block
    if halves_longer:
        assert len(blocks) == 1 and answers == ["the budget was approved " * 40] and len(spent) == 2
    else:
        assert [b.joins for b in blocks] == ["", " "] and answers == ["half 1", "half 2"]
        assert spent == ["the budget was approved " * 40]
        assert blocks[0].y0 < blocks[1].y0 and all(4 >= len(text_lines(ink_mask(image[b.y0:b.y1, b.x0:b.x1])))
                                                 for b in blocks)
    sizes = []

    def plain(items):
        sizes.append(len(items))
        return ["Line 0 of the minutes"] * len(items)

    read_blocks([image], 8, 32, plain)
    assert sizes == [1]  # an answer within the ink's bound: one call, nothing read again


def test_blocks_read_at_several_sizes_are_voted_and_settled_blocks_read_no_further():
    """Three sizes: the first round reads two; a block whose two reads agree is settled, the others are read at the
    third size and voted on (the reader here answers by the label it is given: a test of the rounds, not the model)."""
    from dataclasses import replace

    from pipeline.blocks import scaled_block

    image = _text_page(1)
    answers = {"": "the cat sat", "0.9": "the cot sat", "1.1": "tha cat sat"}  # block k: "k", then "k@size"
    calls = []

    def read(items):
        calls.append([k for _, k, _ in items])
        return ["same words" if k.startswith("1") else answers[k.partition("@")[2]] for _, k, _ in items]

    [(blocks, got, spent)] = read_blocks([image], 2, 32, read, block_scales=(1.0, 0.9, 1.1))
    assert len(blocks) == 3 and spent == []
    assert calls == [["0", "0@0.9", "1", "1@0.9", "2", "2@0.9"], ["0@1.1", "2@1.1"]]
    assert got == ["the cat sat", "same words", "the cat sat"]
    [(_, once, _)] = read_blocks([image], 2, 32, lambda items: ["x" for _ in items])
    assert once == ["x", "x", "x"]
    # with the page drawn at the other sizes (views), the blocks are cut from them where they lie there
    views = [np.kron(image, np.ones((2, 2, 1), np.uint8)), image[::2, ::2]]
    crops = {}

    def keep(items):
        crops.update({k: c for _, k, c in items})
        return ["a", "b"] * (len(items) // 2) if len(items) > 3 else ["c"] * len(items)

    read_blocks([image], 2, 32, keep, block_scales=(1.0, 2.0, 0.5), views=[views])
    for k, b in enumerate(blocks):
        assert np.array_equal(crops[f"{k}@2"], block_image(views[0], scaled_block(b, image, views[0]), multiple=32))
        assert np.array_equal(crops[f"{k}@0.5"], block_image(views[1], scaled_block(b, image, views[1]), multiple=32))
        assert scaled_block(b, image, views[0]) == replace(b, y0=2 * b.y0, y1=2 * b.y1, x0=2 * b.x0, x1=2 * b.x1)


def test_a_block_image_at_another_size():
    image = np.full((60, 100, 3), 255, np.uint8)
    image[20:40, 10:90] = 0
    block = TextBlock(20, 40, 10, 90, "")
    out = block_image(image, block, pad=4, scale=0.5)
    assert out.shape == (10 + 8, 40 + 8, 3) and (out[4:14, 4:44] < 128).all()
    assert block_image(image, block, pad=4, scale=1.5, multiple=32).shape == (64, 128, 3)


def test_a_block_image_is_its_pixels_on_white_paper():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (97, 131, 3), dtype=np.uint8)
    block = TextBlock(10, 40, 5, 77, "")
    out = block_image(image, block, pad=7)
    assert out.shape == (30 + 14, 72 + 14, 3)
    assert (out[7:37, 7:79] == image[10:40, 5:77]).all()
    out[7:37, 7:79] = 255
    assert (out == 255).all()
    out = block_image(image, block, pad=7, multiple=32)  # paper added evenly up to whole tokens
    assert out.shape == (64, 96, 3)
    assert (out[17:47, 12:84] == image[10:40, 5:77]).all() and (out[:17] == 255).all() and (out[:, 84:] == 255).all()


def test_block_texts_join_as_the_page_wrote_them():
    b = [TextBlock(0, 1, 0, 1, j) for j in ("", " ", " ", "\n\n", " ", " ")]
    texts = ["Files: libs/type_traits/", "include/boost/x.hpp and", "- second item", "## Heading", "", "end"]
    assert join_block_texts(b, texts) == ("Files: libs/type_traits/include/boost/x.hpp and\n- second item\n\n"
                                          "## Heading end")
    assert join_block_texts(b[:2], ["", "first"]) == "first"
    # a closing fence ends its line (heldout_0097: "``` src/basic/..." made the rest of the page code)
    assert join_block_texts(b[:2], ["```\nx = 1\n```", "src/basic/a.h"]) == "```\nx = 1\n```\nsrc/basic/a.h"


def _info_model(folder, info: dict | None, processor: bool = True):
    """models/ocria-tiny's small files with another ocria_info.json (the weights are not needed to plan)."""
    import json
    import shutil

    from conftest import ROOT

    folder.mkdir(parents=True)
    for f in (ROOT / "models" / "ocria-tiny").iterdir():
        if f.suffix != ".safetensors" and (processor or f.name != "preprocessor_config.json"):
            shutil.copy(f, folder / f.name)
    (folder / "ocria_info.json").write_text(json.dumps(info or {}))
    return str(folder)


def test_the_job_reads_in_blocks_as_the_checkpoint_says_unless_configured(tmp_path):
    from pipeline.blocks import BlockReading
    from pipeline.checkpoint import CheckpointError
    from pipeline.page_reading import block_reading
    from pipeline.config import JobConfig

    def job(**model):
        return JobConfig.model_validate({"input": {"uris": ["samples"]}, "model": model})

    named = _info_model(tmp_path / "named", {"block_lines": 8, "block_tolerance": 0.2})
    assert block_reading(job(), named) == BlockReading(8, 0.2, 32)
    assert block_reading(job(block_lines=0), named).lines == 0
    assert block_reading(job(block_lines=5, block_tolerance=0.3), named) == BlockReading(5, 0.3, 32)
    silent = _info_model(tmp_path / "silent", {})
    assert block_reading(job(), silent) == BlockReading(0, 0.1, 1)
    assert block_reading(job(block_lines=4), silent) == BlockReading(4, 0.1, 32)
    bare = _info_model(tmp_path / "bare", {"block_lines": 8}, processor=False)
    with pytest.raises(CheckpointError, match="preprocessor_config.json"):
        block_reading(job(), bare)
    assert block_reading(job(block_tolerance=0), named) == BlockReading(8, 0.0, 32)
    assert block_reading(job(block_tolerance=0), named).only and not block_reading(job(), named).only
    assert not block_reading(job(block_lines=0, block_tolerance=0), named).only
    with pytest.raises(ValueError):
        job(block_tolerance=-0.1)
    assert block_reading(job(), named).block_scales == (1.0,)
    assert block_reading(job(block_scales=[1, 0.9]), named).block_scales == (1.0, 0.9)
    voted = _info_model(tmp_path / "voted", {"block_lines": 8, "block_scales": [1.0, 0.9375, 1.0625]})
    assert block_reading(job(), voted).block_scales == (1.0, 0.9375, 1.0625)
    assert block_reading(job(block_scales=[1]), voted).block_scales == (1.0,)
    for bad in ([], [1.0, 9], "1", [0.9, 1.0], [1.0, 1.0]):
        broken = _info_model(tmp_path / f"broken{abs(hash(str(bad)))}", {"block_lines": 8, "block_scales": bad})
        with pytest.raises(CheckpointError, match="block_scales"):
            block_reading(job(), broken)
    with pytest.raises(ValueError, match="block_scales"):
        job(block_scales=[1.0, 0.1])
    from conftest import ROOT  # the shipped model reads blocks only (session 34, R7, R8), at five sizes (R18, R20)
    shipped = BlockReading(8, 0.0, 32, (1.0, 0.9375, 1.0625, 0.875, 1.125))
    assert block_reading(job(), str(ROOT / "models" / "ocria-tiny")) == shipped


def _text_page(seed: int) -> np.ndarray:
    """A page image of dark bars laid out as text lines: two paragraphs of a few lines."""
    rng = np.random.default_rng(seed)
    image = np.full((224, 160, 3), 255, np.uint8)
    y = 12
    for para in (3 + seed % 3, 2):
        for _ in range(para):
            image[y:y + 12, 10:10 + int(rng.integers(60, 140))] = rng.integers(0, 120)
            y += 18
        y += 20
    return image


def test_the_parse_stage_reads_blocks_beside_or_instead_of_the_page(tiny_checkpoint, tmp_path):
    """Pages read whole and in blocks by one engine (a random model: the answers are arbitrary, which reads are made
    and which is kept is what is tested): a huge tolerance keeps every page read, a tiny one takes the blocks' read
    wherever the two lengths differ at all, both counting the blocks' tokens; tolerance 0 reads blocks only. A blank
    page has no blocks to cut and is read whole in every mode."""
    import pyarrow as pa

    from engine.interface import PageRequest, SamplingParams
    from pipeline.blocks import BlockReading, join_block_texts, page_blocks
    from pipeline.config import StorageConfig
    from pipeline.schema import RASTER_SCHEMA, empty_row
    from pipeline.stages import ParseStage
    from pipeline.text import markdown_to_text

    images = [_text_page(s) for s in range(3)] + [np.full((96, 128, 3), 255, np.uint8)]
    batch = pa.Table.from_pylist([
        empty_row(RASTER_SCHEMA, uri="file:///d.pdf", sha256="ab" * 32, page_index=i, page_count=4, total_pages=4,
                  status="ok", image=im.tobytes(), image_height=im.shape[0], image_width=im.shape[1], text_layer="",
                  raster_s=0.01) for i, im in enumerate(images)], schema=RASTER_SCHEMA)
    sampling = {"max_tokens": 12, "temperature": 0.0}

    def read(blocks: BlockReading):
        stage = ParseStage(run_id="r", backend_name="native", checkpoint=str(tiny_checkpoint), storage=StorageConfig(),
                           cache_dir=str(tmp_path), device="cpu", dtype="float32", sampling=sampling, prompt="Read.",
                           fallback_to_text_layer=False, options={"max_num_seqs": 4, "num_blocks": 256},
                           block_reading=blocks)
        rows = stage(batch).to_pylist()
        joined = []
        for im in images:  # the blocks' read, made here on the same engine
            cut, crops = page_blocks(im, blocks.lines or 2, 32)
            res = stage.backend.parse([PageRequest(f"c{k}", c, "Read.", SamplingParams(**sampling))
                                       for k, c in enumerate(crops)])
            joined.append(join_block_texts(cut, [r.text for r in res]) if crops else None)
        stage.backend.close()
        return rows, joined

    plain, _ = read(BlockReading(0))
    kept, _ = read(BlockReading(2, 1e9, 32))
    taken, joined = read(BlockReading(2, 1e-9, 32))
    only, _ = read(BlockReading(2, 0.0, 32))
    assert joined[-1] is None and all(j is not None for j in joined[:-1])
    assert [r["read_by"] for r in plain] == [r["read_by"] for r in kept] == ["page"] * 4
    assert [r["text"] for r in kept] == [r["text"] for r in plain]
    assert [r["read_by"] for r in only] == ["blocks"] * 3 + ["page"]
    assert [r["text"] for r in only] == joined[:-1] + [plain[-1]["text"]]
    for p, k, t, o, j in zip(plain, kept, taken, only, joined):
        if j is None:  # the blank page: its own read alone
            timeless = [{f: v for f, v in r.items() if not f.endswith(("_s", "_unix"))} for r in (p, k, t, o)]
            assert all(r == timeless[0] for r in timeless)
            continue
        assert k["prompt_tokens"] > p["prompt_tokens"] and t["prompt_tokens"] == k["prompt_tokens"]
        assert o["prompt_tokens"] == k["prompt_tokens"] - p["prompt_tokens"] and o["status"] == "ok"
        differ = len(markdown_to_text(p["text"])) != len(markdown_to_text(j))
        assert (t["read_by"], t["text"]) == (("blocks", j) if differ else ("page", p["text"]))
    assert "blocks" in [t["read_by"] for t in taken]


def test_block_results_merge_into_one_page_result():
    """A page read in blocks: texts joined as join_block_texts does, tokens summed, the page hit the length limit if any
    block did, its time from the first block's first token to the last block's end."""
    from engine.interface import PageResult
    from pipeline.blocks import TextBlock, merge_block_results

    blocks = [TextBlock(0, 10, 0, 50, ""), TextBlock(12, 20, 0, 50, " "), TextBlock(40, 50, 0, 50, "\n\n")]
    results = [PageResult("d:0:block0", "first half", 40, 5, "stop", ttft_s=0.2, decode_s=0.3, total_s=0.5),
               PageResult("d:0:block1", "of it", 30, 4, "length", loop_dropped_tokens=2, ttft_s=0.1, decode_s=0.6,
                          total_s=0.7),
               PageResult("d:0:block2", "Next.", 20, 3, "loop", ttft_s=0.15, decode_s=0.2, total_s=0.35)]
    page = merge_block_results("d:0", blocks, results)
    assert (page.request_id, page.text) == ("d:0", "first half of it\n\nNext.")
    assert (page.prompt_tokens, page.output_tokens, page.loop_dropped_tokens) == (90, 12, 2)
    assert page.finish_reason == "length"
    assert merge_block_results("d:0", blocks[::2], results[::2]).finish_reason == "loop"
    assert merge_block_results("d:0", blocks[:1], results[:1]).finish_reason == "stop"
    assert (page.ttft_s, page.total_s) == (0.1, 0.7) and abs(page.decode_s - 0.6) < 1e-12


def test_a_block_read_at_several_sizes_is_one_result():
    from engine.interface import PageResult
    from pipeline.blocks import voted_result

    reads = [PageResult("d:0:block0", "the cat sot", 40, 5, "stop", ttft_s=0.2, decode_s=0.3, total_s=0.5),
             PageResult("d:0:block0@0.9", "tha cat sat", 30, 4, "stop", loop_dropped_tokens=1, ttft_s=0.1,
                        decode_s=0.6, total_s=0.7),
             PageResult("d:0:block0@1.1", "the cot sat", 50, 6, "length", ttft_s=0.3, decode_s=0.1, total_s=0.4)]
    one = voted_result(reads)
    assert (one.request_id, one.text, one.finish_reason) == ("d:0:block0", "the cat sat", "stop")
    assert (one.prompt_tokens, one.output_tokens, one.loop_dropped_tokens) == (120, 15, 1)
    assert (one.ttft_s, one.total_s) == (0.1, 0.7) and abs(one.decode_s - 0.6) < 1e-12
    failed = voted_result(reads[:2] + [PageResult("d:0:block0@1.1", "", 0, 0, "error", error="boom")])
    assert (failed.finish_reason, failed.error, failed.text) == ("error", "boom", "")


def test_the_parse_stage_votes_on_a_block_read_at_several_sizes(tiny_checkpoint, tmp_path):
    """Blocks only at three sizes on one engine (a random model: its answers are arbitrary): each page's text is the
    join of its blocks' votes over three reads made here on the same engine, from the page's views where the row
    has them (else resized crops), and it counts every read's tokens."""
    import pyarrow as pa
    from PIL import Image

    from engine.interface import PageRequest, SamplingParams
    from pipeline.blocks import BlockReading, block_image, scaled_block, text_blocks
    from pipeline.config import StorageConfig
    from pipeline.schema import RASTER_SCHEMA, empty_row
    from pipeline.stages import ParseStage
    from pipeline.vote import vote

    scales = (1.0, 0.75, 1.5)
    images = [_text_page(s) for s in range(2)]
    views = [[np.asarray(Image.fromarray(im).resize((round(im.shape[1] * z), round(im.shape[0] * z))))
              for z in scales[1:]] for im in images[:1]] + [[]]  # the second page comes without views
    batch = pa.Table.from_pylist([
        empty_row(RASTER_SCHEMA, uri="file:///d.pdf", sha256="cd" * 32, page_index=i, page_count=2, total_pages=2,
                  status="ok", image=im.tobytes(), image_height=im.shape[0], image_width=im.shape[1], text_layer="",
                  raster_s=0.01, views=[{"image": v.tobytes(), "height": v.shape[0], "width": v.shape[1]} for v in vs])
        for i, (im, vs) in enumerate(zip(images, views))], schema=RASTER_SCHEMA)
    sampling = {"max_tokens": 6, "temperature": 0.0}
    stage = ParseStage(run_id="r", backend_name="native", checkpoint=str(tiny_checkpoint), storage=StorageConfig(),
                       cache_dir=str(tmp_path), device="cpu", dtype="float32", sampling=sampling, prompt="Read.",
                       fallback_to_text_layer=False, options={"max_num_seqs": 8, "num_blocks": 256},
                       block_reading=BlockReading(2, 0.0, 32, scales))
    rows = stage(batch).to_pylist()
    for row, im, vs in zip(rows, images, views):
        blocks = text_blocks(im, 2)
        crops = [[block_image(im, b, multiple=32)] + [block_image(v, scaled_block(b, im, v), multiple=32) if vs else
                                                      block_image(im, b, multiple=32, scale=z)
                                                      for v, z in zip(vs or [None] * 2, scales[1:])] for b in blocks]
        reads = [stage.backend.parse([PageRequest(f"s{k}", c, "Read.", SamplingParams(**sampling))
                                      for k, c in enumerate(cs)]) for cs in crops]
        assert row["read_by"] == "blocks" and row["status"] == "ok"
        assert row["text"] == join_block_texts(blocks, [vote([r.text for r in rs]) for rs in reads])
        first_round = sum(r.prompt_tokens for rs in reads for r in rs[:2])  # two reads could make a majority of 3
        assert first_round <= row["prompt_tokens"] <= sum(r.prompt_tokens for rs in reads for r in rs)
    stage.backend.close()
