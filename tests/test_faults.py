"""Renderer faults made on purpose, without the corpus: a page that hangs MuPDF, a renderer killed mid-document, a
raster decompression bomb under the address-space cap; each costs only its own page (or its document, where the
document cannot be opened), and the renderer goes on."""
import os
import signal
import time

import pytest

from conftest import ROOT
from faults import hanging_pdf, png_bomb, slow_second_page_pdf
from pipeline.isolation import IsolatedRasterizer
from pipeline.rasterize import PageFailure, RasterOptions

LETTER = (ROOT / "samples" / "letter.pdf").read_bytes()
OPTS = RasterOptions(target_longest_px=256, max_pixels=256 * 256)


def render(renderer, data, name):
    return [page for _, _, page in renderer.rasterize(data, name)]


def warm(timeout_s, memory_limit_mb=4096) -> IsolatedRasterizer:
    """A renderer whose child process is already up: the timeout then measures rendering alone, not the child's
    interpreter start-up and imports (seconds on a loaded machine)."""
    renderer = IsolatedRasterizer(OPTS, page_timeout_s=120, memory_limit_mb=memory_limit_mb)
    assert len(render(renderer, LETTER, "letter.pdf")) == 1
    renderer.timeout_s = timeout_s
    return renderer


@pytest.mark.timeout(90)  # a limit that is not enforced fails here, not after the suite's 10 minutes
def test_a_page_that_hangs_the_renderer_times_out_and_only_it():
    renderer = warm(timeout_s=2)
    try:
        pid = renderer._proc.pid
        t0 = time.monotonic()
        [page] = render(renderer, hanging_pdf(), "hang.pdf")
        assert isinstance(page, PageFailure) and page.kind == "timeout", page
        assert "not drawn within 2 s" in page.message
        assert time.monotonic() - t0 < 2 + 10  # killed at the limit, not left to finish its minutes of work
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the hung renderer is gone
        # The next document, in a fresh process: whose start-up counts against that document's limit, so the
        # limit goes back up first (seconds of imports on a loaded machine; a real limit is minutes).
        renderer.timeout_s = 120
        assert len(render(renderer, LETTER, "letter.pdf")) == 1
    finally:
        renderer.close()


def test_renderer_killed_mid_document_costs_only_that_page():
    """A crash (the render process killed from outside, as a segfault would end it) is one error row for the page
    being drawn; the next document renders in a fresh process."""
    renderer = warm(timeout_s=60)
    try:
        stream = renderer.rasterize(slow_second_page_pdf(), "two.pdf")
        count, total, first = next(stream)  # page 0 is out; the child is drawing page 1 now
        assert (count, total, first.index) == (2, 2, 0)
        os.kill(renderer._proc.pid, signal.SIGKILL)
        [lost] = [p for _, _, p in stream]
        assert isinstance(lost, PageFailure) and lost.index == 1, lost
        assert lost.kind == "crash" and "SIGKILL" in lost.message
        assert [p.index for p in render(renderer, LETTER, "letter.pdf")] == [0]
    finally:
        renderer.close()


def test_abandoned_document_does_not_leak_pages_into_the_next():
    renderer = warm(timeout_s=60)
    try:
        stream = renderer.rasterize(slow_second_page_pdf(), "two.pdf")
        next(stream)
        stream.close()  # the consumer stops early, the child still drawing page 1
        pages = render(renderer, LETTER, "letter.pdf")
        assert [p.index for p in pages] == [0] and pages[0].image.shape[0] > pages[0].image.shape[1]  # a portrait page
    finally:
        renderer.close()


@pytest.fixture(scope="module")
def bomb():
    return png_bomb(10_000)  # 1.3 MB of PNG, 300 MB of pixels


def test_decompression_bomb_under_the_address_space_cap_is_one_too_large_page(bomb):
    """The 300 MB raster cannot be decoded under a 256 MB cap: MuPDF's failed allocation is one error row of kind
    too_large (not damaged: the file is sound, the page too large to draw here), and the renderer goes on."""
    renderer = warm(timeout_s=60, memory_limit_mb=256)
    try:
        [page] = render(renderer, bomb, "bomb.png")
        assert isinstance(page, PageFailure) and page.kind == "too_large", page
        assert "300010000 bytes" in page.message
        assert len(render(renderer, LETTER, "letter.pdf")) == 1
    finally:
        renderer.close()


def test_without_the_cap_the_same_raster_is_drawn_at_page_size(bomb):
    """The cap is what refuses the bomb above: without it the same file decodes and is drawn within max_pixels."""
    renderer = warm(timeout_s=60, memory_limit_mb=0)
    try:
        [page] = render(renderer, bomb, "bomb.png")
        assert page.image.shape == (256, 256, 3) and page.image.max() == 0
    finally:
        renderer.close()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_doc_timeout_and_retry_failed_flags_reach_the_job(tmp_path, tiny_checkpoint):
    """`--doc-timeout` (the per-page limit's old name) from the command line to the renderer of a real job (its
    limit, not the default, is in the error row), then `--retry-failed`: only the document that failed is taken
    again, not one added since. The exit status says which: 3 when some documents failed, 4 when all did."""
    import subprocess
    import sys

    from pipeline.config import StorageConfig
    from pipeline.output import OutputStore
    from pipeline.storage import resolve

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "hang.pdf").write_bytes(hanging_pdf())
    (tmp_path / "in" / "letter.pdf").write_bytes(LETTER)

    def cli(*flags, status):
        # 20 s: past the renderer's start-up, which the first document's limit includes, on a loaded machine
        args = [sys.executable, str(ROOT / "jobs/parse_corpus.py"), "--input", str(tmp_path / "in"), "--output",
                str(tmp_path / "out"), "--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--max-tokens", "4",
                "--num-cpus", "2", "--doc-timeout", "20", *flags]
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=280)
        assert proc.returncode == status, (proc.stdout + proc.stderr)[-3000:]
        docs = OutputStore(resolve(str(tmp_path / "out"), StorageConfig())).documents().to_pylist()
        return {d["uri"].rsplit("/", 1)[1]: d for d in docs}

    docs = cli(status=3)  # one of two failed
    assert docs["letter.pdf"]["status"] == "ok"
    hang = docs["hang.pdf"]
    assert (hang["status"], hang["error_kind"], hang["attempt"]) == ("error", "timeout", 1)
    assert "not drawn within 20 s" in hang["error"], hang["error"]
    (tmp_path / "in" / "report.pdf").write_bytes((ROOT / "samples" / "report.pdf").read_bytes())
    docs = cli("--retry-failed", status=4)  # the one it took failed again
    assert sorted(docs) == ["hang.pdf", "letter.pdf"]  # report.pdf is new, not failed: --retry-failed leaves it
    assert (docs["hang.pdf"]["error_kind"], docs["hang.pdf"]["attempt"]) == ("timeout", 2)
