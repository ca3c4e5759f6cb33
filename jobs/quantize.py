"""Quantize a bf16 checkpoint into compressed-tensors' layout (FP8 / NVFP4 decoder projections), calibrated on pages.

  python jobs/quantize.py --checkpoint models/ocria-tiny --recipe fp8 --out models/ocria-tiny-fp8
  python jobs/quantize.py --checkpoint models/ocria-tiny --recipe nvfp4 --out models/ocria-tiny-nvfp4
  python jobs/quantize.py --checkpoint IN --recipe my_recipe.yaml --calib pages/ --out OUT

--recipe: fp8 | nvfp4 | a YAML file (pipeline/quantize.py documents the keys). --calib: a folder of PDFs / page
images (default: samples/), drawn and cut into blocks as the job reads them; used for the activation-aware scales
(recipe awq: true, the default). The output loads in the engine (and vLLM) like any checkpoint and runs through
jobs/parse_corpus.py --checkpoint OUT; its page rows' model_id names the precision. Runs on CPU for small models.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, type=Path, help="bf16 HF checkpoint folder")
    ap.add_argument("--recipe", required=True, help="fp8, nvfp4 or a YAML recipe file")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--calib", type=Path, default=None, help="folder (or file) of calibration PDFs / page images")
    ap.add_argument("--no-awq", action="store_true", help="plain round-to-nearest (overrides the recipe's awq)")
    args = ap.parse_args(argv)

    from engine.checkpoint import CheckpointError, inspect_checkpoint
    from engine.quantize import collect_calibration, plan_precisions, quantize_checkpoint
    from pipeline.quantize import RecipeError, calibration_files, calibration_images, load_recipe

    try:
        recipe = load_recipe(args.recipe)
        cfg = inspect_checkpoint(args.checkpoint).config
        if cfg.quant is not None:
            raise CheckpointError(f"{args.checkpoint} is quantized already: start from the bf16 checkpoint")
        plan = plan_precisions(cfg, recipe.rule_pairs(), recipe.default)
        files = calibration_files(args.calib, ROOT / "samples") if recipe.awq and not args.no_awq else []
    except (RecipeError, CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out.exists() and any(args.out.iterdir()):
        print(f"error: --out {args.out} exists and is not empty", file=sys.stderr)
        return 2
    t0 = time.time()
    cal = None
    if files:
        try:
            images = calibration_images(files, str(args.checkpoint), recipe.calib_max_blocks)
        except RecipeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        cal = collect_calibration(args.checkpoint, images)
        print(f"calibration: {len(images)} block images from {len(files)} files, {cal.tokens} tokens, "
              f"{time.time() - t0:.0f} s", file=sys.stderr)
    note = (f"jobs/quantize.py --recipe {args.recipe}: {recipe.model_dump_json()}"
            + (f"; calibrated on {len(files)} files" if cal else "; round-to-nearest"))
    report = quantize_checkpoint(args.checkpoint, args.out, plan, act_fp8=recipe.fp8_activations == "dynamic",
                                 calibration=cal, recipe_note=note)
    report.update(recipe=recipe.model_dump(), seconds=round(time.time() - t0, 1),
                  calibration_files=[str(f) for f in files], model_id=inspect_checkpoint(args.out).model_id)
    (args.out / "quantization_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("modules", "bytes", "model_id", "seconds")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
