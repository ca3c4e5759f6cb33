"""One answer from several reads of the same text block: a character vote, each read aligned to the read nearest the
others (the medoid), the majority kept at every place.

Reads of one block drawn at a few sizes (pipeline.blocks, model.block_scales) misread different characters, so their
vote misreads fewer than any one of them (docs/decisions.md). A character two reads agree on outvotes the third; where
all differ, the medoid's stands.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from pipeline.text import edit_distance_rows, levenshtein


def alignment(pivot: str, other: str) -> tuple[list[str], list[str]]:
    """`other` laid along `pivot` by a least-edits alignment: what it has at each of the pivot's characters ("" where
    it drops one), and what it inserts before each (the last entry: after the pivot's end)."""
    table = np.stack(list(edit_distance_rows(pivot, other))) if pivot else np.arange(len(other) + 1)[None, :]
    at, before = [""] * len(pivot), [""] * (len(pivot) + 1)
    i, j = len(pivot), len(other)
    while i > 0 or j > 0:  # a match first, then a deletion or an insertion before a swap of equal cost: a read that
        # drops one character and adds another nearby then votes for both, not for two swaps between them
        same = i > 0 and j > 0 and pivot[i - 1] == other[j - 1]
        if same and table[i, j] == table[i - 1, j - 1]:
            at[i - 1] = other[j - 1]
            i, j = i - 1, j - 1
        elif i > 0 and table[i, j] == table[i - 1, j] + 1:
            i -= 1  # other drops pivot[i]
        elif j > 0 and table[i, j] == table[i, j - 1] + 1:
            before[i] = other[j - 1] + before[i]
            j -= 1
        else:
            at[i - 1] = other[j - 1]
            i, j = i - 1, j - 1
    return _rightmost(pivot, at, before)


def _rightmost(pivot: str, at: list[str], before: list[str]) -> tuple[list[str], list[str]]:
    """The same alignment with every deletion and insertion inside a run of one character moved to the run's end, so
    reads that drop or add a "0" of "000" vote at one place (a least-edits alignment may pick any of them)."""
    for i in range(len(pivot)):
        if at[i] == "" and i + 1 < len(pivot) and not before[i + 1] and at[i + 1] == pivot[i + 1] == pivot[i]:
            at[i], at[i + 1] = pivot[i], ""
        while before[i] and at[i] == pivot[i] == before[i][0]:  # c + s + c reads as c, then s + c
            before[i], before[i + 1] = "", before[i][1:] + pivot[i] + before[i + 1]
    return at, before


def medoid(texts: Sequence[str]) -> int:
    """The index of the text with the fewest edits to all others; the earliest of equals."""
    dist = [[0] * len(texts) for _ in texts]
    for a in range(len(texts)):
        for b in range(a + 1, len(texts)):
            dist[a][b] = dist[b][a] = levenshtein(texts[a], texts[b])
    return min(range(len(texts)), key=lambda k: (sum(dist[k]), k))


def majority(texts: Sequence[str], voters: int | None = None) -> str | None:
    """The text more than half of `voters` reads (default: these) gave word for word, if there is one: no vote
    among them can change it."""
    text, count = Counter(texts).most_common(1)[0]
    return text if 2 * count > (len(texts) if voters is None else voters) else None


def vote(texts: Sequence[str]) -> str:
    """The reads' character vote: each place of the medoid keeps the character (or the deletion, or the insertion
    before it) most reads give there; on a tie the medoid's own."""
    if not texts:
        raise ValueError("vote needs at least one read")
    settled = majority(texts)
    if settled is not None:
        return settled
    k = medoid(texts)
    pivot = texts[k]
    others = [alignment(pivot, t) for n, t in enumerate(texts) if n != k]
    out = []
    for i in range(len(pivot) + 1):
        out.append(_most(["", *(before[i] for _, before in others)]))
        if i < len(pivot):
            out.append(_most([pivot[i], *(at[i] for at, _ in others)]))
    return "".join(out)


def _most(choices: list[str]) -> str:
    """The most frequent choice; the first (the medoid's) among equals."""
    counts = Counter(choices)
    return max(counts, key=lambda c: (counts[c], c == choices[0]))
