"""How big the corpus' text is in pixels at a given page resolution: the font size of every character of the
born-digital first pages that research.ocria_tiny.eval_ocr scores (the text layer's span sizes, in points), times the pipeline's
render scale (pipeline.rasterize.render_scale) at each longest side. ocria-tiny reads 16-32 px lines after run D
(research/ocria_tiny/commands.md, session 10); this says which resolution puts real pages' body text there.

    python -m research.ocria_tiny.corpus_font_px --out research/ocria_tiny/results/corpus_font_px.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import numpy as np

from pipeline.rasterize import RasterOptions, render_scale
from research.ocria_tiny.eval_ocr import born_digital_rows

ROOT = Path(__file__).resolve().parents[2]


def char_font_pt(page) -> np.ndarray:
    """The font size (pt) of each non-space character of the page's text layer."""
    sizes = [span["size"]
             for block in page.get_text("dict")["blocks"] if block.get("type") == 0
             for line in block["lines"] for span in line["spans"]
             for ch in span["text"] if not ch.isspace()]
    return np.array(sizes, dtype=np.float64)


def first_pages_with_fonts(corpus: Path, pages: int, readable_only: bool = True):
    """(manifest row, first page, its characters' font sizes in pt) of the born-digital first pages that
    research.ocria_tiny.eval_ocr scores (`readable_only`; else also those whose text layer is not text, whose font sizes are still
    right), skipping pages without text; each page is valid until the next one is yielded."""
    import pymupdf

    for row in born_digital_rows(corpus, readable_only=readable_only)[:pages]:
        with pymupdf.open(corpus / row["filename"]) as doc:
            pt = char_font_pt(doc[0])
            if pt.size:
                yield row, doc[0], pt


@click.command()
@click.option("--corpus", default=str(ROOT.parent / "shared" / "corpus"), show_default=True)
@click.option("--pages", default=12, show_default=True, help="first pages, as research.ocria_tiny.eval_ocr --corpus-pages takes them")
@click.option("--longest", default="768,1024,1280", show_default=True, help="longest page sides to compare (px)")
@click.option("--out", default=None)
def main(corpus: str, pages: int, longest: str, out: str | None) -> None:
    sides = [int(x) for x in longest.split(",")]
    per_side = {s: [] for s in sides}
    files = []
    # The font sizes of every page the corpus evaluation took until session 16, two with shifted text layers
    for row, page, pt in first_pages_with_fonts(Path(corpus), pages, readable_only=False):
        files.append({"file": row["filename"], "chars": int(pt.size), "font_pt_p50": float(np.median(pt))})
        for s in sides:
            per_side[s].append(pt * render_scale(page.rect.width, page.rect.height, RasterOptions(s, s * s)))
    result = {"pages": len(files), "files": files,
              "command": "python -m research.ocria_tiny.corpus_font_px " + " ".join(sys.argv[1:]),
              "font_px_by_longest_side": {}}
    print(f"{'longest px':>10} {'p10':>6} {'p50':>6} {'p90':>6}   (font px of each character, {len(files)} pages)")
    for s in sides:
        px = np.concatenate(per_side[s])
        q = np.percentile(px, [10, 50, 90])
        result["font_px_by_longest_side"][str(s)] = {"p10": round(q[0], 1), "p50": round(q[1], 1), "p90": round(q[2], 1)}
        print(f"{s:>10} {q[0]:6.1f} {q[1]:6.1f} {q[2]:6.1f}")
    if out:
        Path(out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
