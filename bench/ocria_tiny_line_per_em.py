"""How high an inked text line is for its font's em: the ratio pipeline.rasterize.INK_LINE_PER_EM turns a scan's
measured line height (pipeline.blocks.line_height_px) into a body size.

Held-out synthetic pages are drawn at known glyph sizes (their body text's em in pixels, from the text layer) and their
ink cut into lines as the job cuts blocks; the ratio is the median line height over the em, page by page.

  python bench/ocria_tiny_line_per_em.py --out bench/results/ocria_tiny_s34_line_per_em.json
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

from jobs.eval_ocr import Drawing, heldout_pages
from jobs.train_tiny import load_config
from pipeline.blocks import line_height_px


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=Path("bench/results/ocria_tiny_eval_full_pages_1536_config.yaml"))
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--pages", type=int, default=48)
    ap.add_argument("--glyph-px", type=float, nargs="+", default=[24.0, 32.0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = load_config(args.config, [])
    rows = []
    for g in args.glyph_px:
        drawing = Drawing(cfg["image"]["target_longest_px"], 7225344, g)
        for p in heldout_pages(args.pages, cfg, args.synth, drawing=drawing):
            if (h := line_height_px(p.image)) is not None:
                rows.append({"page": p.name, "glyph_px": g, "line_px": h, "ratio": h / g})
    ratios = np.array([r["ratio"] for r in rows])
    summary = {g: round(float(np.median([r["ratio"] for r in rows if r["glyph_px"] == g])), 3) for g in args.glyph_px}
    out = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "pages": len(rows),
           "ratio_median": round(float(np.median(ratios)), 3),
           "ratio_p10_p90": [round(float(np.percentile(ratios, q)), 3) for q in (10, 90)],
           "median_by_glyph_px": summary, "per_page": rows}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print({k: out[k] for k in ("pages", "ratio_median", "ratio_p10_p90", "median_by_glyph_px")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
