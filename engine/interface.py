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
    spec_steps: int = 0  # speculative decoding: verify steps, drafts proposed and accepted (RequestOutput)
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_drafted_by_pos: tuple[int, ...] = ()  # ... the same by position in the block (1 = the first draft)
    spec_accepted_by_pos: tuple[int, ...] = ()


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
