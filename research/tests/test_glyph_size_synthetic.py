"""The evaluation and the training pages draw documents at the reader's glyph size as the job does."""
import random

import pymupdf
import pytest
from conftest import ROOT, SHIPPED_PAGES, TRAIN_CONFIG, write_synth

from pipeline.rasterize import body_font_pt
from test_glyph_size import _model_dir  # noqa: E402 (tests/ is on the path: see conftest)

MODEL = ROOT / "models" / "ocria-tiny"


@pytest.fixture(scope="module")
def heldout_pool(licence_prose, tmp_path_factory):
    """A .synth folder with a held-out pool of licence paragraphs."""
    from research.ocria_tiny.synthetic import TextPool

    return write_synth(tmp_path_factory.mktemp("synth"), heldout=TextPool(prose=licence_prose, code=[["x = 1"]]))


def test_evaluation_draws_the_same_documents_at_the_glyph_size(tmp_path, heldout_pool):
    """Held-out pages drawn again from their PDFs: the same references, each page's body text at the glyph size."""
    from research.ocria_tiny.eval_ocr import Drawing, config_fits_model, glyph_drawing, heldout_pages
    from research.ocria_tiny.train_config import load_config

    cfg = load_config(TRAIN_CONFIG, SHIPPED_PAGES)
    model = _model_dir(tmp_path, {"page_px": cfg["image"]["target_longest_px"], "glyph_px": 30})
    drawing = glyph_drawing(cfg, model, 30.0, 512)
    assert isinstance(drawing, Drawing) and drawing.glyph_px == 30.0
    fixed = heldout_pages(3, cfg, heldout_pool)
    drawn = heldout_pages(3, cfg, heldout_pool, drawing=drawing)
    assert [p.reference_md for p in drawn] == [p.reference_md for p in fixed]
    for p in drawn:
        with pymupdf.open("pdf", p.pdf) as doc:
            assert body_font_pt(doc[0]) * p.image.shape[0] / doc[0].rect.height == pytest.approx(30.0, rel=0.01)
    assert config_fits_model(cfg, model, 2688 * 2688)
    assert not config_fits_model(cfg | {"image": cfg["image"] | {"target_longest_px": 999}}, model, 2688 * 2688)


def test_training_pages_keep_their_layout_at_a_glyph_size(heldout_pool):
    """SynthConfig.glyph_px draws the page again at a size from the range, from a random stream of its own: the text
    and layout are those of the page without it."""
    from research.ocria_tiny.synthetic import SynthConfig, TextPool, make_page

    pool = TextPool.from_json_gz(heldout_pool / "pool_heldout.json.gz")
    base = SynthConfig(target_longest_px=512, max_pixels=512 * 512, font_px=(8.0, 14.0))
    glyph = SynthConfig(target_longest_px=512, max_pixels=1200 * 1200, font_px=(8.0, 14.0), glyph_px=(20.0, 24.0))
    for seed in (3, 11):
        a, b = make_page(seed, pool, base), make_page(seed, pool, glyph)
        assert a.markdown == b.markdown and a.style == b.style
        want = random.Random(f"glyph-{seed}").uniform(20.0, 24.0)
        assert b.style.font_pt * b.image.shape[0] / b.style.height_pt == pytest.approx(want, rel=0.01)
