"""Document bytes -> page images (raw uint8 RGB) with PyMuPDF. Pure functions: no Ray, no pydantic.

Pages travel as raw arrays, never PNG: PNG encoding costs ~95 % of render time (environment notes, 2.4).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pymupdf

# File types PyMuPDF opens by content; the extension only picks the parser.
FILETYPES = {".pdf": "pdf", ".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".tif": "tiff", ".tiff": "tiff"}


class DocumentError(Exception):
    """A document that cannot be rasterized; `kind` groups errors in the stats."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class RasterOptions:
    target_longest_px: int = 1288  # olmOCR's choice for page VLMs
    max_pixels: int = 1288 * 1288  # caps huge pages (a 612 x 14295 pt strip) and decompression bombs
    max_pages: int = 500  # pages beyond this are not rendered; the document row says so
    extract_text: bool = True


@dataclass
class RenderedPage:
    index: int
    image: np.ndarray  # H x W x 3 uint8
    text_layer: str
    render_s: float


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


def render_page(page: pymupdf.Page, target_longest_px: int, max_pixels: int) -> np.ndarray:
    """One page -> H x W x 3 uint8 RGB, sized by `render_scale` (the longest side is at most the target)."""
    rect = page.rect
    scale = render_scale(rect.width, rect.height, RasterOptions(target_longest_px, max_pixels))
    pix = page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), colorspace=pymupdf.csRGB, alpha=False)
    over = max(pix.width * pix.height / max_pixels, max(pix.width, pix.height) / target_longest_px)
    if over > 1:  # MuPDF rounds the pixel box outwards; at the cap that can add a row or column
        scale *= 0.998 / math.sqrt(over) if pix.width * pix.height > max_pixels else 0.998 / over
        pix = page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), colorspace=pymupdf.csRGB, alpha=False)
    return pixmap_rgb(pix)


def pixmap_rgb(pix: pymupdf.Pixmap) -> np.ndarray:
    """An RGB pixmap without alpha -> H x W x 3 uint8, copied out of the pixmap: a view of pix.samples_mv does not
    keep the pixmap's memory alive."""
    rows = np.frombuffer(pix.samples_mv, dtype=np.uint8).reshape(pix.height, pix.stride)
    return rows[:, : pix.width * 3].copy().reshape(pix.height, pix.width, 3)


def open_document(data: bytes, uri: str) -> pymupdf.Document:
    """Open and check a document; every failure becomes a DocumentError a person can act on."""
    filetype = filetype_for(uri)
    if not data:
        raise DocumentError("empty", "file is empty (0 bytes)")
    try:
        doc = pymupdf.open(stream=data, filetype=filetype)
    except Exception as e:  # MuPDF raises FileDataError / RuntimeError subclasses
        kind = "truncated" if "truncated" in str(e).lower() else "damaged"
        raise DocumentError(kind, f"cannot open as {filetype}: {type(e).__name__}: {e}") from e
    if filetype == "pdf" and not doc.is_pdf:  # MuPDF sniffs content: an HTML error page named .pdf opens as HTML
        raise DocumentError("not_pdf", "file is named .pdf but its content is not a PDF (a failed download or upload?)")
    if doc.needs_pass:
        raise DocumentError("encrypted", "document is encrypted and needs a password; decrypt it before ingesting")
    try:
        count = doc.page_count
    except Exception as e:
        raise DocumentError("damaged", f"cannot read the page count: {type(e).__name__}: {e}") from e
    if count == 0:
        raise DocumentError("empty", "document has no pages (empty or broken page tree)")
    return doc


def rasterize(data: bytes, uri: str, opts: RasterOptions) -> Iterator[tuple[int, int, RenderedPage]]:
    """Yield (pages_to_render, total_pages, page) for each rendered page. Raises DocumentError on the first failure:
    a document with any page that cannot be loaded or rendered is one error, not a partial result."""
    doc = open_document(data, uri)
    try:
        total = doc.page_count
        count = min(total, opts.max_pages)
        for i in range(count):
            t0 = time.perf_counter()
            try:
                page = doc.load_page(i)
                image = render_page(page, opts.target_longest_px, opts.max_pixels)
                text = page.get_text("text") if opts.extract_text else ""
            except DocumentError:
                raise
            except MemoryError as e:
                raise DocumentError("too_large", f"page {i}: out of memory while rendering ({e})") from e
            except Exception as e:
                raise DocumentError("damaged", f"page {i}: {type(e).__name__}: {e}") from e
            yield count, total, RenderedPage(i, image, text, time.perf_counter() - t0)
    finally:
        doc.close()
        pymupdf.TOOLS.store_shrink(100)  # MuPDF caches decoded images across documents; keep actors flat
