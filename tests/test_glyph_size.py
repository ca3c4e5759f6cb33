"""Pages drawn at a reader's glyph size: the body text's em in pixels decides the scale of a page with a text layer
(pipeline.rasterize.page_scale), the job takes the size from the checkpoint (pipeline.page_reading.raster_options), and
the evaluation and the training pages draw the same documents that way (research.ocria_tiny.eval_ocr, research.ocria_tiny.synthetic)."""
import json
import shutil
import subprocess
import sys

import pymupdf
import pytest
from conftest import ROOT

from pipeline.rasterize import RasterOptions, body_font_pt, page_scale, render_page, render_scale

MODEL = ROOT / "models" / "ocria-tiny"


def _page(width_pt: float, height_pt: float, body_pt: float | None, heading_pt: float = 0.0) -> pymupdf.Page:
    doc = pymupdf.open()
    page = doc.new_page(width=width_pt, height=height_pt)
    y = 40.0
    if heading_pt:
        page.insert_text((30, y), "Annual Report", fontsize=heading_pt)
        y += 2 * heading_pt
    if body_pt:
        for i in range(12):  # the body text: far more characters than the heading
            page.insert_text((30, y), f"line {i}: the archive team digitized pages", fontsize=body_pt)
            y += 1.4 * body_pt
    page.doc_keepalive = doc  # the page needs its document alive
    return page


@pytest.mark.parametrize("body_pt, heading_pt", [(10.0, 24.0), (7.5, 0.0), (13.3, 30.0)])
def test_the_body_texts_size_is_the_one_most_characters_have(body_pt, heading_pt):
    assert body_font_pt(_page(612, 792, body_pt, heading_pt)) == pytest.approx(body_pt, abs=0.01)


def test_a_page_without_a_text_layer_has_no_body_size_and_keeps_the_target():
    page = _page(612, 792, None)
    assert body_font_pt(page) is None
    opts = RasterOptions(target_longest_px=1536, max_pixels=2688 * 2688, glyph_px=32)
    assert page_scale(page, opts) == render_scale(612, 792, opts)
    assert max(render_page(page, 1536, 2688 * 2688, glyph_px=32).shape[:2]) == 1536


@pytest.mark.parametrize("body_pt, glyph_px", [(10.0, 32.0), (7.5, 24.0), (14.0, 33.0)])
def test_a_page_is_drawn_so_its_body_text_is_the_glyph_size(body_pt, glyph_px):
    """A small font grows the page past the target (letter at 10 pt, 32 px: 2,534 px high); a large one shrinks it."""
    page = _page(612, 792, body_pt)
    image = render_page(page, 1536, 2688 * 2688, glyph_px=glyph_px)
    scale = image.shape[0] / 792
    assert body_pt * scale == pytest.approx(glyph_px, rel=0.01)
    fixed = render_page(page, 1536, 2688 * 2688)
    assert max(fixed.shape[:2]) == 1536
    assert (image.shape[0] > fixed.shape[0]) == (glyph_px / body_pt > 1536 / 792)


def test_the_pixel_cap_bounds_a_glyph_sized_page():
    page = _page(612, 792, 5.0)  # 32 px glyphs would need 5,069 px of height
    cap = 1800 * 1800
    image = render_page(page, 1536, cap, glyph_px=32)
    assert image.shape[0] * image.shape[1] <= cap
    assert image.shape[0] * image.shape[1] > 0.98 * cap  # the cap, not the target, stopped it


def _model_dir(tmp_path, info: dict, max_side: int = 2688):
    tmp_path.mkdir(parents=True, exist_ok=True)
    for f in MODEL.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, tmp_path / f.name)
    proc = json.loads((tmp_path / "preprocessor_config.json").read_text())
    proc["size"]["longest_edge"] = max_side * max_side
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(proc))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["text_config"]["max_position_embeddings"] = 8192
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "ocria_info.json").write_text(json.dumps(info))
    return tmp_path


def test_the_job_draws_at_the_checkpoints_glyph_size_unless_configured(tmp_path):
    """ocria_info.json names the page size (page_px) and the glyph size; the pixels are the processor's, as many as
    the context holds beside model.max_tokens; raster.glyph_px 0 turns it off (pages at page_px, its pixels)."""
    from pipeline.page_reading import context_pixels, image_processor, raster_options
    from pipeline.config import JobConfig

    model = _model_dir(tmp_path, {"page_px": 1536, "glyph_px": 32})
    job = JobConfig.model_validate({"input": {"uris": ["samples"]}})
    opts = raster_options(job, str(model))
    fits = context_pixels(str(model), image_processor(str(model)), job.model.max_tokens, 2688)
    assert (opts.target_longest_px, opts.glyph_px, opts.max_pixels) == (1536, 32.0, min(2688 * 2688, fits))
    off = JobConfig.model_validate({"input": {"uris": ["samples"]}, "raster": {"glyph_px": 0}})
    assert (raster_options(off, str(model)).glyph_px, raster_options(off, str(model)).max_pixels) == (0.0, 1536 ** 2)
    mine = JobConfig.model_validate({"input": {"uris": ["samples"]}, "raster": {"glyph_px": 28.5}})
    assert raster_options(mine, str(model)).glyph_px == 28.5
    plain = _model_dir(tmp_path / "plain", {"page_px": 1536})  # no glyph size named: off
    assert raster_options(job, str(plain)).glyph_px == 0.0
    assert raster_options(job, str(MODEL)).glyph_px == json.loads((MODEL / "ocria_info.json").read_text())["glyph_px"]


def test_the_cli_flag_sets_the_glyph_size():
    from pipeline.cli import overrides

    assert overrides(glyph_px=0.0) == {"raster": {"glyph_px": 0.0}}
    assert overrides(glyph_px=30.0, target_longest_px=None) == {"raster": {"glyph_px": 30.0}}


def test_the_checkpoint_reader_imports_without_pydantic():
    """research.ocria_tiny.eval_ocr reads the checkpoint's sizes through pipeline.checkpoint on the H200, which has no pydantic."""
    code = "import sys; sys.modules['pydantic'] = None; import pipeline.checkpoint"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def _scan_of(page: pymupdf.Page, dpi: int = 150) -> pymupdf.Page:
    """The page as a scan: its pixels at `dpi` placed on a page of the same size, with no text layer."""
    pix = page.get_pixmap(dpi=dpi)
    doc = pymupdf.open()
    scan = doc.new_page(width=page.rect.width, height=page.rect.height)
    scan.insert_image(scan.rect, pixmap=pix)
    scan.doc_keepalive = doc
    return scan


@pytest.mark.parametrize("body_pt", [7.0, 10.0, 16.0])
def test_a_scan_is_drawn_at_the_glyph_size_its_ink_shows(body_pt):
    """Without a text layer the body size comes from the inked lines' height (raster.glyph_from_ink): the scan is drawn
    so its text lines are INK_LINE_PER_EM x glyph_px high, within the spread of fonts' line heights; without the
    option it keeps the target, as does a page with too few lines to measure."""
    from pipeline.blocks import line_height_px
    from pipeline.rasterize import INK_LINE_PER_EM, inked_body_pt

    scan = _scan_of(_page(612, 792, body_pt))
    assert body_font_pt(scan) is None
    opts = RasterOptions(target_longest_px=1536, max_pixels=4000 * 4000, glyph_px=32, glyph_from_ink=True)
    assert inked_body_pt(scan, render_scale(612, 792, opts)) == pytest.approx(body_pt, rel=0.15)
    image = render_page(scan, 1536, 4000 * 4000, glyph_px=32, glyph_from_ink=True)
    assert line_height_px(image) == pytest.approx(32 * INK_LINE_PER_EM, rel=0.1)
    assert max(render_page(scan, 1536, 4000 * 4000, glyph_px=32).shape[:2]) == 1536
    assert max(render_page(scan, 1536, 4000 * 4000, glyph_from_ink=True).shape[:2]) == 1536  # no glyph size
    blank = _scan_of(_page(612, 792, None))
    assert line_height_px(render_page(blank, 1536, 4000 * 4000)) is None
    assert max(render_page(blank, 1536, 4000 * 4000, glyph_px=32, glyph_from_ink=True).shape[:2]) == 1536


def test_a_page_with_a_text_layer_can_be_drawn_as_a_scan():
    """text_layer=False (research.ocria_tiny.eval_ocr --glyph-from-ink) sizes a born-digital page from its ink, close to its text
    layer's size."""
    page = _page(612, 792, 9.0)
    opts = RasterOptions(target_longest_px=1536, max_pixels=4000 * 4000, glyph_px=32, glyph_from_ink=True)
    assert page_scale(page, opts, text_layer=False) == pytest.approx(page_scale(page, opts), rel=0.15)
    assert page_scale(page, opts, text_layer=False) != page_scale(page, opts)


def test_glyph_from_ink_follows_the_checkpoint_unless_configured(tmp_path):
    from pipeline.cli import overrides
    from pipeline.page_reading import raster_options
    from pipeline.config import JobConfig

    def job(**raster):
        return JobConfig.model_validate({"input": {"uris": ["samples"]}, "raster": raster})

    named = _model_dir(tmp_path / "named", {"page_px": 1536, "glyph_px": 32, "glyph_from_ink": True})
    silent = _model_dir(tmp_path / "silent", {"page_px": 1536, "glyph_px": 32})
    assert raster_options(job(), str(named)).glyph_from_ink is True
    assert raster_options(job(glyph_from_ink=False), str(named)).glyph_from_ink is False
    assert raster_options(job(), str(silent)).glyph_from_ink is False
    assert raster_options(job(glyph_from_ink=True), str(silent)).glyph_from_ink is True
    assert overrides(glyph_from_ink=False) == {"raster": {"glyph_from_ink": False}}
    assert overrides(glyph_from_ink=None) == {}
