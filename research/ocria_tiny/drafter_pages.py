"""Block images of synthetic pages for drafter training and tau measurement: pages from a text pool (train or
held-out), drawn as the job draws them for a checkpoint (pipeline.rasterize with its raster options) and cut into the
text blocks the job reads (pipeline.blocks), saved as grayscale PNG (the pages are black on white; three times
smaller than RGB, which jobs/train_drafter.py converts back).

    python -m research.ocria_tiny.drafter_pages --synth .synth --split train --pages 600 --out .drafter/train
    python -m research.ocria_tiny.drafter_pages --synth .synth --split heldout --pages 24 --out .drafter/heldout

Writes OUT/<split>_<page>-b<block>.png. Page i uses the split's seed + i (research/ocria_tiny/train_tiny.yaml), so a
folder can be made again, or extended with --first.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from functools import cache, partial
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "research" / "ocria_tiny" / "train_tiny.yaml"


@cache
def settings(split: str, synth: Path, checkpoint: str):
    """(text pool, page settings, first seed, raster options, block reading), read once per process."""
    from pipeline.config import load_config
    from pipeline.page_reading import block_reading, raster_options
    from research.ocria_tiny.synthetic import TextPool
    from research.ocria_tiny.train_config import synth_config

    cfg = yaml.safe_load(CONFIG.read_text())
    job = load_config(None, {"input": {"uris": ["x"]}, "model": {"checkpoint": checkpoint}})
    return (TextPool.from_json_gz(synth / f"pool_{split}.json.gz"), synth_config(cfg),
            cfg["data"]["seed" if split == "train" else "heldout_seed"], raster_options(job, checkpoint),
            block_reading(job, checkpoint))


def gray_blocks(i: int, split: str, synth: Path, checkpoint: str) -> list:
    """Synthetic page i of `split` drawn the job's way and cut into its blocks: grayscale PIL images, in order."""
    from PIL import Image

    from pipeline.rasterize import rasterize
    from research.ocria_tiny.synthetic import make_page

    pool, page_settings, first_seed, opts, reading = settings(split, synth, checkpoint)
    page = make_page(first_seed + i, pool, page_settings, synth / "fonts")
    return [Image.fromarray(im).convert("L") for _, _, drawn in rasterize(page.pdf, f"{split}_{i}.pdf", opts)
            for im in reading.images(drawn.image)]


def page_block_images(i: int, split: str, synth: Path, checkpoint: str, out: Path) -> int:
    """Draw synthetic page i of `split` the job's way and write its block images; returns how many."""
    blocks = gray_blocks(i, split, synth, checkpoint)
    for b, im in enumerate(blocks):
        im.save(out / f"{split}_{i:05d}-b{b:02d}.png", optimize=True)
    return len(blocks)


def block_images(i: int, split: str = "train", synth: str | Path = ROOT / ".synth",
                 checkpoint: str = str(ROOT / "models" / "ocria-tiny")) -> list:
    """Page i's block images as RGB uint8 arrays, what jobs/train_drafter.py reads from the files this script
    writes (gray in all three channels): its --render function, drawing pages as it trains
    (`--render research.ocria_tiny.drafter_pages:block_images --render-arg synth=DIR --render-arg split=train`)."""
    import numpy as np

    return [np.asarray(im.convert("RGB")) for im in gray_blocks(i, split, Path(synth), str(checkpoint))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synth", type=Path, default=ROOT / ".synth", help="pools + fonts (make_synthetic_pages)")
    ap.add_argument("--split", choices=["train", "heldout"], required=True)
    ap.add_argument("--pages", type=int, required=True)
    ap.add_argument("--first", type=int, default=0, help="the first page's number")
    ap.add_argument("--checkpoint", default=str(ROOT / "models" / "ocria-tiny"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    draw = partial(page_block_images, split=args.split, synth=args.synth, checkpoint=args.checkpoint, out=args.out)
    pages = range(args.first, args.first + args.pages)
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as ex:
            blocks = sum(ex.map(draw, pages, chunksize=4))
    else:
        blocks = sum(map(draw, pages))
    print(f"{blocks} block images of {args.pages} {args.split} pages in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
