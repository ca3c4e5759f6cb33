"""pipeline.blocks on synthetic pages whose layout is known: the cut finds the lines and columns the layout drew,
each line in one block; the evaluation reader reads blocks as the job does."""
import numpy as np
import pytest

from pipeline.blocks import column_spans, ink_mask, join_block_texts, page_blocks, ran_on, text_blocks, text_lines
from research.ocria_tiny.synthetic import SynthConfig, TextPool, column_rects, make_page
from test_blocks import _text_page  # noqa: E402 (tests/ is on the path: see conftest)

SEEDS = range(40)


@pytest.fixture(scope="module")
def pages(licence_prose):
    """Synthetic pages at the shipped model's page size, with where each text line lies; two columns wherever the page
    is wide enough."""
    pool = TextPool(prose=licence_prose, code=[["def area(r):", "    return 3.14159 * r * r"]])
    cfg = SynthConfig(target_longest_px=1536, max_pixels=1536 * 1536, font_px=(20.0, 36.0), max_chars=(150, 1300),
                      two_columns=1.0, text_lines=True)
    return [make_page(seed, pool, cfg) for seed in SEEDS]


def layout_rows(lines, x0=0.0, x1=np.inf) -> list[tuple[float, float]]:
    """The page's text lines within columns x0..x1 grouped into rows (a table's cells side by side are one row)."""
    rows: list[list[float]] = []
    for ln in sorted((ln for ln in lines if x0 <= (ln.x0 + ln.x1) / 2 < x1), key=lambda ln: ln.y0):
        if rows and ln.y0 < rows[-1][1] - 0.3 * (ln.y1 - ln.y0):
            rows[-1][1] = max(rows[-1][1], ln.y1)
        else:
            rows.append([ln.y0, ln.y1])
    return [tuple(r) for r in rows]


def right_column_px(page) -> float:
    """Where the layout's second column begins in the image (beyond the page for one column)."""
    rects = column_rects(page.style)
    return rects[1].x0 * page.image.shape[1] / page.style.width_pt - 1 if len(rects) == 2 else np.inf


def test_the_cut_finds_the_columns_and_lines_the_layout_drew(pages):
    two = 0
    for p in pages:
        mask = ink_mask(p.image)
        spans = column_spans(mask)
        used = 1 + any(ln.x0 >= right_column_px(p) for ln in p.lines)  # a short page fills its left column only
        assert len(spans) == used, p.seed
        two += used == 2
        for x0, x1 in spans:
            found = text_lines(mask[:, x0:x1])
            rows = layout_rows(p.lines, x0 - 1, x1 + 1)
            line_px = np.median([b - a for a, b in found])
            held = [[r for r in rows if a <= (r[0] + r[1]) / 2 < b] for a, b in found]
            assert sum(map(len, held)) == len(rows), (p.seed, x0)  # each row's middle in one found line
            for (a, b), h in zip(found, held):  # one row each, but a table's borders join its rows
                assert len(h) == 1 or (b - a > 1.5 * line_px and len(h) > 1), (p.seed, a, b, h)
    assert 5 <= two < len(pages)  # both layouts were tried


@pytest.mark.parametrize("max_lines", [1, 3, 4])
def test_each_line_falls_in_one_block_of_at_most_max_lines(pages, max_lines):
    for p in pages:
        blocks = text_blocks(p.image, max_lines)
        assert blocks[0].joins == "" and all(b.joins in (" ", "\n\n") for b in blocks[1:])
        mask = ink_mask(p.image)
        for b in blocks:  # no more lines than max_lines, unless one tall run of ink (a bordered table) is the block
            found = text_lines(mask[b.y0:b.y1, b.x0:b.x1])
            assert len(found) <= max_lines or len(found) == 1, p.seed
        for ln in p.lines:
            cy, cx = (ln.y0 + ln.y1) / 2, (ln.x0 + ln.x1) / 2
            holders = [b for b in blocks if b.y0 <= cy < b.y1 and b.x0 <= cx < b.x1]
            assert len(holders) == 1, (p.seed, ln.text)
        # reading order: down the left column, then down the right
        keys = [(b.x0 >= right_column_px(p), b.y0) for b in blocks]
        assert keys == sorted(keys), p.seed


def test_the_text_a_block_holds_never_counts_as_running_on(pages):
    """Each block's own text, from the layout's line boxes, stays within what its glyph runs allow (`ran_on`), and an
    answer three times as long does not."""
    measured = 0
    for p in pages:
        for b in text_blocks(p.image, 8):
            text = " ".join(ln.text for ln in p.lines if b.y0 <= (ln.y0 + ln.y1) / 2 < b.y1 and b.x0 <= (ln.x0 + ln.x1) / 2 < b.x1)
            assert not ran_on(text, b), (p.seed, b)
            if b.glyphs >= 20:
                measured += 1
                assert ran_on(" ".join([text] * 3), b), (p.seed, b)
    assert measured > 50


def test_the_eval_reader_reads_blocks_and_chooses_as_the_job_does():
    """research.ocria_tiny.eval_ocr.BlockReader around a stand-in reader whose whole-page answers run on (500 letters) and whose block
    answers are short: blocks only, or the whole page unless the lengths disagree by more than the tolerance."""
    from types import SimpleNamespace

    from research.ocria_tiny.eval_ocr import BlockReader

    class RunOnReader:
        processor = SimpleNamespace(patch_size=16, merge_size=2)

        def read(self, images, max_new_tokens=512):
            return ["x" * 500 if im.shape[0] > 100 else f"line {im.shape[1]}" for im in images]

    pages = [_text_page(s) for s in range(3)]
    cut = [page_blocks(im, 2, 32) for im in pages]
    by_blocks = [join_block_texts(bs, [f"line {c.shape[1]}" for c in crops]) for bs, crops in cut]
    assert BlockReader(RunOnReader(), 2).read(pages) == by_blocks
    lenient = BlockReader(RunOnReader(), 2, tolerance=100.0)
    assert lenient.read(pages) == ["x" * 500] * 3 and lenient.chose_blocks == [False] * 3
    strict = BlockReader(RunOnReader(), 2, tolerance=0.5)
    assert strict.read(pages) == by_blocks and strict.chose_blocks == [True] * 3
