"""Ending an answer that has fallen into a loop ("directory/directory/directory/...").

A small reader that loses its place on a page can repeat one unit of a few tokens until max_tokens, and those
insertions can outweigh everything it read right (bench/results/ocria_tiny_s19_error_profile.json: two of 24
held-out pages hold a third of all character edits that way). The guard ends the answer once its tail is one unit of
p tokens repeated over at least `min_tokens` tokens, and keeps a single copy of the unit.

Per period p (1 <= p <= min_tokens // 3, so a loop is at least three units) it counts how many of the latest tokens
equal the token p before them: O(max period) work per new token, on the host, with no look back over the answer.
"""
from __future__ import annotations


class LoopGuard:
    def __init__(self, min_tokens: int):
        if min_tokens < 3:
            raise ValueError(f"a loop guard needs min_tokens >= 3, got {min_tokens}")
        self.min_tokens = min_tokens
        self.max_period = min_tokens // 3
        self.runs = [0] * (self.max_period + 1)  # runs[p]: latest tokens equal to the one p before them

    def push(self, tokens: list[int], start: int, end: int) -> int | None:
        """tokens[start:end] is the answer so far, tokens[end - 1] its new token. Returns the answer's length to keep
        (through the loop's first unit) once the tail is a loop of at least min_tokens tokens; else None."""
        n = end - start
        last = tokens[end - 1]
        for p in range(1, self.max_period + 1):
            self.runs[p] = self.runs[p] + 1 if n > p and tokens[end - 1 - p] == last else 0
            if self.runs[p] + p >= self.min_tokens:  # tokens[end - runs - p : end] repeat one unit of p tokens
                return n - self.runs[p]
        return None


def find_loop(tokens: list[int], min_tokens: int) -> int | None:
    """The reference: the first length of `tokens` at which the guard fires, and the length it keeps; by brute force
    over every prefix, period and span. Returns the kept length or None."""
    for n in range(1, len(tokens) + 1):
        for p in range(1, min_tokens // 3 + 1):
            span = p
            while span < n and tokens[n - 1 - span] == tokens[n - 1 - span + p]:
                span += 1
            if span >= min_tokens:
                return n - (span - p)
    return None
