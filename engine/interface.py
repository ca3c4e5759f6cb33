"""The contract between the pipeline and any parse backend (native engine or transformers baseline).

Plain dataclasses and numpy only, so the engine imports on machines without pydantic or Ray.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

DEFAULT_PROMPT = "Convert this page to markdown."


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 1024
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None  # per-request seed; None = derived from the request id
    num_beams: int = 1  # > 1: beam search (greedy only), as transformers' generate with early_stopping=True
    length_penalty: float = 1.0  # beam search: a finished beam's score is log p / length ** length_penalty
    loop_stop_tokens: int = 0  # > 0 (>= 3): end an answer whose tail repeats one unit over this many tokens, keeping
    #   one copy (finish_reason "loop", engine/loop_guard.py); greedy and sampling, not beam search
    loop_drop_tokens: int = 0  # > 0 (>= 3): leave out of the answer the repeats of any loop over this many tokens and
    #   read on (engine/loop_guard.LoopDrop); not with loop_stop_tokens or beam search
    num_speculative_tokens: int | None = None  # drafts per verify step at most (engine with a drafter): None = the
    #   engine's block size - 1, 0 = no speculation for this request
    loop_ban_next: bool = False  # with loop_drop_tokens: forbid the token that would go on with a loop the drop found,
    #   so the model leaves it


@dataclass
class PageRequest:
    request_id: str
    image: np.ndarray  # H x W x 3, uint8, RGB
    prompt: str = DEFAULT_PROMPT
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class SpecStats:
    """Speculative decoding's counts, one object from the engine's sequence to the Parquet row and the run's stats:
    verify steps, drafts proposed and accepted, and both by position in the block (index 0 = the first draft)."""
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_by_pos: list[int] = field(default_factory=list)
    accepted_by_pos: list[int] = field(default_factory=list)

    def add(self, valid: int, emitted: int) -> None:
        """One verify step of a block of `valid` tokens (valid - 1 drafts) that gave `emitted` tokens. In place: the
        engine calls it for every sequence of every speculative step."""
        self._widen(valid - 1)
        self.steps += 1
        self.drafted += valid - 1
        self.accepted += emitted - 1
        for j in range(valid - 1):
            self.drafted_by_pos[j] += 1
        for j in range(emitted - 1):
            self.accepted_by_pos[j] += 1

    def merge(self, other: SpecStats) -> SpecStats:
        """Adds other's counts to these (by position, place by place); returns self."""
        self._widen(len(other.drafted_by_pos), len(other.accepted_by_pos))
        self.steps += other.steps
        self.drafted += other.drafted
        self.accepted += other.accepted
        for total, part in ((self.drafted_by_pos, other.drafted_by_pos), (self.accepted_by_pos, other.accepted_by_pos)):
            for i, n in enumerate(part):
                total[i] += n
        return self

    def _widen(self, *widths: int) -> None:
        """Both by-position lists as long as the longest of them and `widths`."""
        width = max(len(self.drafted_by_pos), len(self.accepted_by_pos), *widths)
        for lst in (self.drafted_by_pos, self.accepted_by_pos):
            lst.extend([0] * (width - len(lst)))

    @classmethod
    def total(cls, stats) -> SpecStats:
        out = cls()
        for s in stats:
            out.merge(s)
        return out

    @property
    def tau(self) -> float:
        """Mean tokens per verify step (accepted drafts + the target's own token); 0 without speculation."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    def acceptance_by_position(self) -> list[float]:
        """The share of drafts accepted at each block position (0 where none was drafted)."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_pos, self.drafted_by_pos)]

    def columns(self) -> dict:
        """A page row's speculative-decoding columns (pipeline/schema.py); spec_tau null where nothing was verified."""
        return dict(spec_steps=self.steps, spec_drafted=self.drafted, spec_accepted=self.accepted,
                    spec_drafted_by_pos=list(self.drafted_by_pos), spec_accepted_by_pos=list(self.accepted_by_pos),
                    spec_tau=self.tau if self.steps else None)

    @classmethod
    def from_columns(cls, row: dict) -> SpecStats:
        """The counts of a page row (its columns null where the run had no drafter)."""
        return cls(row.get("spec_steps") or 0, row.get("spec_drafted") or 0, row.get("spec_accepted") or 0,
                   list(row.get("spec_drafted_by_pos") or ()), list(row.get("spec_accepted_by_pos") or ()))

    def summary(self) -> dict:
        """tau, verify steps, drafts proposed and accepted, and the share accepted by block position (1 = the first
        draft; positions never drafted left out)."""
        return {"verify_steps": self.steps, "drafted": self.drafted, "accepted": self.accepted, "tau": self.tau,
                "acceptance_by_position": {str(i + 1): a / d for i, (a, d) in
                                           enumerate(zip(self.accepted_by_pos, self.drafted_by_pos)) if d}}


@dataclass
class PageResult:
    request_id: str
    text: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str  # "stop" | "length" | "loop" | "error"
    error: str | None = None
    loop_dropped_tokens: int = 0  # generated tokens left out of `text` as a loop's repeats (SamplingParams)
    ttft_s: float = 0.0  # request submitted -> first output token
    decode_s: float = 0.0  # first token -> last token
    total_s: float = 0.0
    spec: SpecStats = field(default_factory=SpecStats)  # speculative decoding's counts (zeros without a drafter)


def seed_for_request(request_id: str) -> int:
    """The seed of a request that gives none: stable across processes and machines (unlike hash())."""
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "little") & (2**63 - 1)


class ParseBackend(Protocol):
    """What a pipeline parse actor holds: loaded once, fed batches of pages."""

    backend_id: str  # e.g. "native", "transformers"
    model_id: str  # checkpoint name + short hash of its config/weights
    busy_s: float  # seconds the backend has spent generating since it was loaded

    def parse(self, requests: list[PageRequest]) -> list[PageResult]:
        """Results in the order of `requests`. A request that fails alone gets finish_reason="error"."""
        ...

    def close(self) -> None: ...
