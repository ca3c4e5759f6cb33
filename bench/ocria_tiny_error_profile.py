"""Where ocria-tiny's character errors on held-out full pages come from: pages where it stops before the page's end,
pages where it runs on past it, and misreads on pages it reads to the end. Per page: CER, output length against the
reference's, how the reference's lines fare against their best-matching output line, and, fed the reference itself
(teacher forcing), the probability the model gives its stop token at the page's end and its highest inside the page:
does it know where a page ends when it has read it right?

  .venv/bin/python bench/ocria_tiny_error_profile.py --model models/ocria-tiny --heldout 24 \
      --config bench/results/ocria_tiny_eval_full_pages_1536_config.yaml --out bench/results/ocria_tiny_s17_error_profile.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Output length / reference length outside these bounds: the page ended early or ran on. Pages read to their end
# measured 0.86-1.06 in session 17; the end-of-page failures 0.17-0.39 and 1.17-1.48.
STOPPED_EARLY_BELOW = 0.8
RAN_ON_ABOVE = 1.15
LINE_READ_CER = 0.2  # a reference line counts as read when its best-matching output line is this close
LINE_MISSED_CER = 0.6  # ... and as missed when none is closer than this


def page_class(length_ratio: float) -> str:
    if length_ratio < STOPPED_EARLY_BELOW:
        return "stopped_early"
    if length_ratio > RAN_ON_ABOVE:
        return "ran_on"
    return "read_to_end"


def line_profile(hyp_md: str, ref_md: str) -> dict:
    """Shares of the reference's characters in lines read / missed, each line scored against its closest output line."""
    from jobs.eval_ocr import levenshtein, markdown_to_text

    def lines(md: str) -> list[str]:
        return [t for t in (markdown_to_text(line) for line in md.splitlines()) if t]

    ref, hyp = lines(ref_md), lines(hyp_md)
    best = [min((levenshtein(h, r) / len(r) for h in hyp), default=1.0) for r in ref]
    chars = sum(len(r) for r in ref) or 1
    return {"ref_lines": len(ref), "out_lines": len(hyp),
            "chars_in_lines_read": round(sum(len(r) for r, b in zip(ref, best) if b <= LINE_READ_CER) / chars, 3),
            "chars_in_lines_missed": round(sum(len(r) for r, b in zip(ref, best) if b > LINE_MISSED_CER) / chars, 3),
            "repeated_out_lines": len(hyp) - len(set(hyp))}


def stop_probabilities(reader, image, markdown: str, max_answer: int) -> dict:
    """The reference fed as the answer: P(<|im_end|>) where it is the target, and its highest elsewhere, with the
    reference text just before that position."""
    b = reader.builder
    logits, targets = reader.fed_answer(image, markdown, max_answer)
    p_stop = logits.softmax(-1)[:, b.ids.im_end]
    inside = targets != b.ids.im_end
    k = int(p_stop.masked_fill(~inside, -1).argmax())
    return {"p_stop_at_end": round(float(p_stop[~inside].max()), 4) if bool((~inside).any()) else None,
            "max_p_stop_inside": round(float(p_stop[k]), 4),
            "positions_inside_p_stop_over_half": int((p_stop[inside] > 0.5).sum()),
            "max_p_stop_inside_after": b.tok.decode(targets[max(0, k - 12) : k].tolist())}


def summarize(rows: list[dict]) -> dict:
    edits = sum(r["char_edits"] for r in rows) or 1
    out = {"pages": len(rows), "cer": round(sum(r["char_edits"] for r in rows) / sum(r["ref_chars"] for r in rows), 4)}
    for cls in ("stopped_early", "ran_on", "read_to_end"):
        mine = [r for r in rows if r["class"] == cls]
        ref_chars = sum(r["ref_chars"] for r in mine)
        out[cls] = {"pages": len(mine), "share_of_char_edits": round(sum(r["char_edits"] for r in mine) / edits, 3),
                    "cer": round(sum(r["char_edits"] for r in mine) / ref_chars, 4) if ref_chars else None}
    return out


def stop_summary(rows: list[dict]) -> dict:
    """Per page class: the median stop probability at the page's end, and how many pages have a position inside the
    page where the model, fed the reference, would rather stop."""
    out = {}
    for cls in ("stopped_early", "ran_on", "read_to_end"):
        mine = [r for r in rows if r["class"] == cls]
        ends = sorted(r["p_stop_at_end"] for r in mine if r["p_stop_at_end"] is not None)
        out[cls] = {"pages": len(mine), "median_p_stop_at_end": ends[len(ends) // 2] if ends else None,
                    "pages_with_p_stop_inside_over_half": sum(r["positions_inside_p_stop_over_half"] > 0 for r in mine)}
    return out


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from jobs.eval_ocr import HFPageReader, heldout_pages, levenshtein, markdown_to_text
    from jobs.train_tiny import load_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--heldout", type=int, default=24)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    pages = heldout_pages(args.heldout, load_config(args.config, []), args.synth)
    reader = HFPageReader(args.model)
    rows = []
    for k in range(0, len(pages), args.batch):
        chunk = pages[k : k + args.batch]
        for p, hyp in zip(chunk, reader.read([p.image for p in chunk], args.max_new_tokens)):
            text = markdown_to_text(hyp)
            ratio = len(text) / len(p.reference_text)
            rows.append({"page": p.name, "class": page_class(ratio), "length_ratio": round(ratio, 2),
                         "out_tokens": len(reader.builder.tok.encode(hyp, add_special_tokens=False).ids),
                         "ref_chars": len(p.reference_text), "char_edits": levenshtein(text, p.reference_text),
                         **line_profile(hyp, p.reference_md),
                         **stop_probabilities(reader, p.image, p.reference_md, args.max_new_tokens),
                         "output_tail": hyp[-160:]})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "output_tail"}), flush=True)
    out = {"command": "python bench/ocria_tiny_error_profile.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "bounds": {"stopped_early_below": STOPPED_EARLY_BELOW, "ran_on_above": RAN_ON_ABOVE,
                      "line_read_cer": LINE_READ_CER, "line_missed_cer": LINE_MISSED_CER},
           "summary": summarize(rows), "stop_token_fed_the_reference": stop_summary(rows), "per_page": rows}
    print(json.dumps({k: out[k] for k in ("summary", "stop_token_fed_the_reference")}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
