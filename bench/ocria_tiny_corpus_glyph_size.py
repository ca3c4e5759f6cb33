"""Does ocria-tiny read real pages better when their text is drawn at the size it was trained on? An A/B on the same
content: for each born-digital corpus first page (those jobs.eval_ocr scores), a top-left region of the page is drawn
(a) at the pipeline's scale for the whole page (longest side --longest px), and (b) at the scale that puts the
page's median font at --target-px (the middle of the training fonts), cropped to at most --longest px a side. The
region is the part of the page that fits (b); the reference is the text layer inside it. The model and Tesseract
read both images.

  .venv/bin/python bench/ocria_tiny_corpus_glyph_size.py --model models/ocria-tiny --pages 12 \
      --out bench/results/ocria_tiny_s16_corpus_glyph_size.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from corpus_font_px import first_pages_with_fonts  # bench/, beside this file

from jobs.eval_ocr import (
    HFPageReader,
    Score,
    collapse_ws,
    markdown_to_text,
    normalize_reference,
    tesseract_available,
    tesseract_read,
)
from pipeline.rasterize import RasterOptions, pixmap_rgb, render_scale


def draw(page, scale: float, clip) -> np.ndarray:
    import pymupdf

    return pixmap_rgb(page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), clip=clip, colorspace=pymupdf.csRGB,
                                      alpha=False))


@click.command()
@click.option("--model", "model_dir", required=True)
@click.option("--corpus", default=str(ROOT.parent / "shared" / "corpus"), show_default=True)
@click.option("--pages", default=12, show_default=True)
@click.option("--longest", default=1536, show_default=True, help="the model's page size (its processor's longest side)")
@click.option("--target-px", default=28.0, show_default=True, help="median font size to draw arm (b) at")
@click.option("--max-new-tokens", default=1024, show_default=True)
@click.option("--out", default=None)
def main(model_dir: str, corpus: str, pages: int, longest: int, target_px: float, max_new_tokens: int,
         out: str | None) -> None:
    import pymupdf

    items = []
    for row, page, pt in first_pages_with_fonts(Path(corpus), pages):
        p50 = float(np.median(pt))
        whole = render_scale(page.rect.width, page.rect.height, RasterOptions(longest, longest * longest))
        big = max(whole, target_px / p50)  # never smaller than the whole page's scale
        r = page.rect
        clip = pymupdf.Rect(r.x0, r.y0, min(r.x1, r.x0 + longest / big), min(r.y1, r.y0 + longest / big))
        ref = normalize_reference(page.get_text("text", clip=clip))
        items.append({"file": row["filename"], "font_pt_p50": round(p50, 2),
                      "scale_whole": round(whole, 3), "scale_big": round(big, 3),
                      "font_px_whole": round(p50 * whole, 1), "font_px_big": round(p50 * big, 1),
                      "region_pt": [round(clip.width, 1), round(clip.height, 1)], "ref": ref,
                      "images": {"whole_scale": draw(page, whole, clip), "big": draw(page, big, clip)}})
    reader = HFPageReader(Path(model_dir))
    use_tess = tesseract_available()
    scores = {f"{who}_{arm}": Score() for who in ("model", "tesseract") for arm in ("whole_scale", "big")}
    seconds = {}
    for arm in ("whole_scale", "big"):
        t0 = time.time()
        hyps = []
        for k in range(0, len(items), 4):
            hyps += reader.read([it["images"][arm] for it in items[k : k + 4]], max_new_tokens)
        seconds[arm] = round(time.time() - t0, 1)
        for it, hyp in zip(items, hyps):
            it[f"model_{arm}"] = scores[f"model_{arm}"].add(markdown_to_text(hyp), it["ref"])
            it[f"model_{arm}"]["output_head"] = hyp[:160]
            it[f"size_{arm}"] = list(it["images"][arm].shape[:2])
            if use_tess:
                it[f"tesseract_{arm}"] = scores[f"tesseract_{arm}"].add(collapse_ws(tesseract_read(it["images"][arm])), it["ref"])
    per_page = [{k: v for k, v in it.items() if k not in ("images", "ref")} | {"ref_chars": len(it["ref"])} for it in items]
    result = {"command": "python bench/ocria_tiny_corpus_glyph_size.py " + " ".join(sys.argv[1:]),
              "model": model_dir, "target_px": target_px, "longest": longest, "model_seconds": seconds,
              "summary": {k: s.summary() for k, s in scores.items() if s.pages}, "per_page": per_page}
    print(f"{'arm':>12} {'font px p50':>12} {'model CER':>10} {'tesseract CER':>14}")
    for arm in ("whole_scale", "big"):
        px = np.median([it[f"font_px_{'whole' if arm == 'whole_scale' else 'big'}"] for it in items])
        tess = result["summary"].get(f"tesseract_{arm}", {}).get("cer", float("nan"))
        print(f"{arm:>12} {px:12.1f} {result['summary'][f'model_{arm}']['cer']:10.3f} {tess:14.3f}")
    if out:
        Path(out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
