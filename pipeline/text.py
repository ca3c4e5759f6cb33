"""Plain text of a page's markdown answer: what the CER metric compares (research.ocria_tiny.eval_ocr) and what the job measures a
read's length by (pipeline.blocks.prefer_blocks); the edit distance both the metric and the reads' vote
(pipeline.vote) count by."""
from __future__ import annotations

import re
from typing import Iterator, Sequence

import numpy as np


def collapse_ws(text: str) -> str:
    return " ".join(text.split())


_FENCE = re.compile(r"^\s*```.*$", re.M)
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+", re.M)
_LIST = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+", re.M)
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$", re.M)


def markdown_to_text(md: str) -> str:
    """Plain text of our markdown subset: fences, heading marks, list markers, table pipes and rules removed."""
    text = _FENCE.sub("", md)
    text = _TABLE_SEP.sub("", text)
    text = _HEADING.sub("", text)
    text = _LIST.sub("", text)
    text = re.sub(r"^\s*\|", "", text, flags=re.M)
    text = re.sub(r"\|\s*$", "", text, flags=re.M)
    text = text.replace(" | ", " ")
    return collapse_ws(text)


def edit_distance_rows(a: Sequence, b: Sequence) -> Iterator[np.ndarray]:
    """The rows of the edit-distance table (unit insert / delete / substitute): row i holds the distances of a[:i]
    to every prefix of b, rows 0..len(a). One numpy row per element of `a`: the insertion chain
    d[j] = min(d[j], d[j-1] + 1) is a running minimum of d[k] - k, plus j."""
    codes: dict = {}
    ai = np.array([codes.setdefault(x, len(codes)) for x in a], dtype=np.int64)
    bi = np.array([codes.setdefault(x, len(codes)) for x in b], dtype=np.int64)
    j = np.arange(len(b) + 1, dtype=np.int64)
    prev = j.copy()
    yield prev
    for i, x in enumerate(ai, 1):
        cur = np.empty_like(prev)
        cur[0] = i
        cur[1:] = np.minimum(prev[1:] + 1, prev[:-1] + (bi != x))  # deletion, substitution / match
        cur = np.minimum.accumulate(cur - j) + j  # insertion chains
        yield cur
        prev = cur


def levenshtein(a: Sequence, b: Sequence) -> int:
    """Edit distance (unit insert / delete / substitute), over the shorter sequence's rows."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    for row in edit_distance_rows(a, b):
        pass
    return int(row[-1])
