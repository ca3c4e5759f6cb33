"""Where a read's edits are: short edits (misread or dropped characters, under 20 in a row) against long runs dropped,
added or replaced (a line skipped, text written on), in plain text against the references of held-out pages drawn
here (so reads made with another PyMuPDF may meet other references on a few pages).

  python research/ocria_tiny/studies/edit_kinds.py research/ocria_tiny/results/s35_eval_cpu_blocks8_shipped_pages384-479.json \\
      --out research/ocria_tiny/results/s35_edit_kinds_shipped_pages384-479.json
"""
import argparse
import difflib
import json
from pathlib import Path

from research.ocria_tiny.eval_ocr import Drawing, heldout_pages
from research.ocria_tiny.train_config import load_config
from pipeline.text import markdown_to_text

LONG = 20  # characters in one edit from which it is a run, not a misread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("read", type=Path, help="a research.ocria_tiny.eval_ocr output with held-out pages")
    ap.add_argument("--glyph-px", type=float, default=32.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    cfg = load_config(Path("research/ocria_tiny/results/eval_full_pages_1536_config.yaml"), [])
    rows = json.loads(args.read.read_text())["heldout_synthetic"]["per_page"]
    first = int(rows[0]["page"].rsplit("_", 1)[1])
    pages = heldout_pages(len(rows), cfg, Path(".synth"), first=first,
                          drawing=Drawing(cfg["image"]["target_longest_px"], 7225344, args.glyph_px))
    edits = {"short": 0, "long_delete": 0, "long_insert": 0, "long_replace": 0}
    ref_chars = 0
    for page, row in zip(pages, rows):
        ref, hyp = markdown_to_text(page.reference_md), markdown_to_text(row["model_output"])
        ref_chars += len(ref)
        for op, a0, a1, b0, b1 in difflib.SequenceMatcher(None, ref, hyp, autojunk=False).get_opcodes():
            n = max(a1 - a0, b1 - b0)
            if op != "equal":
                edits["short" if n < LONG else "long_" + op] += n
    out = {"command": f"python research/ocria_tiny/studies/edit_kinds.py {args.read}", "pages": len(rows), "ref_chars": ref_chars,
           "edits": edits, "per_ref_char": {k: round(v / ref_chars, 4) for k, v in edits.items()}}
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
