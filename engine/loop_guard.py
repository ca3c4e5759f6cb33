"""Ending an answer that has fallen into a loop ("directory/directory/directory/...").

A small reader that loses its place on a page can repeat one unit of a few tokens until max_tokens, and those
insertions can outweigh everything it read right. The guard ends the answer once its tail is one unit of
p tokens repeated over at least `min_tokens` tokens, and keeps a single copy of the unit.

Per period p (1 <= p <= min_tokens // 3, so a loop is at least three units) it counts how many of the latest tokens
equal the token p before them: O(max period) work per new token, on the host, with no look back over the answer.

Ending the answer loses what the model reads after a loop it leaves by itself, which it does on real pages.
LoopDrop keeps reading instead and leaves the loop's repeats out
of the answer: the same guard marks each repeat as it comes, and the answer is the tokens outside those spans.
With the ban (SamplingParams.loop_ban_next) the engine also forbids the token that would go on with the loop, at the
first step it can still change, so the model leaves the loop instead of waiting for it to leave by itself.
"""
from __future__ import annotations


class LoopGuard:
    def __init__(self, min_tokens: int):
        if min_tokens < 3:
            raise ValueError(f"a loop guard needs min_tokens >= 3, got {min_tokens}")
        self.min_tokens = min_tokens
        self.max_period = min_tokens // 3
        self.runs = [0] * (self.max_period + 1)  # runs[p]: latest tokens equal to the one p before them
        self.period = 0  # the loop's period at the latest push that fired, else 0

    def push(self, tokens: list[int], start: int, end: int) -> int | None:
        """tokens[start:end] is the answer so far, tokens[end - 1] its new token. Returns the answer's length to keep
        (through the loop's first unit) once the tail is a loop of at least min_tokens tokens; else None."""
        n = end - start
        last = tokens[end - 1]
        for p in range(1, self.max_period + 1):  # every period's run first: LoopDrop reads on after a fire
            self.runs[p] = self.runs[p] + 1 if n > p and tokens[end - 1 - p] == last else 0
        for p in range(1, self.max_period + 1):
            if self.runs[p] + p >= self.min_tokens:  # tokens[end - runs - p : end] repeat one unit of p tokens
                self.period = p
                return n - self.runs[p]
        self.period = 0
        return None


class LoopDrop:
    """The spans of an answer that repeat a loop's first unit, found as the tokens come, so they can be left out."""

    def __init__(self, min_tokens: int):
        self.guard = LoopGuard(min_tokens)
        self.spans: list[tuple[int, int]] = []  # [first, end) answer indices left out, in order

    @classmethod
    def over(cls, answer: list[int], min_tokens: int) -> "LoopDrop":
        """The drop after every token of a whole answer was pushed."""
        drop = cls(min_tokens)
        for n in range(1, len(answer) + 1):
            drop.push(answer, 0, n)
        return drop

    def push(self, tokens: list[int], start: int, end: int) -> None:
        """As LoopGuard.push: tokens[start:end] is the answer so far; marks its new token left out if it goes on with
        a loop."""
        keep = self.guard.push(tokens, start, end)
        if keep is None:
            return
        n = end - start
        if self.spans and keep <= self.spans[-1][1]:  # the loop goes on, or a new one overlaps the last span
            self.spans[-1] = (min(self.spans[-1][0], keep), n)
        else:
            self.spans.append((keep, n))

    @property
    def left_out(self) -> int:
        """How many answer tokens the spans leave out."""
        return sum(end - first for first, end in self.spans)

    @property
    def looping(self) -> bool:
        """Whether the newest pushed token went on with a loop."""
        return self.guard.period > 0

    def next_in_loop(self, tokens: list[int], known: int, at: int) -> int:
        """The token that goes on with the current loop at index `at` of `tokens`, of which the first `known` are
        known (the engine samples a token or two ahead of the ones it has seen): the one a whole number of periods
        before it among the known tokens."""
        p = self.guard.period
        i = at - p
        while i >= known:
            i -= p
        return tokens[i]

    def kept(self, answer: list[int]) -> list[int]:
        """The answer's tokens outside the spans left out."""
        out, at = [], 0
        for first, end in self.spans:
            out += answer[at:first]
            at = end
        return out + answer[at:]


def drop_loops(tokens: list[int], min_tokens: int) -> list[int]:
    """The answer with every loop's repeats left out, as LoopDrop leaves them out token by token."""
    return LoopDrop.over(tokens, min_tokens).kept(tokens)


def tail_loop(tokens: list[int], n: int, min_tokens: int) -> int | None:
    """The reference's test of one prefix: the length to keep if tokens[:n] ends in a loop of at least min_tokens
    tokens (the first period that makes one), by brute force over periods and spans; else None."""
    for p in range(1, min_tokens // 3 + 1):
        span = p
        while span < n and tokens[n - 1 - span] == tokens[n - 1 - span + p]:
            span += 1
        if span >= min_tokens:
            return n - (span - p)
    return None


def find_loop(tokens: list[int], min_tokens: int) -> int | None:
    """The reference of the stop: the kept length at the first prefix of `tokens` that ends in a loop, or None."""
    for n in range(1, len(tokens) + 1):
        keep = tail_loop(tokens, n, min_tokens)
        if keep is not None:
            return keep
    return None


def drop_loops_reference(tokens: list[int], min_tokens: int) -> list[int]:
    """The reference of the drop: every prefix that ends in a loop leaves out tokens[keep:n]; the rest stays."""
    out = [True] * len(tokens)
    for n in range(1, len(tokens) + 1):
        keep = tail_loop(tokens, n, min_tokens)
        if keep is not None:
            out[keep:n] = [False] * (n - keep)
    return [t for t, k in zip(tokens, out) if k]
