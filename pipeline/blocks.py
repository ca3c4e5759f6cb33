"""Cut a page image into blocks of a few text lines, so a small model reads each block on its own and cannot lose its
place on the page.

A full page of look-alike lines (long file paths under one shared root) is where ocria-tiny loses its place and writes
on from memory, and those few pages carry most of its edits. A block is cropped around its ink with a margin, as the
model's training blocks are. The cut uses the image's ink only (no text layer), so scans read the same way:

- columns: one split at a blank gutter that runs the whole height of the text, near the middle; without one, a
  recursive XY-cut (`reading_regions`) finds columns under a full-width title or running head, as real papers
  set them;
- lines: runs of rows with ink in the column (thin runs, i-dots and rules, join their neighbour);
- paragraphs: a gap between lines clearly larger than the column's usual one;
- blocks: paragraphs packed up to `max_lines` lines, longer paragraphs cut into near-equal parts.

Each block can be read at a few sizes and the reads voted on (`read_at_scales`, pipeline.vote; model.block_scales):
the misreads of one size are mostly not the misreads of another.

`join_block_texts` puts the blocks' answers together again: a paragraph cut in two joins with a space (none after a
line that ends in "/", where paths wrap; a line break before the answer's own markdown and after a code fence),
paragraphs and columns with a blank line.

How the job uses them is the checkpoint's (ocria_info.json block_lines, block_tolerance; model.block_*): blocks only
(tolerance 0), or the whole page too, keeping the page's read unless its length disagrees with the blocks'
(`prefer_blocks`: the page read ran on or skipped lines). A model trained on whole pages reads best with the
combination; one trained on blocks too reads best from blocks alone (docs/decisions.md).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Callable, Sequence, TypeVar

import numpy as np

from engine.interface import PageResult, SpecStats
from pipeline.text import markdown_to_text
from pipeline.vote import majority, vote

MARKDOWN_BLOCK_START = re.compile(r"(- |\d+\. |\||#{1,6} |```)")
T = TypeVar("T")
INK_BELOW = 200  # a pixel darker than this in every channel is ink (research.ocria_tiny.synthetic.ink_box's threshold)


BLOCK_SCALES_RULE = "sizes in [0.25, 4], the first 1 (the page as drawn), none twice"


def valid_block_scales(scales) -> bool:
    """Whether `scales` (a config's or a checkpoint's) can be BlockReading.block_scales."""
    return (isinstance(scales, list) and bool(scales) and scales[0] == 1 and len(set(scales)) == len(scales)
            and all(isinstance(x, (int, float)) and 0.25 <= x <= 4 for x in scales))


@dataclass(frozen=True)
class BlockReading:
    """How the job reads pages in blocks: blocks of at most `lines` text lines (0: not at all); with `tolerance` 0 the
    blocks only, else the whole page too and the blocks' read taken where the page's differs in length by more than
    `tolerance`; block images in whole tokens of `token_px`, each read at `block_scales` and the reads voted on."""
    lines: int = 0
    tolerance: float = 0.1  # 0: blocks only, no whole-page read
    token_px: int = 32
    block_scales: tuple[float, ...] = (1.0,)

    @property
    def only(self) -> bool:
        return bool(self.lines) and self.tolerance == 0

    def images(self, page: np.ndarray) -> list[np.ndarray]:
        """A page's images as a block read sees them: its blocks' crops, or the page itself when not read in blocks."""
        return page_blocks(page, self.lines, self.token_px)[1] if self.lines else [page]


@dataclass(frozen=True)
class TextBlock:
    """Rows y0:y1 and columns x0:x1 of the page image (the block's ink, no margin) and how its text joins the text
    before it: "" for the first block, " " inside a paragraph, "\\n\\n" after a paragraph or a column; turned by
    `quarter_turns` (np.rot90's k) before it is read (a margin's vertical text, `margin_strips`). `glyphs` bounds the
    answer's length (`ran_on`)."""
    y0: int
    y1: int
    x0: int
    x1: int
    joins: str
    quarter_turns: int = 0
    glyphs: int = 0  # runs of ink along its lines, about one a character (`glyph_runs`); 0: not measured


def ink_mask(image: np.ndarray, ink_below: int = INK_BELOW) -> np.ndarray:
    if image.ndim == 2:
        return image < ink_below
    return np.minimum(np.minimum(image[..., 0], image[..., 1]), image[..., 2]) < ink_below


def runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True in a 1-D bool array."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], flags.astype(np.int8), [0]))))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


def extent(flags: np.ndarray) -> tuple[int, int]:
    """[first, last + 1) of the True entries of a 1-D bool array that has some."""
    on = np.flatnonzero(flags)
    return int(on[0]), int(on[-1]) + 1


def column_spans(mask: np.ndarray, min_gutter_frac: float = 0.015, min_side_frac: float = 0.2) -> list[tuple[int, int]]:
    """[x0, x1) of each text column: two where a blank gutter runs the whole height of the ink with at least
    min_side_frac of the ink's width on either side, else one."""
    cols = runs(mask.any(axis=0))
    if not cols:
        return []
    left, right = cols[0][0], cols[-1][1]
    width = right - left
    gaps = [(b, a) for (_, b), (a, _) in zip(cols, cols[1:])]  # blank runs between inked columns
    gaps = [(g0, g1) for g0, g1 in gaps if g1 - g0 >= max(2, min_gutter_frac * width)
            and g0 - left >= min_side_frac * width and right - g1 >= min_side_frac * width]
    if not gaps:
        return [(left, right)]
    g0, g1 = max(gaps, key=lambda g: g[1] - g[0])
    return [(left, g0), (g1, right)]


def margin_strips(mask: np.ndarray, max_width_frac: float = 0.05, min_gap_frac: float = 0.02,
                  min_height_frac: float = 0.3, min_inked_rows: float = 0.5) -> list[tuple[int, int]]:
    """[x0, x1) of the ink at the page's left or right edge that is a margin's vertical text (a journal's download
    stamp, an arXiv identifier): narrower than max_width_frac of the ink's width, min_gap_frac of it apart from the
    rest, taller than min_height_frac of the page, and inked in min_inked_rows of the rows it spans, as a line of
    letters is (a list's bullets are not). Read with the body's lines, every row it passes would join them."""
    cols = runs(mask.any(axis=0))
    if len(cols) < 2:
        return []
    width = cols[-1][1] - cols[0][0]
    out = []
    for (x0, x1), gap in ((cols[0], cols[1][0] - cols[0][1]), (cols[-1], cols[-1][0] - cols[-2][1])):
        rows = runs(mask[:, x0:x1].any(axis=1))
        span = rows[-1][1] - rows[0][0]
        if x1 - x0 < max_width_frac * width and gap >= min_gap_frac * width and \
                span >= min_height_frac * mask.shape[0] and sum(b - a for a, b in rows) >= min_inked_rows * span:
            out.append((x0, x1))
    return out


def upright_turns(strip: np.ndarray) -> int:
    """np.rot90's k that sets a strip of vertical Latin text upright: its letters' tops point to the side with more
    ink beside the x-height core (ascenders and capitals outnumber descenders)."""
    profile = strip.sum(axis=0).astype(float)
    core = np.flatnonzero(profile >= 0.5 * profile.max())
    before, after = profile[:core[0]].sum(), profile[core[-1] + 1:].sum()
    return -1 if before > after else 1  # tops to the left: it reads upwards, a clockwise turn sets it upright


def text_lines(mask: np.ndarray) -> list[tuple[int, int]]:
    """[y0, y1) of each text line of a column's ink mask: runs of inked rows, a run much thinner than the others
    (an i-dot row, a rule, an underline) joined to its nearer neighbour, and runs a sliver apart joined."""
    lines = runs(mask.any(axis=1))
    if len(lines) < 2:
        return lines
    height = float(np.median([b - a for a, b in lines]))
    merged = [lines[0]]
    for a, b in lines[1:]:
        if a - merged[-1][1] <= max(1.0, 0.12 * height):
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    changed = True
    while changed and len(merged) > 1:
        changed = False
        for i, (a, b) in enumerate(merged):
            if b - a >= 0.4 * height:
                continue
            above = a - merged[i - 1][1] if i > 0 else np.inf
            below = merged[i + 1][0] - b if i + 1 < len(merged) else np.inf
            j = i - 1 if above <= below else i + 1
            if min(above, below) > 0.6 * height:
                continue  # a lone mark far from any line: a line of its own
            lo, hi = min(i, j), max(i, j)
            merged[lo:hi + 1] = [(merged[lo][0], merged[hi][1])]
            changed = True
            break
    return merged


def paragraph_breaks(lines: list[tuple[int, int]]) -> list[bool]:
    """For each line after the first: whether a paragraph begins there (its gap clearly above the usual one)."""
    gaps = [b0 - a1 for (_, a1), (b0, _) in zip(lines, lines[1:])]
    if not gaps:
        return []
    usual = float(np.median(gaps))
    height = float(np.median([b - a for a, b in lines]))
    return [g > max(1.6 * usual, usual + 0.35 * height) for g in gaps]


def pack(paragraphs: list[list[tuple[int, int]]], max_lines: int, line_px: float) -> list[tuple[list[tuple[int, int]], bool]]:
    """Blocks of at most max_lines lines, each with whether it begins a paragraph: whole paragraphs packed together,
    a longer one cut into near-equal parts (a part takes nothing else in). A run of ink taller than a line (a table
    with borders, a figure) counts as the lines it spans and is never cut."""
    def weight(lines):
        return sum(max(1, round((b - a) / line_px)) for a, b in lines)

    blocks: list[tuple[list[tuple[int, int]], bool]] = []
    whole = False  # whether the last block holds whole paragraphs only
    for para in paragraphs:
        total = weight(para)
        if total > max_lines:
            share = total / -(-total // max_lines)  # near-equal parts: cut where the lines so far pass k shares
            parts: list[list[tuple[int, int]]] = [[]]
            done = 0
            for line in para:
                w = weight([line])
                if parts[-1] and done + w > len(parts) * share + 0.5:
                    parts.append([])
                parts[-1].append(line)
                done += w
            blocks += [(part, i == 0) for i, part in enumerate(parts)]
            whole = False
        elif whole and weight(blocks[-1][0]) + total <= max_lines:
            blocks[-1] = (blocks[-1][0] + para, True)
        else:
            blocks.append((list(para), True))
            whole = True
    return blocks


def line_height_px(image: np.ndarray, min_lines: int = 3, ink_below: int = INK_BELOW) -> float | None:
    """The median height of the image's inked text lines (every column's), or None with fewer than min_lines: too
    little text to measure its size by."""
    mask = ink_mask(image, ink_below)
    heights = [b - a for x0, x1 in column_spans(mask) for a, b in text_lines(mask[:, x0:x1])]
    return float(np.median(heights)) if len(heights) >= min_lines else None


def widest_gutter(mask: np.ndarray, left: int, right: int, min_gutter: float,
                  min_side: float) -> tuple[int, int] | None:
    """The widest blank run of columns of `mask` between its ink at `left` and `right` that is at least min_gutter
    wide with at least min_side of ink width on either side, or None."""
    inked = mask.any(axis=0)
    best = None
    for g0, g1 in runs(~inked[left:right]):
        g0, g1 = g0 + left, g1 + left
        if g1 - g0 >= min_gutter and g0 - left >= min_side and right - g1 >= min_side and (
                best is None or g1 - g0 > best[1] - best[0]):
            best = (g0, g1)
    return best


def text_column(mask: np.ndarray, min_lines: int, full_width: float = 0.7, min_full_share: float = 0.5) -> bool:
    """Whether a side of a gutter reads as a column of running text: at least min_lines text lines, and at least
    min_full_share of them filling full_width of its width, as a paragraph's lines do and a table column's cells
    (short numbers, ragged labels) do not."""
    lines = text_lines(mask)
    if len(lines) < min_lines:
        return False
    spans = [extent(mask[a:b].any(axis=0)) for a, b in lines]
    return sum(x1 - x0 >= full_width * mask.shape[1] for x0, x1 in spans) >= min_full_share * len(lines)


def reading_regions(mask: np.ndarray, min_column_lines: int = 8, min_side_frac: float = 0.2,
                    depth: int = 2) -> list[tuple[int, int, int, int]]:
    """(y0, y1, x0, x1) of each part of the page read on its own, in reading order.

    A gutter that runs the page's whole height gives its two columns (`column_spans`). Else the page is cut into
    bands at rows blank across it, and a band joins the region above while its ink stays clear of that region's
    gutter (narrowing it), so a two-column body under a full-width title or running head is found and its columns
    read one after the other; a region whose sides do not both read as running text (`text_column`: a borderless
    table, a few aligned lines) is read across, as a page without columns is. Each column is cut the same
    way again, `depth` levels in all (a column of side notes beside the body)."""
    spans = column_spans(mask)
    if len(spans) != 1:
        return [(0, mask.shape[0], x0, x1) for x0, x1 in spans]
    out = band_regions(mask, min_column_lines, min_side_frac, depth)
    return [(0, mask.shape[0]) + spans[0]] if len(out) == 1 else out


def band_regions(mask: np.ndarray, min_column_lines: int, min_side_frac: float,
                 depth: int) -> list[tuple[int, int, int, int]]:
    """`reading_regions`' cut into bands, on a mask with ink."""
    left, right = extent(mask.any(axis=0))
    line_px = float(np.median([b - a for a, b in text_lines(mask[:, left:right])]))
    min_gutter, min_side = max(2.0, 0.5 * line_px), min_side_frac * (right - left)
    regions: list[list] = []  # [y0, y1, gutter or None]
    for y0, y1 in runs(mask.any(axis=1)):
        band = mask[y0:y1]
        if regions and regions[-1][2] is not None:
            g0, g1 = regions[-1][2]
            narrowed = widest_gutter(band[:, g0:g1], 0, g1 - g0, min_gutter, 0)
            if narrowed is not None:  # the band stays clear of the region's gutter: its columns go on
                regions[-1][1:] = [y1, (g0 + narrowed[0], g0 + narrowed[1])]
                continue
        gutter = widest_gutter(band, left, right, min_gutter, min_side)
        if regions and gutter is None and regions[-1][2] is None:
            regions[-1][1] = y1
        else:
            regions.append([y0, y1, gutter])
    out: list[tuple[int, int, int, int]] = []
    for y0, y1, gutter in regions:
        sides = [] if gutter is None else [(left, gutter[0]), (gutter[1], right)]
        if sides and all(text_column(mask[y0:y1, a:b], min_column_lines) for a, b in sides):
            for a, b in sides:
                inner = band_regions(mask[y0:y1, a:b], min_column_lines, min_side_frac, depth - 1) if depth > 1 else []
                out += [(y0 + r0, y0 + r1, a + c0, a + c1) for r0, r1, c0, c1 in inner] if len(inner) > 1 \
                    else [(y0, y1, a, b)]
        elif out and out[-1][2:] == (left, right):
            out[-1] = (out[-1][0], y1, left, right)  # read across, with the region above if that is too
        else:
            out.append((y0, y1, left, right))
    return out


def glyph_runs(mask: np.ndarray, lines: list[tuple[int, int]]) -> int:
    """Runs of inked columns along the lines: about one a printed character (true text stays under 1.5 characters a
    run), or 0 where a line is a tall run of ink (a bordered table's rules join its cells into one run)."""
    heights = [b - a for a, b in lines]
    if not lines or max(heights) > 1.8 * float(np.median(heights)):
        return 0
    return sum(len(runs(mask[a:b].any(axis=0))) for a, b in lines)


def column_blocks(column: np.ndarray, top: int, left: int, max_lines: int, first_joins: str) -> list[TextBlock]:
    """The blocks of one column's ink mask (placed at row `top`, column `left` of the page), the first joining what
    came before with `first_joins`."""
    lines = text_lines(column)
    if not lines:
        return []
    starts = [True] + paragraph_breaks(lines)
    paragraphs: list[list[tuple[int, int]]] = []
    for line, start in zip(lines, starts):
        if start:
            paragraphs.append([])
        paragraphs[-1].append(line)
    line_px = float(np.median([b - a for a, b in lines]))
    blocks = []
    for k, (block_lines, begins) in enumerate(pack(paragraphs, max_lines, line_px)):
        y0, y1 = block_lines[0][0], block_lines[-1][1]
        xs = runs(column[y0:y1].any(axis=0))
        shifted = [(a - y0, b - y0) for a, b in block_lines]
        joins = first_joins if k == 0 else ("\n\n" if begins else " ")
        blocks.append(TextBlock(y0 + top, y1 + top, left + xs[0][0], left + xs[-1][1], joins,
                                glyphs=glyph_runs(column[y0:y1, xs[0][0]:xs[-1][1]], shifted)))
    return blocks


def text_blocks(image: np.ndarray, max_lines: int = 4, ink_below: int = INK_BELOW) -> list[TextBlock]:
    """The page's blocks in reading order (`reading_regions`: left column, then right; margin strips last)."""
    mask = ink_mask(image, ink_below)
    strips = [(x0, x1, mask[:, x0:x1].copy()) for x0, x1 in margin_strips(mask)]
    for x0, x1, _ in strips:
        mask[:, x0:x1] = False
    blocks: list[TextBlock] = []
    for top, bottom, x0, x1 in reading_regions(mask):
        blocks += column_blocks(mask[top:bottom, x0:x1], top, x0, max_lines, "\n\n" if blocks else "")
    for x0, x1, strip in strips:  # after the body, as a line of its own
        y0, y1 = extent(strip.any(axis=1))
        blocks.append(TextBlock(y0, y1, x0, x1, "\n\n" if blocks else "", upright_turns(strip)))
    return blocks


def block_image(image: np.ndarray, block: TextBlock, pad: int = 12, multiple: int = 1,
                scale: float = 1.0) -> np.ndarray:
    """The block's pixels (resized by `scale`) on white paper with at least `pad` pixels on each side (as training's
    crops), so no part of a neighbouring line shows at its edges; more paper makes each side a multiple of `multiple`
    (a vision token's pixels), so the processor takes the block as it is instead of resizing its glyphs."""
    crop = np.rot90(image[block.y0:block.y1, block.x0:block.x1], block.quarter_turns)
    if scale != 1.0:
        from PIL import Image

        size = (max(1, round(crop.shape[1] * scale)), max(1, round(crop.shape[0] * scale)))
        crop = np.asarray(Image.fromarray(np.ascontiguousarray(crop)).resize(size, Image.Resampling.LANCZOS))
    h, w = crop.shape[:2]
    out_h, out_w = (-(-(n + 2 * pad) // multiple) * multiple for n in (h, w))
    top, left = (out_h - h) // 2, (out_w - w) // 2
    out = np.full((out_h, out_w) + image.shape[2:], 255, dtype=image.dtype)
    out[top:top + h, left:left + w] = crop
    return out


def join_block_texts(blocks: list[TextBlock], texts: list[str]) -> str:
    out = ""
    for block, text in zip(blocks, texts):
        text = text.strip()
        if not text:
            continue
        joins = block.joins if out else ""
        if joins == " " and out.endswith("/"):
            joins = ""  # a path wrapped after its slash
        elif joins == " " and (MARKDOWN_BLOCK_START.match(text) or out.rsplit("\n", 1)[-1].startswith("```")):
            # a cut between list items or table rows (the answer's own markdown starts a line), or after a code
            # block's closing fence, which text on its line would turn into an opening one
            joins = "\n"
        out += joins + text
    return out


def merge_block_results(request_id: str, blocks: list[TextBlock], results: list[PageResult],
                        spent: list[PageResult] = ()) -> PageResult:
    """Page `request_id`'s result from its blocks' (read together in one engine call, and the reads set aside,
    `spent`, which cost tokens too): the answers joined, tokens summed, the page's time from its first block's first
    token to its last block's end; it hit the length limit or a loop if any kept block did."""
    reasons = {r.finish_reason for r in results}
    every = list(results) + list(spent)
    first = min(r.ttft_s for r in every)
    return PageResult(
        request_id=request_id, text=join_block_texts(blocks, [r.text for r in results]),
        prompt_tokens=sum(r.prompt_tokens for r in every), output_tokens=sum(r.output_tokens for r in every),
        finish_reason=next((f for f in ("length", "loop") if f in reasons), "stop"),
        loop_dropped_tokens=sum(r.loop_dropped_tokens for r in every), ttft_s=first,
        decode_s=max(r.ttft_s + r.decode_s for r in every) - first, total_s=max(r.total_s for r in every),
        spec=SpecStats.total(r.spec for r in every))


def voted_result(results: list[PageResult]) -> PageResult:
    """One block's reads at several sizes as one result: the texts' vote (pipeline.vote), the tokens of every read;
    failed if any read failed (the page is then read whole)."""
    failed = next((r for r in results if r.finish_reason == "error"), None)
    first = min(r.ttft_s for r in results)
    return PageResult(
        request_id=results[0].request_id, text="" if failed else vote([r.text for r in results]),
        prompt_tokens=sum(r.prompt_tokens for r in results), output_tokens=sum(r.output_tokens for r in results),
        finish_reason="error" if failed else results[0].finish_reason, error=failed.error if failed else None,
        loop_dropped_tokens=sum(r.loop_dropped_tokens for r in results), ttft_s=first,
        decode_s=max(r.ttft_s + r.decode_s for r in results) - first, total_s=max(r.total_s for r in results),
        spec=SpecStats.total(r.spec for r in results))


def page_blocks(image: np.ndarray, max_lines: int, token_px: int) -> tuple[list[TextBlock], list[np.ndarray]]:
    """The page's blocks and their images, sides in whole vision tokens of token_px pixels."""
    blocks = text_blocks(image, max_lines)
    return blocks, [block_image(image, b, multiple=token_px) for b in blocks]


RUN_ON_CHARS_PER_GLYPH = 1.8  # 27 % above the most characters a glyph run held in a block (`glyph_runs`)
RUN_ON_MIN_GLYPHS = 20  # a few glyphs (a list's number, a heading) say too little of the answer's length


def printed_chars(md: str) -> int:
    """The characters of an answer that print: its plain text without whitespace."""
    return len("".join(markdown_to_text(md).split()))


def ran_on(text: str, block: TextBlock) -> bool:
    """Whether a block's answer holds more characters than its ink can: the model lost its place and wrote on (a
    path repeated, text from memory)."""
    return block.glyphs >= RUN_ON_MIN_GLYPHS and printed_chars(text) > RUN_ON_CHARS_PER_GLYPH * block.glyphs


def split_block(image: np.ndarray, block: TextBlock, max_lines: int) -> list[TextBlock]:
    """A block cut again into blocks of at most max_lines lines, the first joining as the block did."""
    mask = ink_mask(image[block.y0:block.y1, block.x0:block.x1])
    return column_blocks(mask, block.y0, block.x0, max_lines, block.joins)


def scaled_block(block: TextBlock, image: np.ndarray, view: np.ndarray) -> TextBlock:
    """The block's place on `view`, the same page as `image` drawn at another size (rounded outwards)."""
    fy, fx = view.shape[0] / image.shape[0], view.shape[1] / image.shape[1]
    return replace(block, y0=math.floor(block.y0 * fy), y1=min(view.shape[0], math.ceil(block.y1 * fy)),
                   x0=math.floor(block.x0 * fx), x1=min(view.shape[1], math.ceil(block.x1 * fx)))


def read_at_scales(images: list[np.ndarray], wanted: list[tuple[int, int, TextBlock]], token_px: int,
                   block_scales: Sequence[float], read: Callable[[list[tuple[int, str, np.ndarray]]], list[T]],
                   text: Callable[[T], str], combine: Callable[[list[T]], T],
                   views: list[list[np.ndarray]] | None = None) -> list[T]:
    """One answer for each wanted block (its page's position in `images`, its number, the block): its image read at
    each of `block_scales` and the answers combined (`combine`, a vote: pipeline.vote). At a scale other than the first
    (the page as drawn) the block is cut from the page's view drawn at that size (`views[page][scale's index - 1]`),
    else its crop is resized. The first reads are the fewest that could hold a majority; a block whose reads agree
    word for word in a majority of `block_scales` is settled (no later read could outvote them), the rest are read at one
    more scale at a time. Each round is one call of `read`, with (page, label, image) items: the label is the block's
    number, then "@scale" after the first scale."""

    def crop(p: int, block: TextBlock, s: int) -> np.ndarray:
        if s and views and views[p]:
            return block_image(views[p][s - 1], scaled_block(block, images[p], views[p][s - 1]), multiple=token_px)
        return block_image(images[p], block, multiple=token_px, scale=block_scales[s])

    answers: list[list[T]] = [[] for _ in wanted]
    todo, done = list(range(len(wanted))), 0
    while todo and done < len(block_scales):
        now = range(done, len(block_scales) // 2 + 1) if done == 0 else range(done, done + 1)
        items = [(p, f"{k}@{block_scales[s]:g}" if s else f"{k}", crop(p, block, s))
                 for p, k, block in (wanted[i] for i in todo) for s in now]
        got = iter(read(items))
        for i in todo:
            answers[i] += [next(got) for _ in now]
        done = now.stop
        todo = [i for i in todo if majority([text(a) for a in answers[i]], len(block_scales)) is None]
    return [a[0] if len(a) == 1 else combine(a) for a in answers]


def read_blocks(images: list[np.ndarray], max_lines: int, token_px: int,
                read: Callable[[list[tuple[int, str, np.ndarray]]], list[T]], text: Callable[[T], str] = str,
                block_scales: Sequence[float] = (1.0,), combine: Callable[[list[T]], T] = vote,
                views: list[list[np.ndarray]] | None = None) -> list[tuple[list[TextBlock], list[T], list[T]]]:
    """Each page's blocks, the answers to their images, and the answers read and set aside. All blocks of the pages
    are read together (`read_at_scales`: at each of `block_scales`, from the pages' `views` where given, the answers
    combined). A block whose answer `ran_on` is read again in halves (numbered on after the page's blocks), and the
    halves' answers (`text` gives an answer's text) take its place where they are shorter together."""
    pages = [text_blocks(im, max_lines) for im in images]
    wanted = [(p, k, b) for p, blocks in enumerate(pages) for k, b in enumerate(blocks)]
    answers = iter(read_at_scales(images, wanted, token_px, block_scales, read, text, combine, views))
    out = [(blocks, [next(answers) for _ in blocks], []) for blocks in pages]
    redo = [(p, k, halves) for p, (blocks, got, _) in enumerate(out) for k, (b, a) in enumerate(zip(blocks, got))
            if ran_on(text(a), b) and len(halves := split_block(images[p], b, max(1, max_lines // 2))) > 1]
    numbers = {p: len(out[p][0]) for p, _, _ in redo}  # halves are numbered on from the page's last block
    wanted = []
    for p, _, halves in redo:
        for h in halves:
            wanted.append((p, numbers[p], h))
            numbers[p] += 1
    again = iter(read_at_scales(images, wanted, token_px, block_scales, read, text, combine, views))
    reread = [[next(again) for _ in halves] for _, _, halves in redo]
    for (p, k, halves), got_halves in reversed(list(zip(redo, reread))):  # from the end: earlier numbers still hold
        blocks, got, spent = out[p]
        if sum(printed_chars(text(a)) for a in got_halves) < printed_chars(text(got[k])):
            spent.append(got[k])
            blocks[k:k + 1], got[k:k + 1] = halves, got_halves
        else:
            spent += got_halves
    return out


def prefer_blocks(page_md: str, blocks_md: str, tolerance: float) -> bool:
    """Whether the block read replaces the page's: their plain texts' lengths differ by more than `tolerance` of the
    block read's (the page's read ran on past the text, or left lines out)."""
    page_len, blocks_len = len(markdown_to_text(page_md)), len(markdown_to_text(blocks_md))
    return abs(page_len - blocks_len) > tolerance * max(blocks_len, 1)
