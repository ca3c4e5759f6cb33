"""Document bytes -> page images (raw uint8 RGB) with PyMuPDF. Pure functions: no Ray, no pydantic.

Pages travel as raw arrays, never PNG: PNG encoding costs ~95 % of render time (environment notes, 2.4).
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pymupdf

from pipeline.diagnose import classify_page_failure, classify_unopened, out_of_memory, warnings_text, what_it_looks_like
from pipeline.redact import redact

# File types PyMuPDF opens by content; the extension only picks the parser.
FILETYPES = {".pdf": "pdf", ".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".tif": "tiff", ".tiff": "tiff"}


class DocumentError(Exception):
    """A document that cannot be rasterized; `kind` groups errors in the stats (pipeline/outcomes.py says what each
    means and whether a later run retries it)."""

    def __init__(self, kind: str, message: str):
        super().__init__(redact(message))  # the message becomes a row of the output
        self.kind = kind


@dataclass(frozen=True)
class PageFailure:
    """One page that could not be loaded or drawn: one error row; the document's other pages are parsed."""

    index: int
    kind: str
    message: str


@dataclass(frozen=True)
class RasterOptions:
    target_longest_px: int = 1288  # olmOCR's choice for page VLMs
    max_pixels: int = 1288 * 1288  # caps huge pages (a 612 x 14295 pt strip) and decompression bombs
    max_pages: int = 500  # pages beyond this are not rendered; the document row says so
    extract_text: bool = True
    # > 0: a page with a text layer is drawn so its body text's em is this many pixels (within max_pixels), the glyph
    # size its reader reads best (a small reader misreads far more at the small end of its training sizes); pages
    # without one keep target_longest_px (unless glyph_from_ink)
    glyph_px: float = 0.0
    # with glyph_px: a page without a text layer (a scan) is drawn once at the target size to measure its text lines'
    # height, then again at glyph_px from that (pipeline.blocks.line_height_px)
    glyph_from_ink: bool = False
    # each page drawn again this many times its size (RenderedPage.views): the sizes its blocks are also read at and
    # voted on (model.block_scales; drawn, not resized: a resized crop reads worse)
    block_scales: tuple[float, ...] = (1.0,)


@dataclass
class RenderedPage:
    index: int
    image: np.ndarray  # H x W x 3 uint8
    text_layer: str
    render_s: float
    views: list[np.ndarray] = field(default_factory=list)  # the page drawn at RasterOptions.block_scales[1:]
    blank: bool = False  # nothing drawn on it (`is_blank`): its row says so and the model does not read it
    warnings: str = ""  # what MuPDF warned while drawing it (warnings_text): a blank page's row keeps it


# A page is blank when no pixel differs from the page's lightest colour by more than this (0-255, any channel): the
# faintest anti-aliased glyph edge of real text is darker. Noise on a scanned empty sheet exceeds it, so such a page is
# read by the model, as a page with content would be.
BLANK_TOLERANCE = 8


def is_blank(image: np.ndarray) -> bool:
    """Whether the drawn page shows nothing: every channel within BLANK_TOLERANCE levels over the whole page."""
    flat = image.reshape(-1, image.shape[-1])
    return bool((flat.max(axis=0).astype(int) - flat.min(axis=0).astype(int)).max() <= BLANK_TOLERANCE)


def filetype_for(uri: str) -> str:
    ext = "." + uri.rsplit(".", 1)[-1].lower() if "." in uri.rsplit("/", 1)[-1] else ""
    if ext not in FILETYPES:
        raise DocumentError("unsupported", f"unsupported file type {ext or '(none)'!r}; expected one of {sorted(FILETYPES)}")
    return FILETYPES[ext]


def render_scale(width_pt: float, height_pt: float, opts: RasterOptions) -> float:
    """Scale from points to pixels: longest side <= target and total pixels <= cap."""
    if width_pt <= 0 or height_pt <= 0:
        raise DocumentError("damaged", f"page has an empty size ({width_pt} x {height_pt} pt)")
    scale = opts.target_longest_px / max(width_pt, height_pt)
    return min(scale, math.sqrt(opts.max_pixels / (width_pt * height_pt)))


# An inked text line's height over its font's em: the median over synthetic pages of many fonts and sizes
# (research/ocria_tiny/results/s34_line_per_em.json)
INK_LINE_PER_EM = 0.969
BODY_PT_RANGE = (2.0, 200.0)  # body sizes outside this are a text layer's oddity, not a font: the page keeps its target


def text_layer_lines(page: pymupdf.Page) -> list[dict]:
    """The lines of the page's text layer (PyMuPDF's "dict" extraction): read once per drawing for both
    `body_font_pt` and `text_turns`."""
    return [line for block in page.get_text("dict", flags=0)["blocks"] for line in block.get("lines", ())]


def body_font_pt(page: pymupdf.Page, lines: list[dict] | None = None) -> float | None:
    """The font size (pt) most of the page's text-layer characters (`lines`, else read here) are set in, or None
    without a text layer. Headings and footnotes are few characters, so the body text decides."""
    chars: dict[float, int] = {}
    for line in text_layer_lines(page) if lines is None else lines:
        for span in line["spans"]:
            n = len(span["text"].strip())
            if n:
                size = round(span["size"], 2)
                chars[size] = chars.get(size, 0) + n
    if not chars:
        return None
    size = max(chars, key=chars.get)
    return size if BODY_PT_RANGE[0] <= size <= BODY_PT_RANGE[1] else None


def text_turns(page: pymupdf.Page, lines: list[dict] | None = None, min_share: float = 0.6) -> int:
    """np.rot90's k that sets the page's text upright as drawn: most text-layer characters (`lines`, else read here)
    run down the page (a page with /Rotate 90 over horizontal text, or a table set sideways) -> 1, up -> -1, right to
    left -> 2; else 0 (also without a text layer, or with no direction holding min_share of the characters). Latin
    letters and digits are counted: CJK set in vertical columns runs down the page with its glyphs upright."""
    a, b, c, d = (page.rotation_matrix.a, page.rotation_matrix.b, page.rotation_matrix.c, page.rotation_matrix.d)
    chars = {0: 0, 1: 0, -1: 0, 2: 0}
    for line in text_layer_lines(page) if lines is None else lines:
        x, y = line["dir"]
        dx, dy = a * x + c * y, b * x + d * y  # the line's direction as drawn, y down
        k = (0 if dx > 0 else 2) if abs(dx) >= abs(dy) else (1 if dy > 0 else -1)
        chars[k] += sum(ch.isascii() and ch.isalnum() for span in line["spans"] for ch in span["text"])
    total = sum(chars.values())
    k = max(chars, key=chars.get)
    return k if total and chars[k] >= min_share * total else 0


def inked_body_pt(page: pymupdf.Page, scale: float) -> float | None:
    """The body font size (pt) of a page without a text layer (a scan), from the height of its inked text lines when
    drawn at `scale`; None where too few lines are found or the size is out of BODY_PT_RANGE, as for `body_font_pt`."""
    from pipeline.blocks import line_height_px

    image = pixmap_rgb(page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), colorspace=pymupdf.csRGB, alpha=False))
    if not (line_px := line_height_px(image)):
        return None
    size = line_px / INK_LINE_PER_EM / scale
    return size if BODY_PT_RANGE[0] <= size <= BODY_PT_RANGE[1] else None


def page_scale(page: pymupdf.Page, opts: RasterOptions, text_layer: bool = True,
               lines: list[dict] | None = None) -> float:
    """Points to pixels for one page: the glyph size's scale when opts.glyph_px is set (bounded by max_pixels only),
    the body size taken from the text layer (`lines`, else read here), or without one (or with text_layer False)
    from the ink; else `render_scale`."""
    rect = page.rect
    scale = render_scale(rect.width, rect.height, opts)
    if opts.glyph_px > 0:
        pt = body_font_pt(page, lines) if text_layer else None
        if pt is None and opts.glyph_from_ink:
            pt = inked_body_pt(page, scale)
        if pt is not None:
            scale = min(opts.glyph_px / pt, math.sqrt(opts.max_pixels / (rect.width * rect.height)))
    return scale


def render_page(page: pymupdf.Page, target_longest_px: int, max_pixels: int, glyph_px: float = 0.0,
                glyph_from_ink: bool = False, text_layer: bool = True) -> np.ndarray:
    """One page -> H x W x 3 uint8 RGB, sized by `page_scale` (the longest side is at most the target, unless the
    page is drawn at glyph_px), and turned so its text layer's lines run left to right (`text_turns`)."""
    return render_views(page, target_longest_px, max_pixels, glyph_px, glyph_from_ink, text_layer)[0]


def render_views(page: pymupdf.Page, target_longest_px: int, max_pixels: int, glyph_px: float = 0.0,
                 glyph_from_ink: bool = False, text_layer: bool = True, zooms: tuple[float, ...] = ()
                 ) -> list[np.ndarray]:
    """The page as `render_page` draws it, then drawn again at each of `zooms` times that scale, turned alike (a
    zoomed view may pass max_pixels: only its blocks are read)."""
    opts = RasterOptions(target_longest_px, max_pixels, glyph_px=glyph_px, glyph_from_ink=glyph_from_ink)
    lines = text_layer_lines(page) if text_layer else []
    scale = page_scale(page, opts, text_layer, lines)
    pix = page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), colorspace=pymupdf.csRGB, alpha=False)
    # a page drawn larger for its glyphs may pass the target: only the pixel cap bounds it
    longest = math.inf if scale > render_scale(page.rect.width, page.rect.height, opts) else target_longest_px
    over = max(pix.width * pix.height / max_pixels, max(pix.width, pix.height) / longest)
    if over > 1:  # MuPDF rounds the pixel box outwards; at the cap that can add a row or column
        scale *= 0.998 / math.sqrt(over) if pix.width * pix.height > max_pixels else 0.998 / over
        pix = page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), colorspace=pymupdf.csRGB, alpha=False)
    turns = text_turns(page, lines)
    drawn = [pix] + [page.get_pixmap(matrix=pymupdf.Matrix(scale * z, scale * z), colorspace=pymupdf.csRGB,
                                     alpha=False) for z in zooms]
    return [np.ascontiguousarray(np.rot90(pixmap_rgb(d), turns)) if turns else pixmap_rgb(d) for d in drawn]


def pixmap_rgb(pix: pymupdf.Pixmap) -> np.ndarray:
    """An RGB pixmap without alpha -> H x W x 3 uint8, copied out of the pixmap: a view of pix.samples_mv does not
    keep the pixmap's memory alive."""
    rows = np.frombuffer(pix.samples_mv, dtype=np.uint8).reshape(pix.height, pix.stride)
    return rows[:, : pix.width * 3].copy().reshape(pix.height, pix.width, 3)


def open_document(data: bytes, uri: str) -> pymupdf.Document:
    """Open and check a document; every failure becomes a DocumentError a person can act on, its kind read from what
    the file is (pipeline.diagnose) and MuPDF's own warnings kept in its message."""
    filetype = filetype_for(uri)
    if not data:
        raise DocumentError("empty", "file is empty (0 bytes)")
    pymupdf.TOOLS.reset_mupdf_warnings()
    try:
        doc = pymupdf.open(stream=data, filetype=filetype)
    except Exception as e:  # MuPDF raises FileDataError / RuntimeError subclasses
        if filetype == "pdf":
            raise DocumentError(*classify_unopened(data, pymupdf.TOOLS.mupdf_warnings(), f"{type(e).__name__}: {e}")) from e
        kind = "too_large" if out_of_memory(str(e)) else "damaged"
        raise DocumentError(kind, f"cannot open as {filetype}: {type(e).__name__}: {e}") from e
    if filetype == "pdf" and not doc.is_pdf:  # MuPDF sniffs content: an HTML error page named .pdf opens as HTML
        raise DocumentError("not_pdf", f"file is named .pdf but its content is not a PDF: it is {what_it_looks_like(data)}")
    if doc.needs_pass:
        raise DocumentError("encrypted", "document is encrypted and needs a password; decrypt it before ingesting")
    try:
        count = doc.page_count
    except Exception as e:
        if filetype == "pdf":
            raise DocumentError(*classify_unopened(data, pymupdf.TOOLS.mupdf_warnings(), f"{type(e).__name__}: {e}")) from e
        kind = "too_large" if out_of_memory(str(e)) else "damaged"
        raise DocumentError(kind, f"cannot read the page count: {type(e).__name__}: {e}") from e
    if count == 0:
        if filetype == "pdf":
            raise DocumentError(*classify_unopened(data, pymupdf.TOOLS.mupdf_warnings(), "no pages",
                                                   repaired=bool(getattr(doc, "is_repaired", False)),
                                                   broken=empty_structure_problem(doc)))
        raise DocumentError("empty", "document has no pages")
    return doc


_REF = re.compile(r"(\d+)\s+\d+\s+R")


def empty_structure_problem(doc: pymupdf.Document) -> tuple[str, str] | None:
    """(kind, what) when a PDF that opened with no pages is not an intact empty document, else None. MuPDF reads a
    trailer whose /Root is missing, a catalog without /Pages, or a page tree whose kids are missing or not pages as
    an empty document without a word; an intact empty PDF has a catalog, a /Pages node with /Kids [] and /Count 0,
    and a trailer /Size that matches its cross-reference table."""
    try:
        size = doc.xref_length()
        declared = doc.xref_get_key(-1, "Size")
        if declared[0] == "int" and int(declared[1]) != size:
            return "damaged", f"its trailer says /Size {declared[1]} but its cross-reference table has {size} entries"
        root = doc.xref_get_key(-1, "Root")
        if root[0] != "xref":
            return "damaged", "its trailer has no /Root (the document catalog)"
        catalog = int(root[1].split()[0])
        if not 0 < catalog < size or doc.xref_get_key(catalog, "Type") != ("name", "/Catalog"):
            return "damaged", f"its trailer's /Root ({root[1]}) is not a document catalog"
        pages = doc.xref_get_key(catalog, "Pages")
        if pages[0] != "xref":
            return "page_tree", "its catalog has no /Pages (the root of the page tree)"
        node = int(pages[1].split()[0])
        if not 0 < node < size or doc.xref_get_key(node, "Type") != ("name", "/Pages"):
            return "page_tree", f"its catalog's /Pages ({pages[1]}) is not a page tree node"
        kids = doc.xref_get_key(node, "Kids")
        if kids[0] != "array":
            return "page_tree", "its page tree has no /Kids array"
        for ref in _REF.findall(kids[1]):
            kid = int(ref)
            if not 0 < kid < size:
                return "page_tree", f"its page tree lists {ref} 0 R, which is not in the file"
            kind = doc.xref_get_key(kid, "Type")
            if kind not in (("name", "/Page"), ("name", "/Pages")):
                return "page_tree", f"its page tree lists {ref} 0 R, which is a {kind[1]}, not a page"
        count = doc.xref_get_key(node, "Count")
        if count != ("int", "0") or _REF.search(kids[1]):
            return "page_tree", f"its page tree's /Count is {count[1]} for kids {kids[1]}"
    except Exception as e:  # noqa: BLE001  (an object that cannot be read is the answer)
        return "damaged", f"its catalog or page tree cannot be read ({type(e).__name__}: {e})"
    return None


def rasterize(data: bytes, uri: str, opts: RasterOptions, start: int = 0
              ) -> Iterator[tuple[int, int, RenderedPage | PageFailure]]:
    """Yield (pages_to_render, total_pages, page) for each page from `start`: a RenderedPage, or a PageFailure for a
    page that cannot be loaded or drawn (the next pages are still drawn). Raises DocumentError when the document
    itself cannot be opened."""
    doc = open_document(data, uri)
    try:
        yield from draw_pages(doc, opts, start)
    finally:
        close_document(doc)


def page_counts(doc: pymupdf.Document, opts: RasterOptions) -> tuple[int, int]:
    """(pages to draw, pages in the file): at most opts.max_pages are drawn."""
    return min(doc.page_count, opts.max_pages), doc.page_count


def draw_pages(doc: pymupdf.Document, opts: RasterOptions, start: int = 0
               ) -> Iterator[tuple[int, int, RenderedPage | PageFailure]]:
    """The pages of an opened document from `start`, as `rasterize` yields them."""
    count, total = page_counts(doc, opts)
    for i in range(start, count):
        t0 = time.perf_counter()
        pymupdf.TOOLS.reset_mupdf_warnings()
        try:
            page = doc.load_page(i)
            image, *views = render_views(page, opts.target_longest_px, opts.max_pixels, opts.glyph_px,
                                         opts.glyph_from_ink, zooms=opts.block_scales[1:])
            text = page.get_text("text") if opts.extract_text else ""
        except MemoryError as e:
            yield count, total, PageFailure(i, "too_large", f"page {i}: out of memory while drawing ({e})")
            continue
        except Exception as e:
            failure = str(e) if isinstance(e, DocumentError) else f"{type(e).__name__}: {e}"
            said = warnings_text(pymupdf.TOOLS.mupdf_warnings())
            yield count, total, PageFailure(i, classify_page_failure(failure),
                                            f"page {i}: {failure}{f' (MuPDF: {said})' if said else ''}")
            continue
        yield count, total, RenderedPage(i, image, text, time.perf_counter() - t0, views, is_blank(image),
                                         warnings_text(pymupdf.TOOLS.mupdf_warnings()))


def close_document(doc: pymupdf.Document) -> None:
    doc.close()
    pymupdf.TOOLS.store_shrink(100)  # MuPDF caches decoded images across documents; keep actors flat
