"""Share of path characters (bench/ocria_tiny_errors_by_block.py's `paths` kind) on training pages at several
`path_lists` shares, to set recipe F2UP's share against the held-out pages' (0.272, ocria_tiny_s28_runs.json). The
pages are a recipe's (its data.curriculum, without the stage's mix, as bench/ocria_tiny_answer_lengths.py's
--train-set) from the training pool, with each share in turn.

    .venv/bin/python bench/ocria_tiny_path_share.py --shares 0 0.1 0.2 0.3 --train-set "data.curriculum=[{until_page: \
        100000000, font_px: [20, 36], max_chars: [150, 1300], made_up_words: 0.25}]" \
        --out bench/results/ocria_tiny_s28_path_share.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ocria_tiny_errors_by_block import line_kinds, ref_char_kinds  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=Path("bench/results/ocria_tiny_eval_full_pages_1536_config.yaml"))
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--train-set", dest="overrides", action="append", default=[],
                    help="config override, key=value: a recipe's data.curriculum (its main pages)")
    ap.add_argument("--shares", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    ap.add_argument("--pages", type=int, default=40)
    ap.add_argument("--first-seed", type=int, default=2000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from jobs.train_tiny import load_config, synth_config
    from pipeline.synthetic import TextPool, make_page

    pool = TextPool.from_json_gz(args.synth / "pool_train.json.gz")
    recipe = synth_config(load_config(args.config, args.overrides), page_index=0)
    out = {}
    for share in args.shares:
        cfg = dataclasses.replace(recipe, path_lists=share)
        kinds = []
        for seed in range(args.first_seed, args.first_seed + args.pages):
            kinds += ref_char_kinds(line_kinds(make_page(seed, pool, cfg, args.synth / "fonts").markdown))
        out[str(share)] = round(sum(k == "paths" for k in kinds) / len(kinds), 4)
        print(f"path_lists {share}: {out[str(share)]:.3f} of the characters in paths")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "pages": args.pages,
                                    "paths_share_of_chars": out}, indent=1))


if __name__ == "__main__":
    main()
