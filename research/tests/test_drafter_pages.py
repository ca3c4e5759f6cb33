"""research/ocria_tiny/drafter_pages.py: synthetic pages drawn the job's way for ocria-tiny and cut into the blocks
the job reads, as grayscale PNGs whose sides are whole vision tokens; the same page number gives the same images."""
import os
import time
from functools import partial
from pathlib import Path

import numpy as np
from PIL import Image

from conftest import write_synth
from research.ocria_tiny.drafter_pages import main
from research.ocria_tiny.synthetic import TextPool

ROOT = Path(__file__).resolve().parents[2]


def test_block_images_of_synthetic_pages(tmp_path, licence_prose):
    synth = write_synth(tmp_path / "synth", heldout=TextPool(prose=licence_prose, code=[["x = 1", "y = x + 1"]]))
    args = ["--synth", str(synth), "--split", "heldout", "--checkpoint", str(ROOT / "models" / "ocria-tiny")]
    assert main([*args, "--pages", "3", "--out", str(tmp_path / "a"), "--workers", "2"]) == 0
    files = sorted((tmp_path / "a").glob("*.png"))
    assert len(files) >= 3 and {f.name.split("-")[0] for f in files} == {"heldout_00000", "heldout_00001",
                                                                           "heldout_00002"}
    for f in files:
        im = Image.open(f)
        assert im.mode == "L" and im.width % 32 == 0 and im.height % 32 == 0, (f.name, im.size)
        assert np.asarray(im).min() < 128  # ink
    # page 1 again on its own (--first): the same blocks, byte for byte
    assert main([*args, "--pages", "1", "--first", "1", "--out", str(tmp_path / "b")]) == 0
    again = sorted((tmp_path / "b").glob("*.png"))
    assert again and all((tmp_path / "a" / f.name).read_bytes() == f.read_bytes() for f in again)


PROBE = '''
import os

from research.ocria_tiny.drafter_pages import block_images


def draw(n, log, fail=-1, **kw):
    """Page n's block images (none without kw), its number and this worker's pid noted in `log` first."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {n}\\n")
    if n == fail:
        raise ValueError(f"no page {n}")
    return block_images(n, **kw) if kw else []
'''


def test_pages_drawn_in_worker_processes_stream_in_order_and_stop(tmp_path, licence_prose, monkeypatch):
    """pipeline/train_drafter's drawn pages (--render): block_images run in 2 worker processes yield, page by page in page
    order, the images the sequential renderer draws for the same page numbers, which are those of the PNG files the
    script writes; they are drawn from page_source's call on, before the first is read; leaving the stream early ends its workers with no page drawn beyond its bounded queue; a page
    that fails raises its error in the reader."""
    import pytest

    from pipeline.train_drafter import RenderedPages, TrainDrafterConfig, load_pages, page_source

    synth = write_synth(tmp_path / "synth", train=TextPool(prose=licence_prose, code=[["x = 1", "y = x + 1"]]))
    (tmp_path / "probe_render.py").write_text(PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers import the probe: they get this process's sys.path
    ckpt = str(ROOT / "models" / "ocria-tiny")
    kw = dict(split="train", synth=str(synth), checkpoint=ckpt)
    log = tmp_path / "drawn.txt"
    cfg = TrainDrafterConfig(checkpoint=ckpt, out=str(tmp_path / "d"), render="probe_render:draw",
                             render_args=dict(kw, log=str(log)), render_pages=3, render_first=5, render_workers=2)
    images, count = page_source(cfg)
    deadline = time.time() + 60  # the workers draw before the reader asks (while a target would load)
    while not (log.exists() and len(log.read_text().splitlines()) == 3) and time.time() < deadline:
        time.sleep(0.2)
    assert log.exists() and len(log.read_text().splitlines()) == 3, "no page drawn before the first was read"
    drawn = list(images)
    from research.ocria_tiny.drafter_pages import block_images

    want = [im for n in (5, 6, 7) for im in block_images(n, **kw)]
    assert count is None and len(drawn) == len(want) >= 3
    assert all(a.dtype == np.uint8 and a.shape[2] == 3 and np.array_equal(a, b) for a, b in zip(drawn, want))
    pids = {line.split()[0] for line in log.read_text().splitlines()}
    assert sorted(int(line.split()[1]) for line in log.read_text().splitlines()) == [5, 6, 7] and len(pids) <= 2
    assert str(os.getpid()) not in pids  # drawn in the workers, not here
    assert main(["--synth", str(synth), "--split", "train", "--checkpoint", ckpt, "--pages", "1", "--first", "5",
                 "--out", str(tmp_path / "png")]) == 0
    files = load_pages(tmp_path / "png")
    assert len(files) == len(block_images(5, **kw)) and all(np.array_equal(a, b) for a, b in zip(files, drawn))
    # read one page of a thousand, give the workers time to draw more, and leave: no page is drawn beyond the
    # bounded queue, the workers end
    from probe_render import draw

    log.unlink()
    stream = iter(RenderedPages(partial(draw, log=str(log)), first=0, count=1000, workers=2, ahead=3))
    assert next(stream) == []
    time.sleep(1.0)  # ~1 ms a page: an unbounded queue would be hundreds of pages on by now
    stream.close()
    lines = log.read_text().splitlines()
    assert max(int(line.split()[1]) for line in lines) <= 3  # page 0 read, pages 1 .. 3 queued at most
    for pid in {line.split()[0] for line in lines}:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "zombie" in status.read_text(), pid
    with pytest.raises(RuntimeError, match=r"drawing page 1 failed: ValueError\('no page 1'\)"):
        list(RenderedPages(partial(draw, log=str(log), fail=1), first=0, count=4, workers=2))
    # what drawing cost: pages, images and the workers' seconds (the collection's breakdown reports them)
    drawn = RenderedPages(partial(draw, log=str(log), **kw), first=5, count=2, workers=2)
    assert sum(map(len, drawn)) == drawn.stats["images"] == len(block_images(5, **kw)) + len(block_images(6, **kw))
    assert drawn.stats["pages"] == 2 and drawn.stats["render_s"] > 0 and drawn.stats["mb"] > 0
    assert 0 < drawn.stats["first_page_s"] and drawn.stats["workers"] == 2
