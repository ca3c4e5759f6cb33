"""research/ocria_tiny/drafter_pages.py: synthetic pages drawn the job's way for ocria-tiny and cut into the blocks
the job reads, as grayscale PNGs whose sides are whole vision tokens; the same page number gives the same images."""
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
