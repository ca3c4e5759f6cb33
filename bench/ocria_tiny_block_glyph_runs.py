"""How many characters a block's glyph runs hold (pipeline.blocks.glyph_runs, the run-on guard's measure): held-out
pages drawn at the shipped model's glyph size, cut into blocks of 8 lines; each block's text from the layout's line
boxes (pipeline.synthetic.text_lines at the drawn size), its printed characters over its glyph runs.

  python bench/ocria_tiny_block_glyph_runs.py --first 288 --pages 96 --out bench/results/ocria_tiny_s35_block_glyph_runs.json
"""
import argparse
import json
from pathlib import Path

import numpy as np
import pymupdf

from jobs.eval_ocr import glyph_drawing, heldout_pages, redrawn
from jobs.train_tiny import load_config
from pipeline.blocks import RUN_ON_CHARS_PER_GLYPH, RUN_ON_MIN_GLYPHS, text_blocks
from pipeline.synthetic import text_lines as layout_lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--first", type=int, default=288)
    ap.add_argument("--pages", type=int, default=96)
    ap.add_argument("--glyph-px", type=float, default=32.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    cfg = load_config(Path("bench/results/ocria_tiny_eval_full_pages_1536_config.yaml"), [])
    drawing = glyph_drawing(cfg, Path("models/ocria-tiny"), args.glyph_px, 1024)
    ratios, unmeasured = [], 0
    for page in heldout_pages(args.pages, cfg, Path(".synth"), first=args.first):
        drawn = redrawn([page], drawing)[0]
        with pymupdf.open("pdf", page.pdf) as doc:
            rect = doc[0].rect
            lines = layout_lines(doc[0], drawn.image.shape[1] / rect.width, drawn.image.shape[0] / rect.height)
        for b in text_blocks(drawn.image, 8):
            chars = sum(len("".join(ln.text.split())) for ln in lines
                        if b.y0 <= (ln.y0 + ln.y1) / 2 < b.y1 and b.x0 <= (ln.x0 + ln.x1) / 2 < b.x1)
            if b.glyphs < RUN_ON_MIN_GLYPHS:
                unmeasured += 1
            elif chars:
                ratios.append(chars / b.glyphs)
    r = np.array(ratios)
    out = {"command": f"python bench/ocria_tiny_block_glyph_runs.py --first {args.first} --pages {args.pages} --glyph-px {args.glyph_px:g}",
           "blocks_measured": len(r), "blocks_unmeasured": unmeasured,
           "chars_per_glyph_run": {"median": round(float(np.median(r)), 3),
                                   **{f"p{q}": round(float(np.percentile(r, q)), 3) for q in (90, 99, 99.9)},
                                   "max": round(float(r.max()), 3)},
           "run_on_threshold": RUN_ON_CHARS_PER_GLYPH}
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
