"""Held-out CER by the glyph size a page was drawn at: each held-out page's body font in pixels at the config's page
size (its style, drawn again from its seed: pipeline.synthetic.sample_style), grouped into ranges, one-column and
two-column pages apart, pooled over jobs.eval_ocr outputs (several files: their pages together).

  python bench/ocria_tiny_cer_by_glyph.py --eval bench/results/ocria_tiny_s28_eval_native_ban64_c3_48_1536.json \\
      --config bench/results/ocria_tiny_eval_full_pages_1536_config.yaml \\
      --out bench/results/ocria_tiny_s32_cer_by_glyph.json

Session 32: the shipped model read 20-24 px text at 0.13 and 32-36 px at 0.04, which is what drawing pages at one
glyph size (raster.glyph_px) is for.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EDGES = (20.0, 24.0, 28.0, 32.0, 36.01)


def page_glyph_px(seed: int, cfg: dict, families: list[str]) -> tuple[float, int]:
    """A held-out page's body font size in pixels at the config's page size, and its columns."""
    from jobs.train_tiny import synth_config
    from pipeline.synthetic import sample_style

    page = synth_config(cfg)  # the held-out pages' settings, as jobs.eval_ocr.heldout_pages draws them
    style = sample_style(random.Random(seed), families, page.target_longest_px, page.font_px, page.two_columns)
    return style.font_pt * page.target_longest_px / max(style.width_pt, style.height_pt), style.columns


def by_glyph(pages: list[dict], edges: tuple[float, ...] = EDGES) -> list[dict]:
    """Rows {px, columns, pages, pooled_cer, median_cer} over [edges[i], edges[i+1]) for one and two columns."""
    rows = []
    for columns in (1, 2):
        for lo, hi in zip(edges, edges[1:]):
            group = [p for p in pages if p["columns"] == columns and lo <= p["glyph_px"] < hi]
            if group:
                edits = sum(p["cer"] * p["ref_chars"] for p in group)
                rows.append({"px": [lo, round(hi)], "columns": columns, "pages": len(group),
                             "pooled_cer": round(edits / sum(p["ref_chars"] for p in group), 4),
                             "median_cer": round(statistics.median(p["cer"] for p in group), 4)})
    return rows


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from jobs.train_tiny import load_config
    from pipeline.synthetic import font_families

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", type=Path, nargs="+", required=True, help="jobs.eval_ocr outputs")
    ap.add_argument("--config", type=Path, default=ROOT / "bench/results/ocria_tiny_eval_full_pages_1536_config.yaml")
    ap.add_argument("--synth", type=Path, default=ROOT / ".synth", help="its fonts/ name the page families")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    cfg = load_config(args.config, [])
    families = font_families(args.synth / "fonts")
    pages = []
    for path in args.eval:
        for rec in json.loads(path.read_text())["heldout_synthetic"]["per_page"]:
            index = int(rec["page"].split("_")[1])
            px, columns = page_glyph_px(cfg["data"]["heldout_seed"] + index, cfg, families)
            pages.append({"page": rec["page"], "glyph_px": round(px, 2), "columns": columns,
                          "cer": rec["model_md"]["cer"], "ref_chars": rec["model_md"]["ref_chars"]})
    rows = by_glyph(pages)
    print(f"{'px':>9} {'cols':>5} {'pages':>6} {'pooled':>8} {'median':>8}")
    for r in rows:
        print(f"{r['px'][0]:>4.0f}-{r['px'][1]:<4} {r['columns']:>5} {r['pages']:>6} {r['pooled_cer']:>8.4f} "
              f"{r['median_cer']:>8.4f}")
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(["python", "bench/ocria_tiny_cer_by_glyph.py",
                                                            *(argv or sys.argv[1:])]),
                                        "rows": rows, "pages": pages}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
