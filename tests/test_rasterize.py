"""Rasterizer on real files: every PDF of the shared corpus behaves as its manifest says, plus sizing,
image formats and page limits. A renderer that dies or hangs on a document made to fault it: tests/test_faults.py."""
import csv
import time

import numpy as np
import pymupdf
import pytest
from conftest import CORPUS, ROOT, unavailable

from pipeline.isolation import IsolatedRasterizer
from pipeline.rasterize import DocumentError, RasterOptions, rasterize, render_page, render_scale

SAMPLES = ROOT / "samples"


def _render_all(renderer, path):
    return [(count, total, page) for count, total, page in renderer.rasterize(path.read_bytes(), path.name)]


@pytest.fixture(scope="module")
def renderer():
    r = IsolatedRasterizer(RasterOptions(target_longest_px=256, max_pixels=256 * 256, max_pages=400),
                           timeout_s=30, memory_limit_mb=4096)  # one corpus page legitimately takes ~10 s
    yield r
    r.close()


MANIFEST = list(csv.DictReader(open(CORPUS / "manifest.csv"))) if (CORPUS / "manifest.csv").exists() else []


@pytest.fixture
def corpus():
    if not MANIFEST:
        unavailable("../shared/corpus is not next to this checkout")


def test_every_corpus_file_behaves_as_the_manifest_says(corpus, renderer):
    mismatches = []
    for row in MANIFEST:
        if "timed out" in row["error"]:
            continue  # hangs by design: test_error_kinds checks it under a short limit
        path = CORPUS / row["filename"]
        try:
            pages = _render_all(renderer, path)
            got, detail = "ok", f"{len(pages)} pages"
            expected_pages = min(int(row["pages"]), 400)
            assert len(pages) == expected_pages, f"{row['filename']}: {len(pages)} pages, manifest {row['pages']}"
            assert all(p.image.dtype == np.uint8 and p.image.ndim == 3 and p.image.shape[2] == 3 for _, _, p in pages)
        except DocumentError as e:
            got, detail = "error", f"{e.kind}: {e}"
            assert str(e) and e.kind, "an error row needs a reason a person can act on"
        if got != row["expected_behaviour"]:
            mismatches.append((row["filename"], row["expected_behaviour"], got, detail))
    assert not mismatches, mismatches


@pytest.mark.parametrize("name,kind", [
    ("pdfminer__aes-128.pdf", "encrypted"),
    ("pike__cyclic-toc.pdf", "empty"),
    ("qpdf__bad1.pdf", "damaged"),
    ("pymupdf__test_2548.pdf", "timeout"),  # get_pixmap spins forever on this file
])
def test_error_kinds(corpus, name, kind):
    renderer = IsolatedRasterizer(RasterOptions(target_longest_px=256, max_pixels=256 * 256), timeout_s=120,
                                  memory_limit_mb=4096)
    assert len(_render_all(renderer, SAMPLES / "letter.pdf")) == 1  # the child is up: its start-up is not timed
    renderer.timeout_s = 3
    with pytest.raises(DocumentError) as e:
        _render_all(renderer, CORPUS / name)
    renderer.close()
    assert e.value.kind == kind


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


@pytest.mark.parametrize("name,data,kind", [
    ("empty.pdf", b"", "empty"),
    ("noise.pdf", bytes(range(256)) * 16, "damaged"),
    ("page.html.pdf", b"<html><body>403 Forbidden</body></html>", "not_pdf"),
    ("notes.txt", b"hello", "unsupported"),
])
def test_bad_inputs_raise_actionable_errors(name, data, kind):
    with pytest.raises(DocumentError) as e:
        list(rasterize(data, name, RasterOptions()))
    assert e.value.kind == kind


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

    from pipeline.checkpoint import raster_options
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
    from pipeline.checkpoint import CheckpointError, image_processor, raster_options
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
    opts = RasterOptions(target_longest_px=1536, max_pixels=1536 * 1536, glyph_px=24.0, view_zooms=(0.9375, 1.0625))
    [(_, _, drawn)] = list(rasterize(path.read_bytes(), "p.pdf", opts))
    assert np.array_equal(drawn.image, main) and [v.shape for v in drawn.views] == [small.shape, large.shape]
    [(_, _, plain)] = list(rasterize(path.read_bytes(), "p.pdf", RasterOptions(1536, 1536 * 1536, glyph_px=24.0)))
    assert plain.views == []
