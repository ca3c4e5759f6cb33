"""A DFlash drafter's training run (jobs/train_drafter.py documents the recipe): its config, the pages the target
reads (image files, raster Parquet, or pages drawn in worker processes), and the loop that trains on the target's
answers and writes the drafter. The torch pieces it steps through are engine/drafter_training.py."""
from __future__ import annotations

import itertools
import json
import math
import random
import signal
import time
from pathlib import Path
from typing import Literal

import click
import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.drafter_training import (EVERY_ANCHOR, Example, accepted_drafts, block_loss, block_pass, collect_groups,
                                     collection_summary, greedy_drafts, measure_tau, walk_tau)
from engine.interface import DEFAULT_PROMPT
from engine.llm_engine import Engine
from engine.models.dflash import DFlashConfig, DFlashDrafter, build_target_layer_ids
from engine.options import DecodeTuning


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
    prefill_tokens: int | None = Field(None, ge=1, description="tokens one prefill step of the target may take while "
                                       "it answers (null: the engine's max_num_batched_tokens): the prefill runs "
                                       "eagerly, so fewer, larger steps launch fewer kernels a page")
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


def timed_render(render, n: int):
    """(render(n), the seconds it took): what a RenderedPages worker runs, so the reader learns what drawing costs."""
    t = time.perf_counter()
    images = render(n)
    return images, time.perf_counter() - t


class RenderedPages:
    """The images of pages first .. first + count - 1, each drawn by render(n) in one of `workers` processes (a
    picklable function: a module's, or a functools.partial of one), yielded page by page in page order whatever
    order they are drawn in. At most `ahead` pages are drawn or waiting beyond the one being read, a bounded queue
    that keeps the workers busy while the reader works and the memory flat whatever the count. A failed page raises
    its error here. Leaving the iteration early (break, close, an exception in the reader) cancels the pages not
    started and waits for the workers to end. Workers start from a fork server: forking this process, which may hold
    CUDA and many threads, is what that avoids.

    stats (of the latest iteration): the pages and images yielded, their MB, the seconds the workers spent drawing
    them (render_s, summed over the workers), and first_page_s: from the workers' start (start(), or the iteration's
    start) to the first page in hand."""

    def __init__(self, render, first: int, count: int, workers: int, ahead: int | None = None):
        self.render, self.first, self.count, self.workers = render, first, count, workers
        self.ahead = max(ahead or 2 * workers, workers)
        self.stats = self._new_stats()
        self._pool = None

    def _new_stats(self) -> dict:
        return {"workers": self.workers, "pages": 0, "images": 0, "mb": 0.0, "render_s": 0.0, "first_page_s": None}

    def start(self) -> RenderedPages:
        """Start the workers and queue the first `ahead` pages now (before the target loads, say: the workers' start
        and the first pages then cost the reader nothing); an iteration goes on from them. Iterating starts them
        too."""
        if self._pool is None:
            import multiprocessing
            from collections import deque
            from concurrent.futures import ProcessPoolExecutor

            self.stats = self._new_stats()
            self._t0 = time.perf_counter()
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("forkserver"))
            self._queued, self._next = deque(), self.first
            self._fill()
        return self

    def _fill(self) -> None:
        while self._next < self.first + self.count and len(self._queued) < self.ahead:
            self._queued.append((self._next, self._pool.submit(timed_render, self.render, self._next)))
            self._next += 1

    def __iter__(self):
        self.start()
        pool, queued, stats = self._pool, self._queued, self.stats
        try:
            while queued:
                self._fill()
                page, done = queued.popleft()
                try:
                    images, seconds = done.result()
                except Exception as e:
                    raise RuntimeError(f"drawing page {page} failed: {e!r}") from e
                if stats["first_page_s"] is None:
                    stats["first_page_s"] = round(time.perf_counter() - self._t0, 2)
                stats["pages"] += 1
                stats["images"] += len(images)
                stats["mb"] = round(stats["mb"] + sum(getattr(im, "nbytes", 0) for im in images) / 2**20, 2)
                stats["render_s"] = round(stats["render_s"] + seconds, 3)
                yield images
        finally:
            for _, f in queued:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


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


def drawn_pages(cfg: TrainDrafterConfig, count: int) -> RenderedPages:
    """Pages cfg.render_first .. + count - 1 drawn by cfg.render in worker processes, each as its list of images,
    drawn ahead of the reader by enough to keep a collection group waiting for none."""
    return RenderedPages(render_function(cfg.render, cfg.render_args), cfg.render_first, count, cfg.render_workers,
                         ahead=max(2 * cfg.render_workers, cfg.collect_group))


def page_source(cfg: TrainDrafterConfig):
    """(the pages' RGB uint8 images in order, their count or None where not known before they are drawn): read from
    cfg.pages, or drawn by cfg.render in worker processes as they are consumed (RenderedPages)."""
    if cfg.pages is not None:
        images = load_pages(cfg.pages)
        return iter(images), len(images)
    stream = drawn_pages(cfg, cfg.render_pages).start()  # drawing while the target loads

    def images():
        pages = iter(stream)
        try:
            for page in pages:
                yield from page
        finally:  # the workers end with the reader, not when the generator happens to be collected
            pages.close()
    return images(), None


def collection_target(checkpoint: str, device: str, dtype: str, batch: int,
                      kv_cache_memory_gb: float | None = None, prefill_tokens: int | None = None) -> Engine:
    """The target engine that answers the training pages (TrainDrafterConfig's checkpoint, device, dtype,
    collect_batch, kv_cache_memory_gb, prefill_tokens). Prompts start in groups of an eighth of the batch, not one
    by one as answers end: prefill steps run eagerly, each with a fixed host cost (most of them started only a few
    pages); prefill_tokens bounds a step's tokens."""
    options = {} if prefill_tokens is None else {"max_num_batched_tokens": prefill_tokens}
    return Engine.from_checkpoint(checkpoint, device=device, dtype=dtype, max_num_seqs=batch,
                                  kv_cache_memory_gb=kv_cache_memory_gb,
                                  tuning=DecodeTuning(prefill_min_seqs=max(1, batch // 8)), **options)


def config_target(cfg: TrainDrafterConfig) -> Engine:
    """collection_target as cfg sets it."""
    return collection_target(cfg.checkpoint, cfg.device, cfg.dtype, cfg.collect_batch, cfg.kv_cache_memory_gb,
                             cfg.prefill_tokens)


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


def train(cfg: TrainDrafterConfig, echo=print, collected: list[Example] | None = None,
          collected_pages: int | None = None) -> dict:
    """collected: the target's answers to cfg.pages already collected (collect()), e.g. to train several drafters
    on one collection; the target is then not run again (its soft labels must be there if cfg.distill > 0).
    collected_pages: the pages those answers are to (a drawn page gives several block images, a page may give no
    answer), for the log; default the pages of cfg.pages less the held-out ones."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    images, count = page_source(cfg)  # drawn pages start rendering now (RenderedPages.start), while the target loads
    try:
        heldout = list(itertools.islice(images, cfg.heldout))
        if count is not None and count <= cfg.heldout:
            raise click.UsageError(f"--pages {cfg.pages}: {count} pages, all held out (--heldout {cfg.heldout})")
        if count is not None and cfg.val_pages >= count - cfg.heldout:
            raise click.UsageError(f"--val-pages {cfg.val_pages}: {count - cfg.heldout} training pages, none would be "
                                   "left")
        t_load = time.perf_counter()
        target = config_target(cfg)
        target_load_s = round(time.perf_counter() - t_load, 1)  # weights, glue compile, graph capture
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
            examples = list(collected)
            train_pages = collected_pages if collected_pages is not None else \
                (count - cfg.heldout if count is not None else None)
        else:
            examples, train_pages = collect_groups(
                target, images, cfg.collect_group, layer_ids, cfg.prompt, cfg.max_tokens,
                soft_top_k=cfg.distill_top_k if cfg.distill > 0 else 0, tap_tokens=cfg.tap_tokens, timings=timings)
    finally:
        if hasattr(images, "close"):  # drawn pages: the renderers end here
            images.close()
    summary = collection_summary(timings, target_load_s) if timings else None
    echo(f"collected {len(examples)} answers to {'the given' if train_pages is None else train_pages} pages "
         f"({sum(len(e.ids) - e.prompt_len for e in examples)} tokens; prompts {sum(e.prompt_len for e in examples)} "
         "tokens) " + (f"in {time.perf_counter() - t0:.0f} s: {summary['line']}" if summary else "before this run"))
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
           "steps": len(losses), "train_seconds": round(time.perf_counter() - t_train, 1),
           "collect": {k: v for k, v in timings.items() if k != "groups"}, "collection": summary,
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

