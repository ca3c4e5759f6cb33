"""How well ocria-tiny reads held-out pages when fed the reference (teacher forcing): per answer token, its loss and
whether the model's top choice is the reference token. One forward pass a page, so it scores many more pages than
free-running CER can in the same CPU time, and a page that runs on or stops early does not swamp it: checkpoints
of one lineage, or two arms of an A/B, compare on reading alone.

Tokens are also split by the word they fall in: words that occur in the training text pool ("seen") and words that
do not ("unseen": names, paths, numbers, words only the held-out sources use). Words are compared without the
punctuation around them, and markup (`|`, `###`, `-`) counts as seen. A reader that guesses from its language
model does much worse on unseen words than one that reads the glyphs. Unseen words are scored once more on their
tokens after the one holding the word's first letter ("unseen_inside"; whitespace and punctuation before it left
out): a reader that finds the word but guesses its rest gets that first token right and the others wrong. And the
answer's tokens are cut into tenths by their place in it ("by_tenth", pooled over pages, so long pages weigh most
late): where on a page reading degrades. Whether a late dip is what late text is or where it is: each tenth is split
again by class (the markdown line's kind — paragraph, heading, list, table, code — and seen/unseen), the class mix
of each tenth gives the top-1 it would have if every class read as well as it does over the whole page
("top1_by_tenth_expected"), the tenths are scored apart on one- and two-column pages, and the tokens are also
counted in buckets of 128 by their place in the answer ("top1_by_position"), so a long answer's late tokens compare
with a short answer's.

  .venv/bin/python bench/ocria_tiny_teacher_forced.py --model models/ocria-tiny --heldout 96 \
      --config bench/results/ocria_tiny_eval_full_pages_1536_config.yaml --out build/tf.json
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.eval_ocr import MARKDOWN_LINE_KINDS, markdown_line_kinds  # noqa: E402

PUNCTUATION = "\"'`.,;:!?()[]{}<>*_#|-"


def word_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, word) of every whitespace-separated word of `text`."""
    return [(m.start(), m.end(), m.group()) for m in re.finditer(r"\S+", text)]


def word_core(word: str) -> str:
    """The word without the punctuation around it ("(License:" -> "License"); empty for markup such as "|"."""
    return word.strip(PUNCTUATION)


def token_words(offsets: list[tuple[int, int]], text: str) -> list[tuple[int, int, str] | None]:
    """For each token (its character offsets in `text`), the word span it falls in; a token that starts with
    whitespace belongs to the word after it, and trailing whitespace to none."""
    spans = word_spans(text)
    words, w = [], 0
    for start, _ in offsets:
        while w < len(spans) and spans[w][1] <= start:
            w += 1
        words.append(spans[w] if w < len(spans) else None)
    return words


def token_seen(offsets: list[tuple[int, int]], text: str, vocabulary: set[str]) -> list[bool]:
    """For each token, whether the word it falls in is seen: markup, or its `word_core` in `vocabulary` (trailing
    whitespace, with no word to read, counts as seen)."""
    cores = [word_core(w[2]) if w else "" for w in token_words(offsets, text)]
    return [not core or core in vocabulary for core in cores]


def token_inside_word(offsets: list[tuple[int, int]], text: str) -> list[bool]:
    """For each token, whether it starts after its word's first letter: the word's rest, once the token holding its
    start has been written. Whitespace, leading punctuation and markup are never inside."""
    inside = []
    for (start, _), w in zip(offsets, token_words(offsets, text)):
        core = word_core(w[2]) if w else ""
        inside.append(bool(core) and start > w[0] + len(w[2]) - len(w[2].lstrip(PUNCTUATION)))
    return inside


POSITION_BUCKET = 128  # answer tokens a "by_position" bucket holds


def token_line_kinds(offsets: list[tuple[int, int]], markdown: str) -> list[str]:
    """For each token, the kind of the markdown line its first character is on (a code fence's lines are code; an
    empty line, or a line's newline, goes with the line before)."""
    kinds, starts, pos = markdown_line_kinds(markdown), [], 0
    for line in markdown.split("\n"):
        starts.append(pos)
        pos += len(line) + 1
    out, i = [], 0
    for start, _ in offsets:
        while i + 1 < len(starts) and starts[i + 1] <= start:
            i += 1
        out.append(kinds[i])
    return out


def pool_vocabulary(pool) -> set[str]:
    """The `word_core`s of a TextPool's prose and code words (markup, whose core is empty, left out)."""
    lines = pool.prose + [line for run in pool.code for line in run]
    return {c for line in lines for w in line.split() if (c := word_core(w))}


def training_words(pool_path: Path) -> set[str]:
    from pipeline.synthetic import TextPool

    return pool_vocabulary(TextPool.from_json_gz(pool_path))


def score_page(reader, image, markdown: str, vocabulary: set[str], max_answer: int) -> dict:
    """Sums over one page's answer tokens (the stop token, if the answer was not cut, in `all` only), by class of
    word, by tenth of the answer, and by tenth and class together (see the module's docstring)."""
    import torch

    b = reader.builder
    logits, targets = reader.fed_answer(image, markdown, max_answer)
    nll = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    right = logits.argmax(-1) == targets
    enc = b.tok.encode(markdown, add_special_tokens=False)
    # the answer is the markdown's tokens and the stop token, or the tokens alone when cut at max_answer
    n_text = len(targets) - int(targets[-1] == b.ids.im_end)
    if enc.ids[:n_text] != targets[:n_text].tolist():
        raise ValueError("the answer's tokens are not the markdown's: the prompt builder changed how it encodes")
    seen = torch.tensor(token_seen(enc.offsets[:n_text], markdown, vocabulary))
    inside = torch.tensor(token_inside_word(enc.offsets[:n_text], markdown))

    def part(mask) -> dict:
        return {"tokens": int(mask.sum()), "nll": float(nll[:n_text][mask].sum()),
                "right": int(right[:n_text][mask].sum())}

    out = {"tokens": len(targets), "nll": float(nll.sum()), "right": int(right.sum()),
           "seen": part(seen), "unseen": part(~seen), "unseen_inside": part(~seen & inside)}
    tenth = torch.arange(n_text) * 10 // max(n_text, 1)
    out["by_tenth"] = [part(tenth == t) for t in range(10)]
    # and by place counted in tokens, so a long page's late tokens compare with a short page's
    bucket = torch.arange(n_text) // POSITION_BUCKET
    out["by_position"] = [part(bucket == b) for b in range(int(bucket.max()) + 1 if n_text else 0)]
    kinds = token_line_kinds(enc.offsets[:n_text], markdown)
    out["by_tenth_class"] = {}
    for kind in MARKDOWN_LINE_KINDS:
        of_kind = torch.tensor([k == kind for k in kinds], dtype=torch.bool)
        for name, word_class in (("seen", seen), ("unseen", ~seen)):
            cells = [of_kind & word_class & (tenth == t) for t in range(10)]
            out["by_tenth_class"][f"{kind}_{name}"] = {"tokens": [int(c.sum()) for c in cells],
                                                       "right": [int(right[:n_text][c].sum()) for c in cells]}
    return out


def totals(rows: list[dict]) -> dict:
    def part(get, of: list[dict] = rows) -> dict:
        n = sum(get(r)["tokens"] for r in of)
        return {"tokens": n, "nll_per_token": round(sum(get(r)["nll"] for r in of) / n, 4) if n else None,
                "top1_accuracy": round(sum(get(r)["right"] for r in of) / n, 4) if n else None}

    out = {"pages": len(rows), "all": part(lambda r: r)}
    out["all"]["perplexity"] = round(math.exp(out["all"]["nll_per_token"]), 3)
    for name in ("seen", "unseen", "unseen_inside"):
        out[name] = part(lambda r: r[name])
    out["unseen"]["token_share"] = round(out["unseen"]["tokens"] / (out["seen"]["tokens"] + out["unseen"]["tokens"]), 4)
    out["top1_by_tenth"] = [part(lambda r: r["by_tenth"][t])["top1_accuracy"] for t in range(10)]
    buckets = max((len(r.get("by_position", [])) for r in rows), default=0)
    if buckets:
        out["top1_by_position"] = {
            f"{b * POSITION_BUCKET}-{(b + 1) * POSITION_BUCKET - 1}": part(
                lambda r: r["by_position"][b] if b < len(r["by_position"]) else {"tokens": 0, "nll": 0, "right": 0})
            for b in range(buckets)}
    if rows and "by_tenth_class" in rows[0]:
        out.update(tenths_by_class(rows))
    for columns in sorted({r["columns"] for r in rows if r.get("columns")}):
        of = [r for r in rows if r.get("columns") == columns]
        out.setdefault("top1_by_tenth_by_columns", {})[str(columns)] = {
            "pages": len(of), "top1": [part(lambda r: r["by_tenth"][t], of)["top1_accuracy"] for t in range(10)]}
    return out


def tenths_by_class(rows: list[dict]) -> dict:
    """Each class's share of each tenth's tokens and its top-1 there, and the top-1 each tenth would have with its
    own class mix but every class reading at its whole-page rate."""
    classes = list(rows[0]["by_tenth_class"])
    tok = {c: [sum(r["by_tenth_class"][c]["tokens"][t] for r in rows) for t in range(10)] for c in classes}
    hit = {c: [sum(r["by_tenth_class"][c]["right"][t] for r in rows) for t in range(10)] for c in classes}
    per_tenth = [sum(tok[c][t] for c in classes) for t in range(10)]
    rate = {c: sum(hit[c]) / sum(tok[c]) for c in classes if sum(tok[c])}

    def ratio(a, b):
        return round(a / b, 4) if b else None

    kinds = {k: [c for c in classes if c.startswith(k + "_")] for k in MARKDOWN_LINE_KINDS}
    return {
        "token_share_by_tenth": {c: [ratio(tok[c][t], per_tenth[t]) for t in range(10)] for c in classes},
        "top1_by_tenth_class": {c: [ratio(hit[c][t], tok[c][t]) for t in range(10)] for c in classes},
        "top1_by_tenth_kind": {k: [ratio(sum(hit[c][t] for c in cs), sum(tok[c][t] for c in cs)) for t in range(10)]
                               for k, cs in kinds.items()},
        "top1_by_tenth_expected": [ratio(sum(tok[c][t] * rate.get(c, 0) for c in classes), per_tenth[t])
                                   for t in range(10)],
    }


def main(argv: list[str] | None = None) -> int:
    from jobs.eval_ocr import HFPageReader, heldout_pages, pool_fingerprint
    from jobs.train_tiny import load_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, action="append", required=True, help="repeat to score several checkpoints")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--heldout", type=int, default=96)
    ap.add_argument("--heldout-from", type=int, default=0, help="the first held-out page's number")
    ap.add_argument("--max-answer", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--device", default="cpu", help="cuda scores A/B arms on the training machine (fp32 there too)")
    args = ap.parse_args(argv)

    pages = heldout_pages(args.heldout, load_config(args.config, []), args.synth, first=args.heldout_from)
    vocabulary = training_words(args.synth / "pool_train.json.gz")
    out = {"command": "python bench/ocria_tiny_teacher_forced.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "pool": pool_fingerprint(args.synth), "models": {}}
    for model in args.model:
        reader = HFPageReader(model, device=args.device)
        rows = []
        for p in pages:
            rows.append({"page": p.name, "columns": p.columns,
                         **score_page(reader, p.image, p.reference_md, vocabulary, args.max_answer)})
        out["models"][str(model)] = {"summary": totals(rows), "per_page": rows}
        print(json.dumps({str(model): totals(rows)}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
