"""How long ocria-tiny's answers are in tokens, and where a model stops: training pages (the training text pool)
and held-out pages (the held-out pool, drawn by jobs.eval_ocr), both as the eval config draws full pages; with
--model, the model's greedy output on the held-out pages, its length in tokens and the share of each page's
reference it never reached. Session 16 found the training cap (data.max_answer_tokens 448, with a stop token
after the cut) taught the model to stop at ~447 tokens on pages that go on. --train-set draws the training pages
as a recipe does (session 25: F2U's and F2UL's page lengths against the held-out pages').

  .venv/bin/python bench/ocria_tiny_answer_lengths.py --model models/ocria-tiny --heldout 24 --train-pages 400 \
      --config bench/results/ocria_tiny_eval_full_pages_1536_config.yaml --out bench/results/ocria_tiny_s16_answer_lengths.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def quantiles(lengths: list[int], caps: list[int]) -> dict:
    s = sorted(lengths)
    n = len(s)
    if not n:
        return {"pages": 0}
    shares = {f"share_over_{c}": round(sum(x > c for x in s) / n, 3) for c in caps}
    return {"pages": n, "mean": round(sum(s) / n, 1), "p50": s[n // 2], "p90": s[int(n * 0.9)],
            "p99": s[int(n * 0.99)], "max": s[-1], **shares}


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from jobs.eval_ocr import HFPageReader, heldout_pages, markdown_to_text
    from jobs.train_tiny import PromptBuilder, load_config, synth_config
    from pipeline.synthetic import TextPool, make_page

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override, key=value")
    ap.add_argument("--train-set", dest="train_overrides", action="append", default=[],
                    help="config override for the training pages only, key=value: a recipe's data.curriculum "
                         "(its main pages, without the stage's mix)")
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--tokenizer", type=Path, default=Path("models/ocria-tiny"), help="model folder whose tokenizer counts")
    ap.add_argument("--model", type=Path, default=None, help="read the held-out pages with this checkpoint")
    ap.add_argument("--heldout", type=int, default=24)
    ap.add_argument("--train-pages", type=int, default=400)
    ap.add_argument("--old-cap", type=int, default=447, help="answer tokens the old cap kept before its stop token")
    ap.add_argument("--share-over", type=int, action="append", default=[],
                    help="also the share of answers longer than this many tokens (repeat)")
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    cfg = load_config(args.config, args.overrides)
    builder = PromptBuilder(args.tokenizer, cfg["prompt"])

    def n_tokens(markdown: str) -> int:
        return len(builder.tok.encode(markdown, add_special_tokens=False).ids)

    pool = TextPool.from_json_gz(args.synth / "pool_train.json.gz")
    train_cfg = load_config(args.config, args.overrides + args.train_overrides)
    train = [n_tokens(make_page(cfg["data"]["seed"] + 10_000_000 + i, pool, synth_config(train_cfg, i),
                                args.synth / "fonts").markdown) for i in range(args.train_pages)]
    pages = heldout_pages(args.heldout, cfg, args.synth)
    out = {"command": "python bench/ocria_tiny_answer_lengths.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "train_pages": quantiles(train, [args.old_cap, *args.share_over]),
           "heldout_pages": quantiles([n_tokens(p.reference_md) for p in pages], [args.old_cap, *args.share_over])}
    if args.model is not None:
        reader = HFPageReader(args.model)
        rows = []
        for k in range(0, len(pages), 6):
            chunk = pages[k : k + 6]
            for p, hyp in zip(chunk, reader.read([p.image for p in chunk], args.max_new_tokens)):
                ref_ids = builder.tok.encode(p.reference_md, add_special_tokens=False).ids
                reached = len(markdown_to_text(builder.tok.decode(ref_ids[: n_tokens(hyp)])))
                # an estimate: the reference characters past as many reference tokens as the output has
                rows.append({"page": p.name, "ref_tokens": len(ref_ids), "out_tokens": n_tokens(hyp),
                             "ref_chars": len(p.reference_text), "ref_chars_not_reached": max(0, len(p.reference_text) - reached)})
                print(json.dumps(rows[-1]), flush=True)
        long = [r for r in rows if r["ref_tokens"] > args.old_cap]
        out["model"] = {
            "checkpoint": str(args.model), "max_new_tokens": args.max_new_tokens, "per_page": rows,
            "pages_longer_than_cap": len(long),
            "their_out_tokens": sorted(r["out_tokens"] for r in long),
            "share_of_reference_chars_not_reached": round(
                sum(r["ref_chars_not_reached"] for r in rows) / sum(r["ref_chars"] for r in rows), 3)}
    print(json.dumps({k: v for k, v in out.items() if k != "model"} | {"model": {k: v for k, v in out.get("model", {}).items() if k != "per_page"}}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
