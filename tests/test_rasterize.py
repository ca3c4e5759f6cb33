"""Rasterizer on real files: every PDF of the shared corpus behaves as its manifest says, plus sizing,
image formats and page limits. A renderer that dies or hangs on a document made to fault it: tests/test_faults.py."""
import csv
import time

import numpy as np
import pymupdf
import pytest
from conftest import CORPUS, ROOT, require

from pipeline.isolation import IsolatedRasterizer
from pipeline.outcomes import ERROR_KINDS
from pipeline.rasterize import DocumentError, PageFailure, RasterOptions, rasterize, render_page, render_scale

SAMPLES = ROOT / "samples"


def _render_all(renderer, path):
    return [(count, total, page) for count, total, page in renderer.rasterize(path.read_bytes(), path.name)]


@pytest.fixture(scope="module")
def renderer():
    r = IsolatedRasterizer(RasterOptions(target_longest_px=256, max_pixels=256 * 256, max_pages=400),
                           page_timeout_s=120, memory_limit_mb=4096)  # test_4435's page 2: 21-26 s at this size
    yield r
    r.close()


MANIFEST = list(csv.DictReader(open(CORPUS / "manifest.csv"))) if (CORPUS / "manifest.csv").exists() else []


@pytest.fixture
def manifest():
    require(bool(MANIFEST), "../shared/corpus/manifest.csv")
    return MANIFEST


def test_every_corpus_file_behaves_as_the_manifest_says(renderer, manifest):
    """`ok` files give all their pages drawn; `error` files fail as a document or on some page; page 0 is blank
    exactly where the manifest's 72 dpi drawing is one colour."""
    mismatches = []
    for row in manifest:
        if "timed out" in row["error"]:
            continue  # hangs by design: test_error_kinds_of_the_corpus checks it under a short limit
        path = CORPUS / row["filename"]
        try:
            pages = _render_all(renderer, path)
            failed = [p for _, _, p in pages if isinstance(p, PageFailure)]
            got, detail = ("error" if failed else "ok"), f"{len(pages)} pages, {len(failed)} failed"
            assert len(pages) == min(int(row["pages"]), 400), f"{row['filename']}: {detail}, manifest {row['pages']}"
            drawn = [p for _, _, p in pages if not isinstance(p, PageFailure)]
            assert all(p.image.dtype == np.uint8 and p.image.ndim == 3 and p.image.shape[2] == 3 for p in drawn)
            if row["expected_behaviour"] == "ok" and drawn[0].blank != (row["blank_render_p0"] == "True"):
                mismatches.append((row["filename"], "blank page 0", drawn[0].blank, row["blank_render_p0"]))
        except DocumentError as e:
            got, detail = "error", f"{e.kind}: {e}"
            assert str(e) and e.kind in ERROR_KINDS, "an error row needs a known kind and a reason a person can act on"
        if got != row["expected_behaviour"]:
            mismatches.append((row["filename"], row["expected_behaviour"], got, detail))
    assert not mismatches, mismatches


# Every corpus file the manifest expects to fail, the kind it gets, and a word of the message that says why.
# Read from the manifest's columns: needs_pass; error "zero pages" with repaired True (damage MuPDF repaired into no
# pages: not `empty`); the stage that raised (open, page_count, load_page, render); the file's first bytes.
CORPUS_KINDS = {
    "pypdf__r6-user-password.pdf": ("encrypted", "password"),
    "pypdf__r2-user-password.pdf": ("encrypted", "password"),
    "pdfminer__aes-128.pdf": ("encrypted", "password"),
    "pike__graph-encrypted.pdf": ("encrypted", "password"),
    "pike__cyclic-toc.pdf": ("page_tree", "too many kids in page tree"),  # repaired, 0 pages: its page tree loops
    "pysf__unreadablemetadata.pdf": ("damaged", "repaired the broken cross-reference table and found no pages"),
    "pdfjs__poppler-85140-0.pdf": ("damaged", "Repair failed"),  # raises on open; has %%EOF, no startxref
    "pdfjs__poppler-67295-0.pdf": ("page_tree", "Invalid number of pages"),  # raises on page_count
    "qpdf__bad1.pdf": ("not_pdf", "'oops'"),  # five bytes, "oops\n": no %PDF- marker at all
}
CORPUS_PAGE_KINDS = {  # documents that open, with a page that does not draw
    "qpdf__deep-pages.pdf": ("page_tree", "cycle in page tree"),  # raises on load_page
    "qpdf__issue-1688a.pdf": ("page_damaged", "too many color components"),  # raises on render
}


@pytest.mark.parametrize("name", sorted(CORPUS_KINDS))
def test_error_kinds_of_the_corpus(name, manifest):
    row = next(r for r in manifest if r["filename"] == name)
    assert row["expected_behaviour"] == "error"
    kind, said = CORPUS_KINDS[name]
    with pytest.raises(DocumentError) as e:
        list(rasterize((CORPUS / name).read_bytes(), name, RasterOptions(256, 256 * 256)))
    assert e.value.kind == kind and said in str(e.value), str(e.value)
    if row["mupdf_warnings"] and not row["needs_pass"] == "True":  # MuPDF's own words are kept in the message
        assert row["mupdf_warnings"].split(" | ")[0].strip() in str(e.value)


@pytest.mark.parametrize("name", sorted(CORPUS_PAGE_KINDS))
def test_page_error_kinds_of_the_corpus(name, manifest):
    kind, said = CORPUS_PAGE_KINDS[name]
    pages = [p for _, _, p in rasterize((CORPUS / name).read_bytes(), name, RasterOptions(256, 256 * 256))]
    [failure] = [p for p in pages if isinstance(p, PageFailure)]
    assert failure.kind == kind and said in failure.message


def test_every_failing_corpus_file_has_its_kind_here(manifest):
    """The two tables above cover exactly the manifest's failures (the one that hangs: test_a_page_that_hangs_...)."""
    failing = {r["filename"] for r in manifest if r["expected_behaviour"] == "error" and "timed out" not in r["error"]}
    assert failing == set(CORPUS_KINDS) | set(CORPUS_PAGE_KINDS)


def test_a_page_that_hangs_mupdf_is_one_error_row_and_the_document_goes_on(manifest):
    """pymupdf__test_2548.pdf: get_pixmap spins for good on its pages. Each page gets the time limit; after
    max_lost_pages the rest of the document is not drawn, each page an error row saying why."""
    name = "pymupdf__test_2548.pdf"
    renderer = IsolatedRasterizer(RasterOptions(256, 256 * 256), page_timeout_s=2, memory_limit_mb=4096,
                                  max_lost_pages=2)
    t = time.perf_counter()
    try:
        pages = _render_all(renderer, CORPUS / name)
    finally:
        renderer.close()
    assert time.perf_counter() - t < 30
    assert [p.index for _, _, p in pages] == list(range(15)) and all(isinstance(p, PageFailure) for _, _, p in pages)
    assert {p.kind for _, _, p in pages} == {"timeout"}
    assert "not drawn within 2 s" in pages[0][2].message and "already timed out" in pages[5][2].message


def test_size_follows_target_and_pixel_cap():
    opts = RasterOptions(target_longest_px=1288, max_pixels=1288 * 1288)
    assert round(792 * render_scale(612, 792, opts)) == 1288  # US letter: longest side at the target
    skinny = render_scale(612, 14295, opts)  # olmocr's skinny page: longest side still capped
    assert 14295 * skinny <= 1288.5
    capped = RasterOptions(target_longest_px=10000, max_pixels=1_000_000)
    s = render_scale(14400, 14400, capped)  # the largest PDF page: pixel cap wins over the target
    assert (14400 * s) ** 2 <= 1_000_000 * 1.0001
    with pytest.raises(DocumentError):
        render_scale(0, 100, opts)


def test_huge_page_is_rendered_within_the_pixel_cap(tmp_path):
    doc = pymupdf.open()
    page = doc.new_page(width=14400, height=14400)  # PDF's maximum page size: 200 x 200 inches
    page.insert_text((100, 7200), "corner to corner", fontsize=400)
    data = doc.tobytes()
    opts = RasterOptions(target_longest_px=10000, max_pixels=2_000_000)
    [(count, total, p)] = list(rasterize(data, "huge.pdf", opts))
    h, w, _ = p.image.shape
    assert h * w <= 2_000_000 and h == w
    assert p.image.min() < 128  # the text is there


def test_images_and_multipage_tiff():
    opts = RasterOptions(target_longest_px=512, max_pixels=512 * 512)
    tiff = list(rasterize((SAMPLES / "scans/report.tiff").read_bytes(), "x.tiff", opts))
    assert [p.index for _, _, p in tiff] == [0, 1] and tiff[0][1] == 2
    for name in ("scans/letter-scan.png", "scans/report-page2.jpg"):
        [(count, total, p)] = list(rasterize((SAMPLES / name).read_bytes(), name, opts))
        assert max(p.image.shape[:2]) == 512


def test_text_layer_and_page_limit():
    opts = RasterOptions(target_longest_px=300, max_pixels=300 * 300, max_pages=1)
    pages = list(rasterize((SAMPLES / "report.pdf").read_bytes(), "report.pdf", opts))
    assert len(pages) == 1 and pages[0][0] == 1 and pages[0][1] == 2  # 1 of 2 pages rendered
    assert "Quarterly Operations Report" in pages[0][2].text_layer


def _pdf(pages: int = 3, **save) -> bytes:
    doc = pymupdf.open()
    for i in range(pages):
        doc.new_page().insert_text((72, 100), f"Page {i}: the quarterly figures were reviewed.", fontsize=14)
    return doc.tobytes(**save)


EMPTY_TREE = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [] /Count 0 >>"]


def _zero_page_pdf(objects: list[bytes] = EMPTY_TREE, root: bytes = b"1 0 R", size: int | None = None,
                   shift: int = 0) -> bytes:
    """A PDF written object by object, with no pages. As given: intact (header, objects, xref, trailer all right).
    The arguments break one thing each: the objects, the trailer's /Root or /Size, or (shift) the last object's
    offset in the xref, which MuPDF then repairs."""
    out, offsets = bytearray(b"%PDF-1.7\n"), []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (n, body)
    offsets[-1] += shift
    xref, n = len(out), len(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % n + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root %s >>\nstartxref\n%d\n%%%%EOF\n" % (size or n, root, xref)
    return bytes(out)


ONE_OBJECT = b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n"
SYNTHETIC = {  # name -> (bytes, kind, words of the message); made here, so they run without the shared corpus
    "empty.pdf": (b"", "empty", "0 bytes"),
    "no-pages.pdf": (_zero_page_pdf(), "empty", "intact"),
    "noise.pdf": (bytes(range(256)) * 16, "not_pdf", "no %PDF- marker"),
    "page.html.pdf": (b"<html><body>403 Forbidden</body></html>", "not_pdf", "HTML"),
    "no-header.pdf": (b"Access denied: this link has expired.\n" * 4, "not_pdf", "plain text"),
    "cut-off.pdf": (_pdf(garbage=0, deflate=True)[:200], "truncated", "without the startxref/%%EOF"),
    # the trailer is there, so the length is right and the offsets wrong: damage, not a file cut short
    "far-xref.pdf": (ONE_OBJECT + b"\nstartxref\n999999\n%%EOF\n", "damaged",
                     "points to byte 999999 but the file has 82 bytes, though the file ends with the trailer"),
    "far-xref-cut.pdf": (ONE_OBJECT + b"startxref\n999999\n" + b"x" * 1100, "truncated",
                         "without the startxref/%%EOF trailer a PDF ends with, and its startxref points"),
    # no pages, and not intact: repaired, or broken where MuPDF reads it as empty without a warning
    "repaired-to-nothing.pdf": (_zero_page_pdf(shift=3), "damaged", "repaired the broken cross-reference table"),
    "kid-not-there.pdf": (_zero_page_pdf([EMPTY_TREE[0], b"<< /Type /Pages /Kids [5 0 R] /Count 0 >>"]), "page_tree",
                          "its page tree lists 5 0 R, which is not in the file"),
    "kid-not-a-page.pdf": (_zero_page_pdf([EMPTY_TREE[0], b"<< /Type /Pages /Kids [1 0 R] /Count 0 >>"]), "page_tree",
                           "lists 1 0 R, which is a /Catalog, not a page"),
    "no-page-tree.pdf": (_zero_page_pdf([b"<< /Type /Catalog >>", EMPTY_TREE[1]]), "page_tree",
                         "catalog has no /Pages"),
    "root-not-there.pdf": (_zero_page_pdf(root=b"7 0 R"), "damaged", "/Root (7 0 R) is not a document catalog"),
    "size-wrong.pdf": (_zero_page_pdf(size=9), "damaged", "says /Size 9 but its cross-reference table has 3 entries"),
    "damaged.pdf": (b"%PDF-1.4\n" + bytes(range(256)) * 4 + b"\nstartxref\n9\n%%EOF\n", "damaged", "MuPDF"),
    "locked.pdf": (_pdf(encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="u", owner_pw="o"), "encrypted", "password"),
    "notes.txt": (b"hello", "unsupported", "unsupported file type"),
}


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_broken_files_get_the_kind_of_what_they_are(name):
    data, kind, said = SYNTHETIC[name]
    with pytest.raises(DocumentError) as e:
        list(rasterize(data, name, RasterOptions()))
    assert e.value.kind == kind and said in str(e.value), str(e.value)
    assert kind in ERROR_KINDS


@pytest.mark.parametrize("body", [b"<html><body>403</body></html>", b"this is not really a pdf\n" * 3,
                                  bytes(range(256)) * 8, b"", b"%%EOF\n", b"<svg xmlns='http://www.w3.org/2000/svg'/>"])
def test_a_file_that_starts_with_the_pdf_marker_is_never_not_pdf(body):
    """It says it is a PDF: whatever follows, it is a broken or cut-off one (its kind and message say which)."""
    with pytest.raises(DocumentError) as e:
        list(rasterize(b"%PDF-1.4\n" + body, "x.pdf", RasterOptions(256, 256 * 256)))
    assert e.value.kind in ("truncated", "damaged"), str(e.value)


def test_files_mupdf_can_read_are_parsed_whatever_their_flaws():
    """An owner password only, or a file cut short after its pages (MuPDF rebuilds the xref): every page drawn."""
    owner_only = _pdf(encryption=pymupdf.PDF_ENCRYPT_AES_256, owner_pw="o")
    full = _pdf(garbage=0)
    cut = full[: full.rindex(b"xref")]  # the xref and trailer lost
    for data in (owner_only, cut):
        pages = [p for _, _, p in rasterize(data, "x.pdf", RasterOptions(256, 256 * 256))]
        assert len(pages) == 3 and not any(isinstance(p, PageFailure) or p.blank for p in pages)


def _slow_page_pdf(curves: int = 20000) -> bytes:
    """Three pages, the middle one tens of thousands of stroked curves: seconds of drawing, though small on disk."""
    import random

    doc = pymupdf.open()
    doc.new_page().insert_text((72, 100), "first page", fontsize=14)
    slow = doc.new_page()
    rnd = random.Random(0)
    ops = ["1 w"]
    for _ in range(curves):
        x = [f"{rnd.uniform(0, 600):.1f} {rnd.uniform(0, 800):.1f}" for _ in range(4)]
        ops.append(f"{rnd.random():.2f} 0 0 RG {x[0]} m {x[1]} {x[2]} {x[3]} c S")
    xref = doc.get_new_xref()
    doc.update_object(xref, "<<>>")
    doc.update_stream(xref, "\n".join(ops).encode())
    doc.xref_set_key(slow.xref, "Contents", f"{xref} 0 R")
    doc.new_page().insert_text((72, 100), "third page", fontsize=14)
    return doc.tobytes(deflate=True)


def test_a_page_past_its_time_limit_is_one_error_row_and_the_rest_is_parsed():
    """The time limit is per page: a slow page is killed and recorded, the pages after it are drawn (a long
    document is never failed for its length)."""
    renderer = IsolatedRasterizer(RasterOptions(1024, 1024 * 1024), page_timeout_s=1.0, memory_limit_mb=4096)
    try:
        pages = [p for _, _, p in renderer.rasterize(_slow_page_pdf(), "slow.pdf")]
        assert [type(p).__name__ for p in pages] == ["RenderedPage", "PageFailure", "RenderedPage"]
        assert pages[1].kind == "timeout" and pages[1].index == 1 and "page_timeout_s" in pages[1].message
        assert len(_render_all(renderer, SAMPLES / "letter.pdf")) == 1  # the next document, in a fresh renderer
    finally:
        renderer.close()


def test_blank_pages_are_flagged():
    doc = pymupdf.open()
    doc.new_page()
    doc.new_page().insert_text((72, 100), ".", fontsize=10)  # one full stop is content
    tinted = doc.new_page()
    tinted.draw_rect(tinted.rect + (-5, -5, 5, 5), color=None, fill=(0.9, 0.9, 0.85))  # tinted paper, edge to edge
    pages = [p for _, _, p in rasterize(doc.tobytes(), "b.pdf", RasterOptions(512, 512 * 512))]
    assert [p.blank for p in pages] == [True, False, True]
    assert [p.warnings for p in pages] == ["", "", ""]


def _undecodable_page(kind: str) -> bytes:
    """One page whose only content does not decode: a JBIG2 image mask of garbage over the page, or a content stream
    marked Flate that is not zlib data. MuPDF warns and draws nothing."""
    doc = pymupdf.open()
    page = doc.new_page()
    x = doc.get_new_xref()
    doc.update_object(x, "<< /Type /XObject /Subtype /Image /Width 200 /Height 200 /BitsPerComponent 1 /ImageMask true "
                         "/Decode [1 0] >>" if kind == "jbig2" else "<<>>")
    doc.update_stream(x, bytes(range(64)) if kind == "jbig2" else b"not zlib data at all", compress=False)
    doc.xref_set_key(x, "Filter", "/JBIG2Decode" if kind == "jbig2" else "/FlateDecode")
    if kind == "jbig2":
        c = doc.get_new_xref()
        doc.update_object(c, "<<>>")
        doc.update_stream(c, b"q 400 0 0 400 100 200 cm /Im1 Do Q")
        doc.xref_set_key(page.xref, "Resources", f"<< /XObject << /Im1 {x} 0 R >> >>")
        x = c
    doc.xref_set_key(page.xref, "Contents", f"{x} 0 R")
    return doc.tobytes()


@pytest.mark.parametrize("kind,said", [("jbig2", "jbig2"), ("flate", "zlib error")])
def test_a_page_that_drew_blank_because_its_content_failed_to_decode_says_so_in_its_row(kind, said):
    """Blank, so not sent to the model, but not plainly blank: the row's `error` carries MuPDF's warnings."""
    from pipeline.stages import _raster_row

    [page] = [p for _, _, p in rasterize(_undecodable_page(kind), "x.pdf", RasterOptions(256, 256 * 256))]
    assert page.blank and said in page.warnings.lower(), page.warnings
    row = _raster_row("x.pdf", "s", 1, 1, page)
    assert row["status"] == "blank" and row["error_kind"] is None
    assert row["error"].startswith("drawn blank, but MuPDF reported problems while drawing it")
    assert said in row["error"].lower()
    plain = pymupdf.open()
    plain.new_page()
    [page] = [p for _, _, p in rasterize(plain.tobytes(), "x.pdf", RasterOptions(256, 256 * 256))]
    assert page.blank and _raster_row("x.pdf", "s", 1, 1, page)["error"] is None


def test_pages_per_core_speed_is_recorded(renderer):
    """Not a benchmark (no timing assertion): rasterization stays cheap enough to never starve an engine."""
    t = time.perf_counter()
    pages = _render_all(renderer, SAMPLES / "report.pdf")
    assert pages and time.perf_counter() - t < 30


def test_rendered_pixels_survive_the_pixmap():
    """The array must own its memory: a view of the pixmap's samples is overwritten once the pixmap is freed."""
    import gc

    doc = pymupdf.open()
    doc.new_page(width=300, height=300)  # blank white page
    page = doc.load_page(0)
    arr = render_page(page, 300, 300 * 300)
    gc.collect()
    for _ in range(20):  # churn the allocator
        pymupdf.open().new_page().get_pixmap(matrix=pymupdf.Matrix(3, 3))
    assert arr.flags.owndata or arr.base is not None and arr.base.flags.owndata
    assert arr.min() == 255 and arr.shape == (300, 300, 3)


@pytest.mark.parametrize("side, expected", [(1536, 1536), (768, 768), (2048, 2048), (2049, 1288), (3584, 1288)])
def test_pages_are_drawn_at_the_checkpoints_size(tmp_path, side, expected):
    """raster_options: a processor that allows at most 2048 px a side gives the model's own page size (the shipped
    ocria-tiny: 1536); a larger budget (a generic VLM's) gives 1288 px; a configured size wins."""
    import json
    import shutil

    from pipeline.page_reading import raster_options
    from pipeline.config import JobConfig

    shutil.copy(ROOT / "models" / "ocria-tiny" / "preprocessor_config.json", tmp_path)
    proc = json.loads((tmp_path / "preprocessor_config.json").read_text())
    proc["size"]["longest_edge"] = side * side
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(proc))
    job = JobConfig.model_validate({"input": {"uris": ["samples"]}})
    opts = raster_options(job, str(tmp_path))
    assert opts.target_longest_px == expected and opts.max_pixels == min(side, expected) ** 2
    configured = JobConfig.model_validate({"input": {"uris": ["samples"]}, "raster": {"target_longest_px": 900}})
    assert raster_options(configured, str(tmp_path)).target_longest_px == 900
    shipped = raster_options(job, str(ROOT / "models" / "ocria-tiny"))
    assert shipped.target_longest_px == 1536


@pytest.mark.parametrize("width_pt, height_pt", [(612, 792), (792, 612), (600, 600), (300, 1500), (595, 842)])
def test_pages_leave_room_for_the_answer_in_the_context(width_pt, height_pt):
    """With model.max_tokens 2048 (configs/gpu.yaml) the shipped model's largest pages (drawn at its glyph size: up to
    its processor's 2,688 px a side) would overflow its 8,192-token context: raster_options caps the pixels so that
    the engine's own prompt for the rendered page plus the answer fits, whatever the page's shape and font size."""
    from engine.config import default_max_model_len, load_config
    from engine.processor import Processor
    from pipeline.checkpoint import CheckpointError
    from pipeline.page_reading import image_processor, raster_options
    from pipeline.config import JobConfig

    model = ROOT / "models" / "ocria-tiny"
    cfg = load_config(model)
    job = JobConfig.model_validate({"input": {"uris": ["samples"]}, "model": {"max_tokens": 2048}})
    opts = raster_options(job, str(model))
    assert opts.target_longest_px == 1536 and opts.glyph_px > 0
    assert opts.max_pixels < image_processor(str(model)).max_pixels
    for fontsize in (6, 14):  # a small font draws the page as large as the cap allows
        doc = pymupdf.open()
        page = doc.new_page(width=width_pt, height=height_pt)
        for i in range(8):
            page.insert_text((40, 60 + 2 * fontsize * i), "Quarterly report of the archive", fontsize=fontsize)
        image = render_page(page, opts.target_longest_px, opts.max_pixels, opts.glyph_px)
        ids, _, _ = Processor(model, cfg).page_inputs(image, "Convert this page to markdown.")
        assert len(ids) + 2048 <= default_max_model_len(cfg.text), (image.shape, len(ids))
    too_long = JobConfig.model_validate({"input": {"uris": ["samples"]}, "model": {"max_tokens": 8000}})
    with pytest.raises(CheckpointError, match="lower model.max_tokens"):
        raster_options(too_long, str(model))


def _page_with_text(doc: pymupdf.Document, rotate_text: int = 0) -> pymupdf.Page:
    page = doc.new_page(width=420, height=560)
    for k in range(12):
        page.insert_text((40, 60 + 36 * k) if not rotate_text else (60 + 28 * k, 500), f"Line {k}: The quarterly figures "
                         "were reviewed and approved.", fontsize=11, rotate=rotate_text)
    return page


def pixel_shifted_difference(a: np.ndarray, b: np.ndarray, reach: int = 2) -> float:
    """The mean absolute difference of two images at the best shift of up to `reach` pixels either way (MuPDF's pixel
    grid falls differently on a rotated page)."""
    r = reach
    core = b[r:-r, r:-r].astype(int)
    return min(np.abs(a[r + dy: a.shape[0] - r + dy, r + dx: a.shape[1] - r + dx].astype(int) - core).mean()
               for dy in range(-r, r + 1) for dx in range(-r, r + 1))


def test_a_rotated_page_is_drawn_with_its_text_upright():
    """A page whose /Rotate turns its horizontal text on its side is drawn as its text reads: the same pixels as the
    page without the rotation; a page whose text is set sideways is turned so the text runs left to right."""
    from pipeline.rasterize import text_turns

    doc = pymupdf.open()
    upright = render_page(_page_with_text(doc), 1536, 1536 * 1536, 24.0)
    for rotation in (90, 180, 270):
        page = _page_with_text(doc)
        page.set_rotation(rotation)
        assert text_turns(page) == {90: 1, 180: 2, 270: -1}[rotation]
        image = render_page(page, 1536, 1536 * 1536, 24.0)
        assert image.shape == upright.shape and image.flags["C_CONTIGUOUS"]
        # glyph edges differ by a grey level or two where the page is drawn turned; the other way up differs by ~16
        turned_back = np.ascontiguousarray(np.rot90(image, 2))
        assert pixel_shifted_difference(image, upright) < 0.25 * pixel_shifted_difference(turned_back, upright)
    sideways = _page_with_text(doc, rotate_text=90)  # reads upwards on an unrotated page
    assert text_turns(sideways) == -1
    image = render_page(sideways, 1536, 1536 * 1536, 24.0)
    assert image.shape[1] > image.shape[0]  # portrait page turned: its lines now run along the long side
    page = _page_with_text(doc)
    page.set_rotation(90)  # the text layer ignored (a scan's job): drawn as the page says
    drawn = render_page(page, 1536, 1536 * 1536, 24.0, text_layer=False)
    assert drawn.shape[1] > drawn.shape[0]  # landscape, as /Rotate 90 draws the portrait page
    assert text_turns(doc.new_page()) == 0  # no text layer: as drawn


def test_a_page_is_drawn_again_at_its_views_zooms(tmp_path):
    """Views (the other sizes blocks are read at) are the page drawn at zoom times its scale, turned as it is; the
    rasterizer hands them out with the page."""
    from pipeline.rasterize import render_views

    doc = pymupdf.open()
    page = _page_with_text(doc)
    page.set_rotation(90)
    main, small, large = render_views(page, 1536, 1536 * 1536, 24.0, zooms=(0.9375, 1.0625))
    assert np.array_equal(main, render_page(page, 1536, 1536 * 1536, 24.0))
    for view, zoom in ((small, 0.9375), (large, 1.0625)):
        assert abs(view.shape[0] / main.shape[0] - zoom) < 0.01 and abs(view.shape[1] / main.shape[1] - zoom) < 0.01
        assert (view.shape[0] > view.shape[1]) == (main.shape[0] > main.shape[1])  # turned as the page is
    path = tmp_path / "p.pdf"
    doc.save(path)
    opts = RasterOptions(target_longest_px=1536, max_pixels=1536 * 1536, glyph_px=24.0, block_scales=(1.0, 0.9375, 1.0625))
    [(_, _, drawn)] = list(rasterize(path.read_bytes(), "p.pdf", opts))
    assert np.array_equal(drawn.image, main) and [v.shape for v in drawn.views] == [small.shape, large.shape]
    [(_, _, plain)] = list(rasterize(path.read_bytes(), "p.pdf", RasterOptions(1536, 1536 * 1536, glyph_px=24.0)))
    assert plain.views == []


def test_a_missing_corpus_skips_here_and_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="not on this machine"):
        require(False, "../shared/corpus")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require(False, "../shared/corpus")
    require(True, "../shared/corpus")  # present: nothing happens


def test_a_corpus_page_that_drew_blank_over_a_broken_stream_keeps_the_warnings(manifest):
    """pdfminer__patchelf.pdf: its one page's content stream is not the zlib data it is marked as; it draws blank."""
    name = "pdfminer__patchelf.pdf"
    [page] = [p for _, _, p in rasterize((CORPUS / name).read_bytes(), name, RasterOptions(256, 256 * 256))]
    assert page.blank and "zlib error" in page.warnings, page.warnings
