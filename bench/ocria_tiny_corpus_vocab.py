"""Would more training text of the kinds this machine has bring ocria-tiny's words closer to the corpus? The share
of the corpus first pages' words (the text layers of the pages jobs.eval_ocr scores; words of 3+ letters, lower
case) found in the training pool's prose, then with the docstrings of installed packages added one by one.

  .venv/bin/python bench/ocria_tiny_corpus_vocab.py --out bench/results/ocria_tiny_s16_corpus_vocab.json
"""
from __future__ import annotations

import gzip
import json
import re
import sys
import sysconfig
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.eval_ocr import born_digital_rows, normalize_reference
from pipeline.synthetic import python_docstrings


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]{3,}", text.lower())


@click.command()
@click.option("--corpus", default=str(ROOT.parent / "shared" / "corpus"), show_default=True)
@click.option("--pages", default=12, show_default=True)
@click.option("--synth", default=".synth", show_default=True)
@click.option("--packages", default="torch,transformers,pandas,sympy,pydantic,ray", show_default=True,
              help="installed packages whose docstrings to add, in order")
@click.option("--out", default=None)
def main(corpus: str, pages: int, synth: str, packages: str, out: str | None) -> None:
    import pymupdf

    corpus_words = []
    for row in born_digital_rows(Path(corpus))[:pages]:
        with pymupdf.open(Path(corpus) / row["filename"]) as doc:
            corpus_words += words(normalize_reference(doc[0].get_text("text")))
    with gzip.open(Path(synth) / "pool_train.json.gz") as f:
        pool = json.loads(f.read())
    vocab = {w for para in pool["prose"] for w in words(para)}

    def coverage() -> float:
        return round(sum(w in vocab for w in corpus_words) / len(corpus_words), 3)

    rows = [{"added": "training pool prose", "vocab": len(vocab), "coverage": coverage()}]
    site = Path(sysconfig.get_paths()["purelib"])
    for pkg in packages.split(","):
        if not (site / pkg).is_dir():
            rows.append({"added": pkg, "absent": True})
            continue
        docstrings = [d for p in sorted((site / pkg).rglob("*.py")) for d in python_docstrings(p)]
        vocab |= {w for d in docstrings for w in words(d)}
        rows.append({"added": pkg, "docstrings": len(docstrings), "vocab": len(vocab), "coverage": coverage()})
    result = {"command": "python bench/ocria_tiny_corpus_vocab.py " + " ".join(sys.argv[1:]),
              "corpus_words": len(corpus_words), "cumulative": rows}
    for r in rows:
        print(r)
    if out:
        Path(out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
