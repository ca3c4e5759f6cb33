"""How many of a recipe's pages are laid out in two columns, at `two_columns` shares: the page styles alone
(pipeline.synthetic.sample_style, seeded as make_page seeds them), drawn at the page settings of --config (default:
the shipped model's evaluation pages).

    .venv/bin/python bench/ocria_tiny_two_column_share.py --out bench/results/ocria_tiny_s29_two_column_share.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from jobs.train_tiny import load_config, synth_config
    from pipeline.synthetic import font_families, sample_style

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "bench/results/ocria_tiny_eval_full_pages_1536_config.yaml")
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--pages", type=int, default=20000)
    ap.add_argument("--shares", type=float, nargs="+", default=[0.35, 0.8, 1.0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    base = synth_config(load_config(args.config, []))
    families = font_families(args.synth / "fonts")
    result = {"command": " ".join(["python", "bench/ocria_tiny_two_column_share.py", *(argv or sys.argv[1:])]),
              "pages": args.pages, "fonts": families, "two_column_share": {}}
    for share in args.shares:
        two = sum(sample_style(random.Random(seed), families, base.target_longest_px, base.font_px, share).columns == 2
                  for seed in range(args.pages))
        result["two_column_share"][str(share)] = round(two / args.pages, 4)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
