"""Cut a page image into blocks of a few text lines, so a small model reads each block on its own and cannot lose its
place on the page.

A full page of look-alike lines (long file paths under one shared root) is where ocria-tiny loses its place and writes
on from memory: the 25 of 192 held-out pages it reads worst carry 58 % of its edits
(bench/results/ocria_tiny_s33_runs.json). A block is cropped as its training's line pages are
(pipeline.synthetic.ink_box). The cut uses the image's ink only (no text layer), so scans read the same way:

- columns: one split at a blank gutter that runs the whole height of the text, near the middle;
- lines: runs of rows with ink in the column (thin runs, i-dots and rules, join their neighbour);
- paragraphs: a gap between lines clearly larger than the column's usual one;
- blocks: paragraphs packed up to `max_lines` lines, longer paragraphs cut into near-equal parts.

`join_block_texts` puts the blocks' answers together again: a paragraph cut in two joins with a space (none after a
line that ends in "/", where paths wrap; a line break before the answer's own markdown and after a code fence),
paragraphs and columns with a blank line.

How the job uses them is the checkpoint's (ocria_info.json block_lines, block_tolerance; model.block_*): blocks only
(tolerance 0), or the whole page too, keeping the page's read unless its length disagrees with the blocks'
(`prefer_blocks`: the page read ran on or skipped lines). A model trained on whole pages and single lines read most
blocks a little worse than whole pages, so session 33 shipped the combination (held-out pages 192-287: 0.091 -> 0.068,
CPU); the model trained on blocks too (session 34, recipe F2UGB) reads blocks alone best: held-out pages 384-479 at
0.0456, against 0.0577 for the combination and 0.0720 whole (H200, fp32; bench/results/ocria_tiny_s34_runs.json).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, TypeVar

import numpy as np

from engine.interface import PageResult
from pipeline.text import markdown_to_text

MARKDOWN_BLOCK_START = re.compile(r"(- |\d+\. |\||#{1,6} |```)")
T = TypeVar("T")
INK_BELOW = 200  # a pixel darker than this in every channel is ink (pipeline.synthetic.ink_box's threshold)


@dataclass(frozen=True)
class BlockReading:
    """How the job reads pages in blocks: blocks of at most `lines` text lines (0: not at all); with `tolerance` 0 the
    blocks only, else the whole page too and the blocks' read taken where the page's differs in length by more than
    `tolerance`; block images in whole tokens of `token_px`."""
    lines: int = 0
    tolerance: float = 0.1  # session 33's pick on held-out pages 288-335; 0: blocks only, no whole-page read
    token_px: int = 32

    @property
    def only(self) -> bool:
        return bool(self.lines) and self.tolerance == 0


@dataclass(frozen=True)
class TextBlock:
    """Rows y0:y1 and columns x0:x1 of the page image (the block's ink, no margin) and how its text joins the text
    before it: "" for the first block, " " inside a paragraph, "\\n\\n" after a paragraph or a column."""
    y0: int
    y1: int
    x0: int
    x1: int
    joins: str


def ink_mask(image: np.ndarray, ink_below: int = INK_BELOW) -> np.ndarray:
    if image.ndim == 2:
        return image < ink_below
    return np.minimum(np.minimum(image[..., 0], image[..., 1]), image[..., 2]) < ink_below


def runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True in a 1-D bool array."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], flags.astype(np.int8), [0]))))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


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


def text_blocks(image: np.ndarray, max_lines: int = 4, ink_below: int = INK_BELOW) -> list[TextBlock]:
    """The page's blocks in reading order (left column, then right)."""
    mask = ink_mask(image, ink_below)
    blocks: list[TextBlock] = []
    for x0, x1 in column_spans(mask):
        column = mask[:, x0:x1]
        lines = text_lines(column)
        if not lines:
            continue
        starts = [True] + paragraph_breaks(lines)
        paragraphs: list[list[tuple[int, int]]] = []
        for line, start in zip(lines, starts):
            if start:
                paragraphs.append([])
            paragraphs[-1].append(line)
        line_px = float(np.median([b - a for a, b in lines]))
        for k, (block_lines, begins) in enumerate(pack(paragraphs, max_lines, line_px)):
            y0, y1 = block_lines[0][0], block_lines[-1][1]
            xs = runs(column[y0:y1].any(axis=0))
            joins = "" if not blocks else ("\n\n" if begins or k == 0 else " ")
            blocks.append(TextBlock(y0, y1, x0 + xs[0][0], x0 + xs[-1][1], joins))
    return blocks


def block_image(image: np.ndarray, block: TextBlock, pad: int = 12, multiple: int = 1) -> np.ndarray:
    """The block's pixels on white paper with at least `pad` pixels on each side (as training's crops), so no part of
    a neighbouring line shows at its edges; more paper makes each side a multiple of `multiple` (a vision token's
    pixels), so the processor takes the block as it is instead of resizing its glyphs."""
    h, w = block.y1 - block.y0, block.x1 - block.x0
    out_h, out_w = (-(-(n + 2 * pad) // multiple) * multiple for n in (h, w))
    top, left = (out_h - h) // 2, (out_w - w) // 2
    out = np.full((out_h, out_w) + image.shape[2:], 255, dtype=image.dtype)
    out[top:top + h, left:left + w] = image[block.y0:block.y1, block.x0:block.x1]
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


def merge_block_results(request_id: str, blocks: list[TextBlock], results: list[PageResult]) -> PageResult:
    """Page `request_id`'s result from its blocks' (read together in one engine call): the answers joined, tokens
    summed, the page's time from its first block's first token to its last block's end; it hit the length limit or a
    loop if any block did."""
    reasons = {r.finish_reason for r in results}
    first = min(r.ttft_s for r in results)
    return PageResult(
        request_id=request_id, text=join_block_texts(blocks, [r.text for r in results]),
        prompt_tokens=sum(r.prompt_tokens for r in results), output_tokens=sum(r.output_tokens for r in results),
        finish_reason=next((f for f in ("length", "loop") if f in reasons), "stop"),
        loop_dropped_tokens=sum(r.loop_dropped_tokens for r in results), ttft_s=first,
        decode_s=max(r.ttft_s + r.decode_s for r in results) - first, total_s=max(r.total_s for r in results))


def page_blocks(image: np.ndarray, max_lines: int, token_px: int) -> tuple[list[TextBlock], list[np.ndarray]]:
    """The page's blocks and their images, sides in whole vision tokens of token_px pixels."""
    blocks = text_blocks(image, max_lines)
    return blocks, [block_image(image, b, multiple=token_px) for b in blocks]


def read_blocks(images: list[np.ndarray], max_lines: int, token_px: int,
                read: Callable[[list[tuple[int, int, np.ndarray]]], list[T]]) -> list[tuple[list[TextBlock], list[T]]]:
    """Each page's blocks and the answers to their images: every block of the pages goes to one call of `read`, as
    (the page's position in `images`, the block's number on its page, its image), and its answers come back in order."""
    pages = [page_blocks(im, max_lines, token_px) for im in images]
    items = [(p, k, crop) for p, (_, crops) in enumerate(pages) for k, crop in enumerate(crops)]
    answers = iter(read(items) if items else [])
    return [(blocks, [next(answers) for _ in blocks]) for blocks, _ in pages]


def prefer_blocks(page_md: str, blocks_md: str, tolerance: float) -> bool:
    """Whether the block read replaces the page's: their plain texts' lengths differ by more than `tolerance` of the
    block read's (the page's read ran on past the text, or left lines out)."""
    page_len, blocks_len = len(markdown_to_text(page_md)), len(markdown_to_text(blocks_md))
    return abs(page_len - blocks_len) > tolerance * max(blocks_len, 1)
