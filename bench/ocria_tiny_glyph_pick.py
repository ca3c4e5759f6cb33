"""Which glyph size should a model's pages be drawn at? The same held-out pages (their PDFs) drawn at the model's
fixed page size and at each glyph size (pipeline.rasterize.page_scale: body text's em = G px, within the pixels the
model's processor and context take), read by one engine (jobs.eval_ocr's native reader, the loop drop + ban the job
decodes with), scored by the pooled CER over the markdown. Pages are made once and drawn again per size.

  PYTHONPATH=/tmp/site_train python3 bench/ocria_tiny_glyph_pick.py --model build/ocria-tiny-glyph-weights \\
      --glyph-px 0 28 30 32 34 36 --heldout 96 --heldout-from 288 --device cuda --out $OUT/glyph_pick.json

Glyph size 0 is the fixed page size (the config's, 1,536 px for the shipped model). The table gives each size's
pooled CER, pages better and worse than the fixed size, the median page's image tokens and the reading seconds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def image_tokens(processor, shape: tuple[int, ...]) -> int:
    """Merged image tokens of an H x W page as the reader's processor resizes it."""
    height, width = processor.resized_size(shape[0], shape[1])
    token_px = processor.patch_size * processor.merge_size
    return height // token_px * (width // token_px)


def compare(fixed: list[dict], other: list[dict]) -> tuple[int, int]:
    """Pages `other` reads better and worse than `fixed` (by page CER)."""
    pairs = list(zip(fixed, other))
    better = sum(o["model_md"]["cer"] < f["model_md"]["cer"] - 1e-9 for f, o in pairs)
    worse = sum(o["model_md"]["cer"] > f["model_md"]["cer"] + 1e-9 for f, o in pairs)
    return better, worse


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from jobs.eval_ocr import Drawing, EnginePageReader, evaluate, glyph_drawing, heldout_pages, redrawn
    from jobs.train_tiny import load_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--config", type=Path, default=ROOT / "bench/results/ocria_tiny_eval_full_pages_1536_config.yaml")
    ap.add_argument("--synth", type=Path, default=ROOT / ".synth")
    ap.add_argument("--glyph-px", type=float, nargs="+", required=True, help="sizes to draw at; 0: the fixed size")
    ap.add_argument("--heldout", type=int, default=96)
    ap.add_argument("--heldout-from", type=int, default=288)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    cfg = load_config(args.config, [])
    pages = heldout_pages(args.heldout, cfg, args.synth, first=args.heldout_from)
    reader = EnginePageReader(args.model, args.device, 1, args.batch, loop_drop_tokens=64, loop_ban_next=True)
    fixed = Drawing(cfg["image"]["target_longest_px"], cfg["image"]["max_pixels"])
    runs = {}
    for g in args.glyph_px:
        drawing = glyph_drawing(cfg, args.model, g, args.max_new_tokens) if g else fixed
        drawn = redrawn(pages, drawing)
        t0 = time.time()
        scored = evaluate(drawn, reader, False, args.batch, args.max_new_tokens)
        tokens = statistics.median(image_tokens(reader.processor, p["size"]) for p in scored["per_page"])
        runs[g] = {"drawing": vars(drawing), "seconds": round(time.time() - t0, 1), "median_image_tokens": tokens,
                   "pooled_cer": scored["model_md"]["cer"], "per_page": scored["per_page"]}
    reader.close()
    base = runs.get(0.0)
    print(f"{'glyph px':>9} {'pooled CER':>11} {'better':>7} {'worse':>6} {'tokens':>7} {'seconds':>8}")
    for g, r in runs.items():
        better, worse = compare(base["per_page"], r["per_page"]) if base else (0, 0)
        r["better_than_fixed"], r["worse_than_fixed"] = better, worse
        print(f"{g or 'fixed':>9} {r['pooled_cer']:>11.4f} {better:>7} {worse:>6} {r['median_image_tokens']:>7} "
              f"{r['seconds']:>8}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python3", "bench/ocria_tiny_glyph_pick.py", *(argv or sys.argv[1:])])
    args.out.write_text(json.dumps({"command": command, "model": str(args.model), "heldout_from": args.heldout_from,
                                    "heldout": args.heldout, "runs": {str(g): r for g, r in runs.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
