"""Train a DFlash drafter for a target checkpoint by self-distillation: the target reads the given page images
greedily, and the drafter learns to predict blocks of the target's own answers from its tapped hidden states.

    python jobs/train_drafter.py --checkpoint models/ocria-tiny --pages PAGES --out DRAFTER [--block-size 8]

PAGES: a folder of PNG/JPEG images, or a Parquet file of rendered pages (the raster rows the pipeline writes:
image (raw RGB bytes), image_height, image_width); or, with --render MODULE:FUNCTION --render-pages N, pages drawn in
--render-workers processes while the target reads the ones drawn before (e.g. research.ocria_tiny.drafter_pages:
block_images with --render-arg synth=DIR --render-arg split=train --render-arg checkpoint=CKPT). The target answers
the pages greedily through the engine's normal path, then its tapped hidden states over each page's prompt +
answer come from teacher-forced prefills of many pages each (collect). Recipe (DFlash; docs/speculative-decoding.md):
per step, pages' random anchors among their answer tokens; each anchor's block [anchor token, MASK x (B - 1)] sees
the context before the anchor and its own block; cross-entropy on positions 1 .. B-1 weighted exp(-(k - 1) / gamma),
on the target's greedy tokens or, with --distill, partly on its own distribution there (soft labels). The target's
embedding and LM head are frozen and shared; only the drafter's layers, fc and norms train (with --dflash2 also
DFlash2's convolutions and candidate selector, whose cross-entropy over the top-k candidates joins the loss). Writes
DRAFTER/ (config.json + model.safetensors, the public DFlash layout) and DRAFTER/train_log.json (losses; with
--heldout, tau measured on the held-out pages by the engine at each --measure-block). With --val-pages, answers kept
out of training give a validation loss (greedy labels) and an estimate of tau (greedy speculative decoding walked
through those answers: the drafts a verify accepts at every anchor, each step anchored where the last one ended);
the drafter written is the one where that estimate was highest: with few pages the drafter memorises its answers
long before the steps run out.
"""
from __future__ import annotations

import itertools
import json
import math
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import click
import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.interface import DEFAULT_PROMPT, SamplingParams  # noqa: E402
from engine.llm_engine import Engine  # noqa: E402
from engine.models.dflash import DFlashConfig, DFlashDrafter, build_target_layer_ids  # noqa: E402
from engine.options import DecodeTuning  # noqa: E402
from engine.taps import prefill_taps  # noqa: E402


class TrainDrafterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    checkpoint: str
    pages: str | None = Field(None, description="a folder of page images or a .parquet of raster rows (or render)")
    render: str | None = Field(None, description="pages drawn instead of read: 'module:function', function(n, "
                               "**render_args) -> the RGB uint8 images of page n (e.g. research.ocria_tiny."
                               "drafter_pages:block_images), for pages render_first .. render_first + render_pages - "
                               "1, in render_workers processes while the target reads the pages drawn before")
    render_args: dict[str, str] = Field(default_factory=dict, description="the render function's keyword arguments")
    render_pages: int = Field(0, ge=0)
    render_first: int = Field(0, ge=0)
    render_workers: int = Field(4, ge=1)
    out: str
    device: str = "cpu"
    dtype: str = Field("float32", description="the target's dtype while it answers (its taps are kept in it)")
    collect_batch: int = Field(16, ge=1, description="pages the target answers at once")
    collect_group: int = Field(1024, ge=1, description="pages collected at a time (answers, then taps); drawn pages "
                               "of the next group are rendered meanwhile")
    tap_tokens: int | None = Field(None, ge=1, description="tokens of the pages' prompts + answers packed into each "
                                   "teacher-forced prefill that computes the taps (null: the engine's "
                                   "max_num_batched_tokens)")
    kv_cache_memory_gb: float | None = Field(None, gt=0, description="the target's KV cache (CUDA; the taps of "
                                             "every page stay on the device beside it)")
    prompt: str = DEFAULT_PROMPT
    max_tokens: int = Field(256, ge=2, description="answer tokens the target generates per page")
    num_layers: int = Field(2, ge=1)
    intermediate_size: int | None = Field(None, ge=1, description="the draft layers' MLP width (null: the target's)")
    num_taps: int = Field(3, ge=1, description="target layers tapped (evenly spaced, DFlash's rule)")
    block_size: int = Field(8, ge=2)
    mask_token_id: int | None = Field(None, description="null = the target's pad token, else its last id")
    dflash2: bool = Field(False, description="DFlash2: the dynamic convolutions and the candidate selector")
    conv_kernel_size: int = Field(2, ge=2)
    conv_group_size: int = Field(16, ge=1)
    selector_rank: int = Field(64, ge=1)
    selector_top_k: int = Field(16, ge=2)
    selector_loss_alpha: float = Field(1.0, ge=0, description="weight of the selector's loss beside the base loss")
    distill: float = Field(0.0, ge=0, le=1, description="weight of the soft labels: cross-entropy against the "
                           "target's own distribution at each answer token (its top distill_top_k, renormalised), the "
                           "rest on the target's greedy token")
    distill_top_k: int = Field(16, ge=1, description="target probabilities kept per answer token for distill")
    anchors: int = Field(32, ge=1, description="blocks per page per step")
    pages_per_step: int = Field(1, ge=1, description="pages packed into one forward and optimizer step")
    gamma: float = Field(4.0, gt=0, description="loss decay over block positions (4 for B 8, 7 for B 16)")
    lr: float = Field(1e-3, gt=0)
    steps: int = Field(200, ge=1)
    max_seconds: float | None = Field(None, gt=0, description="stop training after this much wall time")
    heldout: int = Field(0, ge=0, description="pages kept out of training; tau is measured on them")
    val_pages: int = Field(0, ge=0, description="answers kept out of training whose loss and tau estimate are "
                           "measured every val_every steps (at every anchor); the drafter written is the one with "
                           "the highest tau estimate")
    val_every: int = Field(200, ge=1)
    measure_blocks: list[int] = Field(default_factory=lambda: [8], description="block sizes tau is measured at")
    save_dtype: Literal["bfloat16", "float32"] = Field("bfloat16", description="the written weights' dtype (the "
                                                       "engine casts them to the target's)")
    init: str | None = Field(None, description="a drafter folder to continue training from (its config is used; the "
                             "architecture flags are then ignored)")
    autocast: bool = Field(True, description="on CUDA, the drafter's forward in bf16 autocast (weights and optimizer "
                           "state stay fp32)")
    seed: int = 0

    @model_validator(mode="after")
    def _one_source(self):
        if (self.pages is None) == (self.render is None) or (self.render is not None and self.render_pages < 1):
            raise ValueError("give the pages either as files (pages) or drawn (render with render_pages >= 1)")
        return self


@dataclass
class Example:
    ids: list[int]  # prompt + answer
    prompt_len: int
    taps: dict[int, torch.Tensor]  # target layer -> [len(ids) - 1, H] (the last token is never fed)
    soft: tuple[torch.Tensor, torch.Tensor] | None = None  # per answer token: the target's top-k probs, ids [n, k]


def load_pages(path: str | Path) -> list[np.ndarray]:
    """RGB uint8 page images from a folder of images or a Parquet of raster rows."""
    from PIL import Image

    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
        if not files:
            raise click.UsageError(f"--pages {path}: no .png / .jpg images in the folder")
        return [np.asarray(Image.open(f).convert("RGB")) for f in files]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        t = pq.read_table(path, columns=["image", "image_height", "image_width"]).to_pylist()
        return [np.frombuffer(r["image"], np.uint8).reshape(r["image_height"], r["image_width"], 3) for r in t
                if r["image"]]
    raise click.UsageError(f"--pages {path}: give a folder of images or a .parquet of raster rows")


class RenderedPages:
    """The images of pages first .. first + count - 1, each drawn by render(n) in one of `workers` processes (a
    picklable function: a module's, or a functools.partial of one), yielded page by page in page order whatever
    order they are drawn in. At most `ahead` pages are drawn or waiting beyond the one being read, a bounded queue
    that keeps the workers busy while the reader works and the memory flat whatever the count. A failed page raises
    its error here. Leaving the iteration early (break, close, an exception in the reader) cancels the pages not
    started and waits for the workers to end. Workers start from a fork server: forking this process, which may hold
    CUDA and many threads, is what that avoids."""

    def __init__(self, render, first: int, count: int, workers: int, ahead: int | None = None):
        self.render, self.first, self.count, self.workers = render, first, count, workers
        self.ahead = max(ahead or 2 * workers, workers)

    def __iter__(self):
        import multiprocessing
        from collections import deque
        from concurrent.futures import ProcessPoolExecutor

        end = self.first + self.count
        with ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("forkserver")) as pool:
            queued, n = deque(), self.first
            try:
                while queued or n < end:
                    while n < end and len(queued) < self.ahead:
                        queued.append((n, pool.submit(self.render, n)))
                        n += 1
                    page, done = queued.popleft()
                    try:
                        images = done.result()
                    except Exception as e:
                        raise RuntimeError(f"drawing page {page} failed: {e!r}") from e
                    yield images
            finally:
                for _, f in queued:
                    f.cancel()
                pool.shutdown(wait=True, cancel_futures=True)


def render_function(spec: str, args: dict):
    """'module:function' with its keyword arguments bound (a picklable partial)."""
    import functools
    import importlib

    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise click.UsageError(f"--render {spec}: no function {name!r} in module {module!r} ({e})") from None
    return functools.partial(fn, **args)


def page_source(cfg: TrainDrafterConfig):
    """(the pages' RGB uint8 images in order, their count or None where not known before they are drawn): read from
    cfg.pages, or drawn by cfg.render in worker processes as they are consumed (RenderedPages)."""
    if cfg.pages is not None:
        images = load_pages(cfg.pages)
        return iter(images), len(images)
    stream = RenderedPages(render_function(cfg.render, cfg.render_args), cfg.render_first, cfg.render_pages,
                           cfg.render_workers, ahead=max(2 * cfg.render_workers, cfg.collect_group))

    def images():
        pages = iter(stream)
        try:
            for page in pages:
                yield from page
        finally:  # the workers end with the reader, not when the generator happens to be collected
            pages.close()
    return images(), None


def collect(engine: Engine, images: list[np.ndarray], layer_ids, prompt: str, max_tokens: int,
            soft_top_k: int = 0, timings: dict | None = None, tap_tokens: int | None = None) -> list[Example]:
    """The target's greedy answers to the pages, then the tapped hidden states over each page's prompt and answer.

    1. The answers: one batched Engine.generate, the engine's normal path (CUDA graphs for decode where it has
       them); nothing is recorded while it decodes. Each page is preprocessed once, to the uint8 patches the engine
       expands on its device, as the job does.
    2. The taps: teacher-forced prefills of the pages' prompt + answer (the last answer token is never fed), many
       pages packed into each step of `tap_tokens` tokens (engine/taps.prefill_taps; default the engine's
       max_num_batched_tokens), the forward cut after the last tapped layer. soft_top_k: also the target's
       distribution at each answer token from the same prefill, its top soft_top_k probabilities renormalised
       (Example.soft; the forward then runs every layer and the LM head on the answer rows).

    timings: receives the seconds spent preprocessing, answering and tapping, and the answering's prefill and decode
    steps with their host launch, device and waiting seconds."""
    t0 = time.perf_counter()
    inputs = [engine.processor.page_inputs(image, prompt, compact=True) for image in images]
    t1 = time.perf_counter()
    recording, log = engine.record_steps, engine.step_log  # the caller's, given back after
    engine.record_steps, engine.step_log = timings is not None, []
    try:
        answers = engine.generate([dict(request_id=f"page-{n}", prompt_token_ids=ids, pixel_values=pixels,
                                        image_grids=grids, sampling=SamplingParams(max_tokens=max_tokens))
                                   for n, (ids, pixels, grids) in enumerate(inputs)])
    finally:
        engine.record_steps, (steps_run, engine.step_log) = recording, (engine.step_log, log)
    t2 = time.perf_counter()
    kept = []
    for n, o in enumerate(answers):
        if o.finish_reason == "error":
            raise RuntimeError(f"page {n}: {o.error}")
        if len(o.output_token_ids) >= 2:  # the last answer token is never fed: one token leaves nothing to learn
            kept.append((o.prompt_token_ids + o.output_token_ids, len(o.prompt_token_ids), inputs[n]))
    taps = prefill_taps(engine, [dict(token_ids=ids[:-1], pixel_values=pixels, image_grids=grids,
                                      soft_from=prompt_len - 1) for ids, prompt_len, (_, pixels, grids) in kept],
                        layer_ids, token_budget=tap_tokens, soft_top_k=soft_top_k)
    if timings is not None:  # where collecting went: the answers' steps of each kind, their launch and device seconds
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)
        timings.update(preprocess_s=round(t1 - t0, 1), generate_s=round(t2 - t1, 1),
                       taps_s=round(time.perf_counter() - t2, 1))
        for kind, prefill in (("prefill", True), ("decode", False)):
            steps = [r for r in steps_run if r.is_prefill == prefill]
            timings.update({f"{kind}_steps": len(steps),
                            f"{kind}_launch_s": round(sum(r.t_launched - r.t_start for r in steps), 1),
                            f"{kind}_device_s": round(sum(r.device_s for r in steps), 1),
                            f"{kind}_wait_s": round(sum(r.wait_s for r in steps), 1)})
    return [Example(ids, prompt_len, t.taps, t.soft) for (ids, prompt_len, _), t in zip(kept, taps)]


def collect_groups(engine: Engine, images, group: int, layer_ids, prompt: str, max_tokens: int, soft_top_k: int = 0,
                   tap_tokens: int | None = None, timings: dict | None = None) -> tuple[list[Example], int]:
    """collect() over the `images` iterator, `group` pages at a time (a drawn source renders the next group's pages
    meanwhile) -> (the examples, the pages read). timings: collect's, summed over the groups, and pages_wait_s: the
    seconds spent waiting for pages (drawn ones not yet drawn; files are all read before)."""
    examples, pages, waited = [], 0, 0.0
    while True:
        t = time.perf_counter()
        part = list(itertools.islice(images, group))
        waited += time.perf_counter() - t
        if not part:
            break
        part_timings = {} if timings is not None else None
        examples += collect(engine, part, layer_ids, prompt, max_tokens, soft_top_k, part_timings, tap_tokens)
        pages += len(part)
        for k, v in (part_timings or {}).items():
            timings[k] = round(timings.get(k, 0) + v, 1)
    if timings is not None:
        timings["pages_wait_s"] = round(waited, 1)
    return examples, pages


def page_stream(n: int, rng: random.Random):
    """Page indices forever, each pass over the n pages in a fresh order."""
    while True:
        order = list(range(n))
        rng.shuffle(order)
        yield from order


def lr_factor(step: int, steps: int, elapsed: float, max_seconds: float | None) -> float:
    """Linear warm-up over the first 4 % of the run, then a cosine to zero; the run's progress is its steps or, when
    it is also bounded by time, its time, whichever is further along (so a run stopped by time still cools down)."""
    progress = step / steps
    if max_seconds:
        progress = max(progress, elapsed / max_seconds)
    progress = min(progress, 1.0)
    warm = min(1.0, (step + 1) / max(1, steps // 25))
    if max_seconds:
        warm = max(warm, min(1.0, progress * 25))
    return warm * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class BlockPass:
    """One packed forward over random anchor blocks: the drafter's logits at block positions 1 .. B-1 [N, B-1, V]
    and hidden states, the blocks, their target tokens and which positions exist (inside the answer), and the
    target's soft labels there (probs, ids [N, B-1, k]) when the examples carry them."""
    logits: torch.Tensor
    hidden: torch.Tensor
    block: torch.Tensor
    targets: torch.Tensor
    valid: torch.Tensor
    soft: tuple[torch.Tensor, torch.Tensor] | None


def block_pass(drafter: DFlashDrafter, examples: list[Example], embed: torch.Tensor, head: torch.Tensor, anchors: int,
               rng: random.Random | None, device) -> BlockPass:
    """Random anchor blocks of the examples' answers (every anchor, in order and without rng, when an answer has no
    more than `anchors`), the examples packed into one forward (each block sees only its own page)."""
    B = drafter.cfg.block_size
    picks, ids, taps, seqs, pos, block_seq = [], [], [], [], [], []
    for n, ex in enumerate(examples):
        L = len(ex.ids)
        # an anchor is a verified token whose next token is an answer token: prompt_len - 1 .. L - 2
        choices = list(range(ex.prompt_len - 1, L - 1))
        chosen = choices if anchors >= len(choices) else sorted(rng.sample(choices, anchors))
        picks.append(torch.tensor(chosen, device=device))
        block_seq.append(torch.full((len(chosen),), n, device=device))
        ids.append(torch.tensor(ex.ids, device=device))
        taps.append(ex.taps)
        seqs.append(torch.full((L - 1,), n, device=device))
        pos.append(torch.arange(L - 1, device=device))
    block_rows, targets, valid, soft_p, soft_i = [], [], [], [], []
    for ex, p, t in zip(examples, picks, ids):
        block = torch.full((len(p), B), drafter.cfg.mask_token_id, dtype=torch.long, device=device)
        block[:, 0] = t[p]
        target_pos = p[:, None] + torch.arange(1, B, device=device)[None, :]  # [N, B-1]
        valid.append(target_pos < len(t))
        targets.append(t[target_pos.clamp(max=len(t) - 1)])
        block_rows.append(block)
        if ex.soft is not None:  # answer token j is ids[prompt_len + j]
            row = (target_pos.clamp(max=len(t) - 1) - ex.prompt_len).cpu()
            soft_p.append(ex.soft[0][row].to(device))
            soft_i.append(ex.soft[1][row].to(device))
    block, targets, valid = torch.cat(block_rows), torch.cat(targets), torch.cat(valid)
    ctx = {lid: torch.cat([t[lid] for t in taps]).to(device) for lid in taps[0]}
    hidden = drafter.train_hidden(ctx, F.embedding(block, embed), torch.cat(picks), ctx_seq=torch.cat(seqs),
                                  ctx_pos=torch.cat(pos), block_seq=torch.cat(block_seq))
    logits = hidden[:, 1:].float() @ head.float().T
    soft = (torch.cat(soft_p), torch.cat(soft_i)) if len(soft_p) == len(examples) else None
    return BlockPass(logits, hidden[:, 1:], block, targets, valid, soft)


def block_loss(drafter: DFlashDrafter, examples: list[Example], embed: torch.Tensor, head: torch.Tensor, anchors: int,
               gamma: float, rng: random.Random, device, selector_alpha: float = 1.0, distill: float = 0.0,
               out: BlockPass | None = None) -> torch.Tensor:
    """Decayed per-position cross-entropy over random anchor blocks (block_pass, or `out` if given): on the target's
    greedy token, or with distill > 0 that share on the target's own distribution (the examples' soft labels).
    With a DFlash2 selector, plus selector_alpha times its cross-entropy over the top-k candidates given the true
    token before each (the true token replacing the last candidate where it is not among them), same weights."""
    bp = out or block_pass(drafter, examples, embed, head, anchors, rng, device)
    B, V = drafter.cfg.block_size, bp.logits.shape[-1]
    ce = F.cross_entropy(bp.logits.reshape(-1, V), bp.targets.reshape(-1), reduction="none").view_as(bp.targets)
    if distill > 0:
        if bp.soft is None:
            raise ValueError("distill > 0 needs examples collected with soft labels (collect(soft_top_k=...))")
        probs, top = bp.soft
        soft_ce = -(probs * bp.logits.log_softmax(-1).gather(-1, top)).sum(-1)
        ce = (1 - distill) * ce + distill * soft_ce
    w = torch.exp(-torch.arange(B - 1, device=ce.device, dtype=torch.float32) / gamma)[None, :] * bp.valid
    loss = (ce * w).sum() / w.sum()
    if drafter.selector is not None:
        sel = selector_ce(drafter, bp.logits, bp.hidden, bp.block[:, 0], bp.targets)
        loss = loss + selector_alpha * (sel * w).sum() / w.sum()
    return loss


def greedy_drafts(drafter: DFlashDrafter, bp: BlockPass) -> torch.Tensor:
    """The drafts [N, B-1] a greedy speculative step would propose from this pass: the argmax at each position, or
    with a DFlash2 selector each draft picked among its position's top-k given the draft before it (the anchor
    first), as the engine picks them (DFlashDrafter.select)."""
    if drafter.selector is None:
        return bp.logits.argmax(-1)
    return drafter.select(bp.logits, bp.hidden, bp.block[:, 0])


def accepted_drafts(bp: BlockPass, drafts: torch.Tensor | None = None) -> torch.Tensor:
    """Per block, the drafts a greedy verify would accept: the leading positions where the draft (`drafts`, from
    greedy_drafts; the argmax if not given) is the target's own token. The drafter sees here what it sees when
    drafting (the context before the anchor, the whole block in one pass); walk_tau turns them into tau."""
    drafts = bp.logits.argmax(-1) if drafts is None else drafts
    match = (drafts == bp.targets) & bp.valid
    return match.int().cumprod(-1).sum(-1).float()


EVERY_ANCHOR = 1 << 30  # block_pass's `anchors` for a block at every answer position, in order


def walk_tau(examples: list[Example], accepted: torch.Tensor) -> tuple[int, int]:
    """(tokens, verify steps) of greedy speculative decoding through the examples' answers, from `accepted` (the
    drafts a verify accepts at each block of a block_pass with EVERY_ANCHOR: per example, one block per anchor
    position prompt_len - 1 .. len - 2, in order). The prefill gives an answer's first token; each verify step then
    anchors at the last token emitted and emits its accepted drafts + 1, as the engine steps; tau = tokens / steps.
    The mean over uniformly drawn anchors is not tau: it counts every position of a long accepted run as an anchor,
    where the engine steps over the run once."""
    acc, tokens, steps, first = accepted.long().tolist(), 0, 0, 0
    for ex in examples:
        n = len(ex.ids) - ex.prompt_len  # this example's blocks
        i = 1  # anchored at the answer's first token (the prefill's)
        while i < n:
            emitted = min(acc[first + i] + 1, n - i)  # n - i answer tokens follow: the last one ends the answer
            tokens, steps, i = tokens + emitted, steps + 1, i + emitted
        first += n
    return tokens, steps


def selector_ce(drafter: DFlashDrafter, logits: torch.Tensor, hidden: torch.Tensor, anchors: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor:
    """The candidate selector's cross-entropy at each block position [N, P]: over the top-k of the position's
    unary logits, the true token put in the last place where it is not among them, each position scored given the
    true token before it (the anchor at the first)."""
    unary = drafter.unary_logits(logits)
    k = min(drafter.cfg.selector_top_k, unary.shape[-1])
    cand_u, cand = unary.topk(k, -1)
    gold = targets[..., None]
    covered = (cand == gold).any(-1, keepdim=True)
    cand = torch.where(covered, cand, torch.cat([cand[..., :-1], gold], -1))
    cand_u = torch.where(covered, cand_u, torch.cat([cand_u[..., :-1], unary.gather(-1, gold)], -1))
    label = (cand == gold).int().argmax(-1)
    before = torch.cat([anchors[:, None], targets[:, :-1]], 1)
    scores = drafter.selector.score(cand, cand_u, hidden, before)
    return F.cross_entropy(scores.reshape(-1, k), label.reshape(-1), reduction="none").view_as(targets)


def measure_tau(checkpoint: str, drafter_dir: Path, images, prompt: str, max_tokens: int, blocks: list[int],
                device: str, dtype: str) -> list[dict]:
    """Greedy reads of `images` with the drafter at each verify block size: tau and acceptance by block position,
    plus whether the answers equal plain decoding's (they must)."""
    reqs = [dict(request_id=f"h{i}", prompt=prompt, image=im, sampling=SamplingParams(max_tokens=max_tokens))
            for i, im in enumerate(images)]
    opts = dict(device=device, dtype=dtype, max_num_seqs=min(64, len(images)))
    plain = Engine.from_checkpoint(checkpoint, **opts).generate(reqs)
    return [tau_row(plain, Engine.from_checkpoint(checkpoint, drafter=str(drafter_dir), spec_block_size=block,
                                                   **opts).generate(reqs), block) for block in blocks]


def divergences(plain_engine, reqs, plain, spec) -> list[dict]:
    """Answers that differ: the first differing token and plain decoding's top-2 logit margin there, from the
    request read again alone with its logits kept. In bf16 a read alone need not equal the batched one (other
    reductions); `rerun_matches` says whether it did up to the differing token, i.e. whether the margin is the
    batched run's."""
    out = []
    for r, a, b in zip(reqs, plain, spec):
        if a.output_token_ids == b.output_token_ids:
            continue
        i = next((j for j, (x, y) in enumerate(zip(a.output_token_ids, b.output_token_ids)) if x != y),
                 min(len(a.output_token_ids), len(b.output_token_ids)))
        again = plain_engine.generate([dict(r, request_id="margin", keep_logits=True)])[0]
        top2 = again.logits[min(i, again.logits.shape[0] - 1)].float().topk(2).values
        out.append({"request": r["request_id"], "first_diff": i, "top2_margin": float(top2[0] - top2[1]),
                    "rerun_matches": again.output_token_ids[:i + 1] == a.output_token_ids[:i + 1]})
    return out


def tau_row(a, b, block: int) -> dict:
    """tau and acceptance by position of spec outputs b; a: plain outputs of the same requests (or None)."""
    steps = sum(o.spec_steps for o in b)
    acc = sum(o.spec_accepted for o in b)
    width = max(len(o.spec_drafted_by_pos) for o in b)
    by_pos = [sum(o.spec_accepted_by_pos[j] for o in b if j < len(o.spec_accepted_by_pos)) /
              max(1, sum(o.spec_drafted_by_pos[j] for o in b if j < len(o.spec_drafted_by_pos))) for j in range(width)]
    return {"block_size": block, "pages": len(b), "tau": (acc + steps) / steps if steps else 0.0,
            "verify_steps": steps, "drafted": sum(o.spec_drafted for o in b), "accepted": acc,
            "acceptance_by_position": [round(x, 4) for x in by_pos],
            "identical_to_plain": None if a is None else all(x.output_token_ids == y.output_token_ids
                                                             for x, y in zip(a, b)),
            "identical_pages": None if a is None else sum(x.output_token_ids == y.output_token_ids
                                                          for x, y in zip(a, b))}


def train(cfg: TrainDrafterConfig, echo=print, collected: list[Example] | None = None) -> dict:
    """collected: the target's answers to cfg.pages already collected (collect()), e.g. to train several drafters
    on one collection; the target is then not run again (its soft labels must be there if cfg.distill > 0)."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    images, count = page_source(cfg)  # drawn pages start rendering now, while the target loads
    try:
        heldout = list(itertools.islice(images, cfg.heldout))
        if count is not None and count <= cfg.heldout:
            raise click.UsageError(f"--pages {cfg.pages}: {count} pages, all held out (--heldout {cfg.heldout})")
        if count is not None and cfg.val_pages >= count - cfg.heldout:
            raise click.UsageError(f"--val-pages {cfg.val_pages}: {count - cfg.heldout} training pages, none would be "
                                   "left")
        # prompts start in groups of an eighth of the batch, not one by one as answers end: prefill steps run
        # eagerly, each with a fixed host cost (most of them started only a few pages)
        target = Engine.from_checkpoint(cfg.checkpoint, device=cfg.device, dtype=cfg.dtype,
                                        max_num_seqs=cfg.collect_batch, kv_cache_memory_gb=cfg.kv_cache_memory_gb,
                                        tuning=DecodeTuning(prefill_min_seqs=max(1, cfg.collect_batch // 8)))
        t = target.cfg.text
        layer_ids = build_target_layer_ids(t.num_hidden_layers, cfg.num_taps)
        mask = cfg.mask_token_id
        if mask is None:
            mask = target.processor.tokenizer.token_to_id("<|vision_pad|>") if target.processor is not None else None
            mask = t.vocab_size - 1 if mask is None else mask
        dcfg = DFlashConfig(hidden_size=t.hidden_size, intermediate_size=cfg.intermediate_size or t.intermediate_size,
                            num_hidden_layers=cfg.num_layers, num_attention_heads=t.num_attention_heads,
                            num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim,
                            rms_norm_eps=t.rms_norm_eps, rope_theta=10000.0, vocab_size=t.vocab_size,
                            target_layer_ids=tuple(layer_ids), mask_token_id=int(mask), block_size=cfg.block_size,
                            **(dict(conv_kernel_size=cfg.conv_kernel_size, conv_group_size=cfg.conv_group_size,
                                    selector_rank=cfg.selector_rank, selector_top_k=cfg.selector_top_k)
                               if cfg.dflash2 else {}))
        if cfg.init:
            drafter = DFlashDrafter.from_pretrained(cfg.init, t, torch.float32, cfg.device)
            dcfg, layer_ids = drafter.cfg, list(drafter.cfg.target_layer_ids)
        else:
            drafter = DFlashDrafter(dcfg, torch.float32, cfg.device)
            drafter.init_for_training(torch.Generator().manual_seed(cfg.seed))
        t0, timings = time.perf_counter(), {}
        if collected is not None:
            examples, train_pages = list(collected), (count - cfg.heldout if count is not None else None)
        else:
            examples, train_pages = collect_groups(
                target, images, cfg.collect_group, layer_ids, cfg.prompt, cfg.max_tokens,
                soft_top_k=cfg.distill_top_k if cfg.distill > 0 else 0, tap_tokens=cfg.tap_tokens, timings=timings)
    finally:
        if hasattr(images, "close"):  # drawn pages: the renderers end here
            images.close()
    echo(f"collected {len(examples)} answers to {train_pages} pages ({sum(len(e.ids) - e.prompt_len for e in examples)}"
         f" tokens; prompts {sum(e.prompt_len for e in examples)} tokens) in {time.perf_counter() - t0:.0f} s "
         f"{timings or ''}")
    if not examples:
        raise RuntimeError("the target answered no page with 2 or more tokens: nothing to train on")
    if cfg.val_pages >= len(examples):
        raise click.UsageError(f"--val-pages {cfg.val_pages}: only {len(examples)} answers, none left to train on")
    val, examples = examples[:cfg.val_pages], examples[cfg.val_pages:]
    embed = target.model.language_model.embed_tokens.weight.detach().to(cfg.device)
    head = target.model.head_weight.detach().to(cfg.device)
    params = [p for _, p in drafter.hf_named()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    use_autocast = cfg.autocast and torch.device(cfg.device).type == "cuda"
    stop = []  # a SIGTERM (e.g. from `timeout`) ends training early; what was learned is still written
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    losses, t_train, t_echo = [], time.perf_counter(), 0.0
    val_losses, val_tau, best = [], [], None  # (step, loss), (step, tau estimate); (key, step, weights) of the best

    def validate(step: int) -> None:
        """The greedy-label loss (whatever the training loss) at every anchor of the kept-out answers, and the tau
        estimate walked through them (walk_tau). The best drafter is the one with the highest tau estimate (the
        lowest loss among equals): past a point the loss rises, from confident misses, while the drafts accepted
        still grow."""
        nonlocal best
        total, tokens, steps = 0.0, 0, 0
        per = max(1, cfg.pages_per_step // 4)  # every anchor: up to max_tokens blocks an answer
        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=use_autocast):
            for i in range(0, len(val), per):
                part = val[i:i + per]
                bp = block_pass(drafter, part, embed, head, EVERY_ANCHOR, None, cfg.device)
                total += len(part) * float(block_loss(drafter, part, embed, head, EVERY_ANCHOR, cfg.gamma, None,
                                                      cfg.device, cfg.selector_loss_alpha, out=bp))
                t, n = walk_tau(part, accepted_drafts(bp, greedy_drafts(drafter, bp)))
                tokens, steps = tokens + t, steps + n
        val_losses.append((step, total / len(val)))
        val_tau.append((step, round(tokens / steps if steps else 1.0, 4)))
        key = (val_tau[-1][1], -val_losses[-1][1])
        if best is None or key > best[0]:
            best = (key, step, [p.detach().clone() for p in params])

    pages = page_stream(len(examples), rng)
    for step in range(cfg.steps):
        if val and step % cfg.val_every == 0:
            validate(step)
        elapsed = time.perf_counter() - t_train
        for group in opt.param_groups:
            group["lr"] = cfg.lr * lr_factor(step, cfg.steps, elapsed, cfg.max_seconds)
        opt.zero_grad()
        with torch.autocast("cuda", torch.bfloat16, enabled=use_autocast):
            loss = block_loss(drafter, [examples[next(pages)] for _ in range(cfg.pages_per_step)], embed, head,
                              cfg.anchors, cfg.gamma, rng, cfg.device, cfg.selector_loss_alpha, cfg.distill)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if elapsed - t_echo >= 10 or step == 0 or step == cfg.steps - 1:
            t_echo = elapsed
            echo(f"step {step}: loss {losses[-1]:.4f} ({elapsed:.0f} s)")
        if cfg.max_seconds and elapsed > cfg.max_seconds:
            echo(f"stopping at step {step}: --max-seconds {cfg.max_seconds} reached")
            break
        if stop:
            echo(f"stopping at step {step}: terminated")
            break
    signal.signal(signal.SIGTERM, previous)
    if val:
        validate(len(losses))
        with torch.no_grad():
            for p, w in zip(params, best[2]):
                p.copy_(w)
        echo(f"validation tau estimate {best[0][0]:.3f} (loss {-best[0][1]:.4f}) at step {best[1]} (the drafter "
             f"written); last {val_tau[-1][1]:.3f} (loss {val_losses[-1][1]:.4f}) at step {val_tau[-1][0]}")
    out = Path(cfg.out)
    drafter.save_pretrained(out, num_target_layers=t.num_hidden_layers, dtype=getattr(torch, cfg.save_dtype))
    log = {"config": cfg.model_dump(), "drafter": dcfg.to_json(), "train_pages": train_pages,
           "answers": len(examples), "answer_tokens": sum(len(e.ids) - e.prompt_len for e in examples),
           "steps": len(losses), "train_seconds": round(time.perf_counter() - t_train, 1), "collect": timings,
           "losses": losses}
    if val:
        log.update(val_answers=len(val), val_losses=val_losses, val_tau_estimate=val_tau, best_step=best[1])
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    if heldout and not stop:
        log["heldout_tau"] = measure_tau(cfg.checkpoint, out, heldout, cfg.prompt, cfg.max_tokens,
                                         cfg.measure_blocks, cfg.device, cfg.dtype)
        for r in log["heldout_tau"]:
            echo(f"held-out pages, block {r['block_size']}: tau {r['tau']:.2f} ({r['accepted']}/{r['drafted']} "
                 f"drafts accepted; answers identical to plain decoding: {r['identical_to_plain']})")
        (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


@click.command(context_settings={"show_default": True})
@click.option("--config", "config_path", type=click.Path(exists=True), help="YAML with TrainDrafterConfig fields")
@click.option("--checkpoint", help="target checkpoint folder")
@click.option("--pages", help="folder of page images or .parquet of raster rows")
@click.option("--render", help="or pages drawn by module:function (function(n, **render args) -> page n's images)")
@click.option("--render-arg", "render_args", multiple=True, help="KEY=VALUE: a keyword argument of the function")
@click.option("--render-pages", type=int, help="pages drawn")
@click.option("--render-first", type=int, help="the first drawn page's number")
@click.option("--render-workers", type=int, help="processes drawing pages")
@click.option("--out", help="drafter folder to write")
@click.option("--device")
@click.option("--dtype")
@click.option("--collect-batch", type=int)
@click.option("--collect-group", type=int)
@click.option("--tap-tokens", type=int)
@click.option("--kv-cache-memory-gb", type=float)
@click.option("--max-tokens", type=int)
@click.option("--num-layers", type=int)
@click.option("--intermediate-size", type=int)
@click.option("--num-taps", type=int)
@click.option("--block-size", type=int)
@click.option("--dflash2/--no-dflash2", default=None)
@click.option("--selector-rank", type=int)
@click.option("--selector-top-k", type=int)
@click.option("--selector-loss-alpha", type=float)
@click.option("--distill", type=float)
@click.option("--distill-top-k", type=int)
@click.option("--anchors", type=int)
@click.option("--pages-per-step", type=int)
@click.option("--gamma", type=float)
@click.option("--lr", type=float)
@click.option("--steps", type=int)
@click.option("--max-seconds", type=float)
@click.option("--heldout", type=int)
@click.option("--val-pages", type=int)
@click.option("--val-every", type=int)
@click.option("--measure-block", "measure_blocks", type=int, multiple=True)
@click.option("--save-dtype", type=click.Choice(["bfloat16", "float32"]))
@click.option("--init", help="drafter folder to continue training from")
@click.option("--autocast/--no-autocast", default=None)
@click.option("--seed", type=int)
def main(config_path, **flags):
    import yaml
    from pydantic import ValidationError

    data = yaml.safe_load(Path(config_path).read_text()) if config_path else {}
    args = flags.pop("render_args")
    if any("=" not in a for a in args):
        raise click.UsageError(f"--render-arg {args}: give KEY=VALUE")
    if args:
        data["render_args"] = {**data.get("render_args", {}), **dict(a.split("=", 1) for a in args)}
    data.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in flags.items() if v not in (None, ())})
    try:
        cfg = TrainDrafterConfig(**data)
    except ValidationError as e:
        raise click.UsageError(str(e)) from None
    train(cfg, echo=click.echo)


if __name__ == "__main__":
    main()
