"""What the job's block reading (model.block_lines, block_tolerance) makes of two saved reads of the same pages: the
page's own read unless its plain text's length differs from the blocks' read by more than the tolerance
(pipeline.blocks.prefer_blocks). Reads are `jobs.eval_ocr` outputs: the whole pages, and the same pages with
`--block-lines N` (blocks only). Prints the pooled plain-text CER per tolerance; with one tolerance and `--out`, writes
the chosen reads as an eval_ocr output (for bench/ocria_tiny_paired_cer.py).

  python bench/ocria_tiny_hybrid_read.py \\
      --page-read bench/results/ocria_tiny_s32_eval_gpu_fp32_f2ug_glyph30_pages0-191.json \\
      --block-read bench/results/ocria_tiny_s33_eval_native_blocks8_pages0-95.json \\
                   bench/results/ocria_tiny_s33_eval_native_blocks8_pages96-191.json \\
      --tolerance 0.1 --out bench/results/ocria_tiny_s33_hybrid_blocks8_t0.1_pages0-191.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ocria_tiny_paired_cer import read_pages  # noqa: E402
from pipeline.blocks import prefer_blocks  # noqa: E402


def same_reference(a: dict, b: dict) -> bool:
    return a["model_text"]["ref_chars"] == b["model_text"]["ref_chars"]


def pooled(rows: list[dict]) -> float:
    return sum(p["model_text"]["cer"] * p["model_text"]["ref_chars"] for p in rows) / sum(
        p["model_text"]["ref_chars"] for p in rows)


def choose(whole: dict[str, dict], blocks: dict[str, dict], tolerance: float) -> tuple[list[dict], list[str]]:
    """Per page of the block read, the row kept, and the pages whose block read was taken. A page whose two reads
    have other references (drawn by another PyMuPDF, the same seed lays out another document) keeps its whole read:
    its block read read another page."""
    rows, taken = [], []
    for page, b in blocks.items():
        w = whole[page]
        if same_reference(w, b) and prefer_blocks(w["model_output"], b["model_output"], tolerance):
            rows.append(b)
            taken.append(page)
        else:
            rows.append(w)
    return rows, taken


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--page-read", type=Path, nargs="+", required=True, help="eval_ocr outputs of whole pages")
    ap.add_argument("--block-read", type=Path, nargs="+", required=True, help="eval_ocr outputs read in blocks")
    ap.add_argument("--tolerance", type=float, nargs="+", default=[0.1])
    ap.add_argument("--section", default="heldout_synthetic", choices=["heldout_synthetic", "corpus"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    whole, blocks = ({p["page"]: p for p in read_pages(files, section=args.section)}
                     for files in (args.page_read, args.block_read))
    missing = sorted(set(blocks) - set(whole))
    if missing:
        raise SystemExit(f"pages read in blocks but not whole: {missing[:5]}")
    differ = sorted(p for p in blocks if not same_reference(whole[p], blocks[p]))
    if differ:
        print(f"pages whose two reads have other references (another PyMuPDF): {differ}; their whole read is kept")
    print(f"{len(blocks)} pages: whole {pooled([whole[p] for p in blocks]):.4f}, blocks {pooled(list(blocks.values())):.4f}")
    print("tolerance  pooled CER  blocks taken")
    for t in args.tolerance:
        rows, taken = choose(whole, blocks, t)
        print(f"{t:9.3f}  {pooled(rows):10.4f}  {len(taken):12d}")
    if args.out and len(args.tolerance) == 1:
        rows, taken = choose(whole, blocks, args.tolerance[0])
        out = {"command": " ".join(["python", *sys.argv]), "page_read": [str(f) for f in args.page_read],
               "block_read": [str(f) for f in args.block_read], "tolerance": args.tolerance[0],
               "references_differ": differ,
               args.section: {"per_page": rows, "blocks_taken": taken,
                              "model_text": {"cer": pooled(rows), "pages": len(rows)}}}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
