"""Reads of the same held-out pages (eval_ocr outputs, e.g. pages drawn at glyph 30, 32 and 34) voted on page by page
(pipeline.vote on their plain texts): pooled CER of the first read, of the medoid read and of the vote.

    python research/ocria_tiny/studies/page_vote.py A.json B.json C.json --out result.json
"""
import argparse
import json
from pathlib import Path

from research.ocria_tiny.eval_ocr import heldout_pages, levenshtein, markdown_to_text
from research.ocria_tiny.train_config import load_config
from pipeline.vote import medoid, vote


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reads", nargs="+", type=Path)
    ap.add_argument("--config", type=Path, default=Path("research/ocria_tiny/results/eval_full_pages_1536_config.yaml"))
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    reads = [json.loads(f.read_text())["heldout_synthetic"]["per_page"] for f in args.reads]
    names = [r["page"] for r in reads[0]]
    assert all([r["page"] for r in rs] == names for rs in reads), "the reads are not of the same pages"
    cfg = load_config(args.config, [])
    pages = heldout_pages(len(names), cfg, args.synth, first=int(names[0].split("_")[1]))
    edits = {"first": 0, "medoid": 0, "vote": 0}
    chars = 0
    for i, page in enumerate(pages):
        hyps = [markdown_to_text(rs[i]["model_output"]) for rs in reads]
        for kind, hyp in (("first", hyps[0]), ("medoid", hyps[medoid(hyps)]), ("vote", vote(hyps))):
            edits[kind] += levenshtein(hyp, page.reference_text)
        chars += len(page.reference_text)
    result = {"reads": [str(f) for f in args.reads], "pages": len(pages),
              "pooled_cer": {k: round(v / chars, 4) for k, v in edits.items()}}
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
