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
import sys
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

    from pipeline.quantize import quantize_checkpoint_job

    return quantize_checkpoint_job(args.checkpoint, args.recipe, args.out, args.calib, args.no_awq)


if __name__ == "__main__":
    sys.exit(main())
