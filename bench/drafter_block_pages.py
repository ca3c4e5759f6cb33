"""Block images for drafter training and tau measurement: documents drawn as the job draws them for a checkpoint
(pipeline.rasterize with the checkpoint's raster options) and cut into the text blocks it reads (pipeline.blocks).

    python bench/drafter_block_pages.py --checkpoint models/ocria-tiny --out DIR DOC [DOC ...]

Writes DIR/<doc>-p<page>-b<block>.png, in document order.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.page_reading import block_reading, raster_options  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.rasterize import rasterize  # noqa: E402


@click.command()
@click.option("--checkpoint", required=True)
@click.option("--out", required=True, type=click.Path())
@click.option("--max-pages", type=int, default=4, show_default=True, help="pages per document")
@click.argument("docs", nargs=-1, required=True, type=click.Path(exists=True))
def main(checkpoint, out, max_pages, docs):
    cfg = load_config(None, {"input": {"uris": ["x"]}, "model": {"checkpoint": checkpoint}})
    opts = raster_options(cfg, checkpoint)
    blocks = block_reading(cfg, checkpoint)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for doc in docs:
        path = Path(doc)
        try:
            pages = list(rasterize(path.read_bytes(), str(path), opts))
        except Exception as e:  # noqa: BLE001  (a broken sample is skipped, and said)
            click.echo(f"skip {path.name}: {e}")
            continue
        for _, _, page in pages[:max_pages]:
            for b, im in enumerate(blocks.images(page.image)):
                Image.fromarray(im).save(out / f"{path.stem}-p{page.index}-b{b:02d}.png")
                n += 1
    click.echo(f"{n} block images in {out}")


if __name__ == "__main__":
    main()
