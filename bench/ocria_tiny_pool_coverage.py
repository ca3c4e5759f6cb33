"""How many of the held-out pool's words the training pool holds, and how many more a broader training pool would:
the docstrings of an installed site-packages folder (numpy left out: held-out pages take their code from it; tests
left out), as `pipeline.synthetic.collect_pool` takes the stdlib's.

A model that guesses from its training text reads held-out words it never saw far worse (bench/ocria_tiny_teacher_
forced.py). If more docstrings held most of those words, a broader pool would be the next lever; if not, the unseen
words are names, addresses, dates and paths that no prose pool holds, and only reading the glyphs reads them.

  .venv/bin/python bench/ocria_tiny_pool_coverage.py --site-packages .venv/lib/python3.11/site-packages \\
      --out bench/results/ocria_tiny_s31_pool_coverage.json
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ocria_tiny_teacher_forced import pool_vocabulary, word_core  # noqa: E402
from pipeline.synthetic import TextPool, python_docstrings  # noqa: E402

LEFT_OUT_PACKAGES = ("numpy",)


def prose_words(pool: TextPool) -> list[str]:
    """Every word of the pool's prose as its `word_core`, in order, repeats kept (markup left out)."""
    return [c for para in pool.prose for w in para.split() if (c := word_core(w))]


def coverage(words: list[str], vocabulary: set[str]) -> float:
    """The share of `words` (occurrences, not distinct words) that `vocabulary` holds."""
    return sum(w in vocabulary for w in words) / max(1, len(words))


def word_kind(word: str) -> str:
    """A rough class of a word: what kind of text a reader must take from the glyphs when no pool holds it."""
    if "@" in word:
        return "address"
    if "/" in word or "\\" in word or "_" in word or re.search(r"\.[A-Za-z]", word):
        return "path_or_identifier"
    if re.search(r"\d", word):
        return "has_digit"
    return "capitalised" if word[:1].isupper() else "lower_case"


def unseen_kinds(words: list[str], vocabulary: set[str]) -> dict[str, float]:
    """The share of each word_kind among the occurrences of `words` that `vocabulary` lacks."""
    kinds = collections.Counter(word_kind(w) for w in words if w not in vocabulary)
    total = max(1, sum(kinds.values()))
    return {k: round(n / total, 3) for k, n in kinds.most_common()}


def site_docstrings(site: Path, known: set[str]) -> tuple[list[str], collections.Counter]:
    """Docstring paragraphs of every module under `site` outside LEFT_OUT_PACKAGES and test folders, new to `known`;
    and the characters each top-level package gave."""
    paragraphs, chars = [], collections.Counter()
    for path in sorted(site.rglob("*.py")):
        rel = path.relative_to(site).parts
        if rel[0].startswith(LEFT_OUT_PACKAGES) or {"test", "tests"} & set(rel[:-1]):
            continue
        found = python_docstrings(path)
        paragraphs += found
        chars[rel[0]] += sum(map(len, found))
    return [p for p in dict.fromkeys(paragraphs) if p not in known], chars


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--site-packages", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    t0 = time.time()
    train = TextPool.from_json_gz(args.synth / "pool_train.json.gz")
    heldout_words = prose_words(TextPool.from_json_gz(args.synth / "pool_heldout.json.gz"))
    vocabulary = pool_vocabulary(train)
    extra, chars = site_docstrings(args.site_packages, set(train.prose))
    broader = vocabulary | pool_vocabulary(TextPool(prose=extra, code=[]))
    result = {
        "heldout_prose_words": len(heldout_words),
        "train_pool": {"paragraphs": len(train.prose), "chars": sum(map(len, train.prose)),
                       "vocabulary": len(vocabulary), "heldout_coverage": round(coverage(heldout_words, vocabulary), 4),
                       "heldout_words_missing_by_kind": unseen_kinds(heldout_words, vocabulary)},
        "site_docstrings": {"paragraphs": len(extra), "chars": sum(map(len, extra)),
                            "top_packages_chars": dict(chars.most_common(10))},
        "train_pool_with_site_docstrings": {"vocabulary": len(broader),
                                            "heldout_coverage": round(coverage(heldout_words, broader), 4)},
        "seconds": round(time.time() - t0, 1),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
