"""Block images a second of the drafter's training collection (engine/drafter_training.collect: answers through the engine's
normal path, then the taps from packed teacher-forced prefills) against the eager collection it replaced (one eager
generate with a tap recorder in the drafter's slot, taps kept as the target computes them), on the same pages in one
run; the answers and taps of the two are compared.

    python bench/drafter_collect_bench.py --checkpoint models/ocria-tiny --pages DIR [--device cuda --dtype bfloat16]
        [--batch 256] [--max-tokens 256] [--max-pages N] [--seconds S] [--out bench/results/X.json]

One engine serves both (the eager collection runs with its decode graphs set aside, as enforce_eager builds it):
its load, the warm-ups, then the collection, then the eager one in batches of --batch images, each phase's seconds
echoed and written as it ends. --seconds bounds the run itself: no eager batch starts after it (the speedup is then
the rates' ratio over the images each read); the load and the collection are not cut, so give a timeout around it
room for them (bench/drafter_h200.sh: COLLECT_BENCH_TIMEOUT, the bound 20 s less).

The eager collection lives on here as the baseline of that measurement and as the oracle of the collection's taps
(tests/test_train_drafter.py); the job has one collection.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from engine.drafter_training import Example, collect  # noqa: E402
from engine.interface import DEFAULT_PROMPT, SamplingParams  # noqa: E402
from engine.llm_engine import Engine  # noqa: E402
from engine.models.dflash import build_target_layer_ids  # noqa: E402
from engine.step_metadata import to_device  # noqa: E402
from pipeline.train_drafter import collection_target, load_pages  # noqa: E402


class TapRecorder:
    """Stands in the model runner's drafter slot while the target computes: keeps the tapped hidden states of every
    token it computes (engine/model_runner calls new_taps / write_context on every forward, prefill and eager
    decode alike), in their dtype and where they were computed, by sequence and token index. A row's sequence is the
    owner of its KV slot's block among the engine's running sequences (blocks are never shared between them); a
    token computed again (after a preemption) replaces its first taps. `capacity`: request id -> the most tokens it
    can have (prompt + max_tokens); all requests share one buffer, each at its offset, so a step's rows are stored
    with one scatter whatever the batch."""

    def __init__(self, layer_ids, engine: Engine, capacity: dict[str, int]):
        self.layer_ids = list(layer_ids)
        self.engine = engine
        self.offset, total = {}, 0
        for rid, n in capacity.items():
            self.offset[rid], total = total, total + n
        self.total = total
        self.rows: torch.Tensor | None = None  # [total, taps, H]
        self.seen: torch.Tensor | None = None  # [total] bool

    def new_taps(self) -> dict:
        return dict.fromkeys(self.layer_ids)

    def write_context(self, taps, slot_mapping, index) -> None:
        """Without waiting for the device: the block owners go up through pinned memory, and rows of no running
        sequence (padding) land in a spare last row instead of being masked out (a boolean mask would sync)."""
        stacked = torch.stack([taps[lid] for lid in self.layer_ids], dim=1).detach()  # [N, taps, H]
        dev = stacked.device
        if self.rows is None:
            self.rows = stacked.new_zeros((self.total + 1, *stacked.shape[1:]))
            self.seen = torch.zeros(self.total + 1, dtype=torch.bool, device=dev)
        blocks, bases = [], []
        for seq in self.engine.scheduler.running:
            blocks += seq.block_table
            bases += [self.offset[seq.request_id]] * len(seq.block_table)
        base = torch.full((self.engine.block_manager.num_blocks,), -1, dtype=torch.long, device=dev)
        base[to_device(blocks, torch.long, dev)] = to_device(bases, torch.long, dev)
        slot = slot_mapping.long()
        owner = base[slot.clamp(min=0) // self.engine.block_manager.block_size]
        dest = torch.where((slot >= 0) & (owner >= 0), owner + index, self.total)
        self.rows.index_copy_(0, dest, stacked.to(self.rows.dtype))
        self.seen[dest] = True

    def stacked(self, request_id: str, n: int) -> dict[int, torch.Tensor]:
        """Taps of the request's tokens 0 .. n - 1, in order: {layer id: [n, H]}."""
        off = self.offset[request_id]
        seen = self.seen[off:off + n]
        if not bool(seen.all()):
            raise RuntimeError(f"{request_id}: the target computed taps for {int(seen.sum())} of tokens "
                               f"0 .. {n - 1}")
        return {lid: self.rows[off:off + n, j] for j, lid in enumerate(self.layer_ids)}


@contextlib.contextmanager
def graphs_off(engine: Engine):
    """The engine as enforce_eager builds it, for a while: its decode CUDA graphs (and the batch sizes decode pads
    to for them) set aside, so decode steps run eagerly through the model and its drafter slot; enforce_eager
    differs in nothing else (engine/llm_engine.py: cuda_graphs=not enforce_eager). One engine then serves both
    collections: one load and graph capture, not two."""
    runner = engine.runner
    kept = runner.graphs, runner.graph_logits, runner.decode_sizes
    runner.graphs, runner.graph_logits, runner.decode_sizes = {}, {}, []
    try:
        yield engine
    finally:
        runner.graphs, runner.graph_logits, runner.decode_sizes = kept


def eager_collect(engine: Engine, images, layer_ids, prompt: str, max_tokens: int,
                  soft_top_k: int = 0) -> list[Example]:
    """The collection the job had: the target's greedy answers in one batched generate of an eager engine
    (enforce_eager, or graphs_off: a CUDA graph replays its decode without calling the recorder), the taps of every
    token it computes meanwhile (prompt in prefill, answer in decode) kept by a TapRecorder, and with soft_top_k the
    distribution of each answer token from the logits the engine keeps as it decodes."""
    if engine.runner.graphs:
        raise ValueError("eager_collect needs an engine without decode graphs (enforce_eager=True, or inside "
                         "graphs_off(engine)): a CUDA graph replays its decode without calling the recorder")
    inputs = [engine.processor.page_inputs(image, prompt, compact=True) for image in images]
    rec = TapRecorder(layer_ids, engine, {f"page-{n}": len(ids) + max_tokens for n, (ids, _, _) in enumerate(inputs)})
    soft = {}

    def reduce_logits(o):  # as each answer ends: its [n, V] rows are not kept while the others run
        if soft_top_k and o.logits is not None:
            probs, top = o.logits.float().softmax(-1).topk(min(soft_top_k, o.logits.shape[-1]), -1)
            soft[o.request_id] = (probs / probs.sum(-1, keepdim=True), top)
            o.logits = None

    engine.runner.drafter = rec
    try:
        answers = engine.generate([dict(request_id=f"page-{n}", prompt_token_ids=ids, pixel_values=pixels,
                                        image_grids=grids, sampling=SamplingParams(max_tokens=max_tokens),
                                        keep_logits=soft_top_k > 0)
                                   for n, (ids, pixels, grids) in enumerate(inputs)], on_finish=reduce_logits)
    finally:
        engine.runner.drafter = None
    out = []
    for n, o in enumerate(answers):
        if o.finish_reason == "error":
            raise RuntimeError(f"page {n}: {o.error}")
        ids = o.prompt_token_ids + o.output_token_ids
        if len(o.output_token_ids) < 2:  # the last answer token is never fed to the target
            continue
        out.append(Example(ids, len(o.prompt_token_ids), rec.stacked(o.request_id, len(ids) - 1),
                           soft.get(o.request_id)))
    return out


def timed(fn, device) -> tuple[object, float]:
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t


def ms_per_image(timings: dict, images: int) -> dict:
    """collect()'s timings as ms an image, by part (what the rest leave is other)."""
    parts = {k[:-2]: timings.get(k, 0.0) for k in ("preprocess_s", "generate_s", "taps_s", "host_s")}
    return {k: round(1e3 * v / images, 2) for k, v in parts.items()}


@click.command(context_settings={"show_default": True})
@click.option("--checkpoint", required=True)
@click.option("--pages", required=True, help="folder of block images or .parquet of raster rows")
@click.option("--max-pages", type=int, help="the first N images only")
@click.option("--device", default="cpu")
@click.option("--dtype", default="float32")
@click.option("--batch", type=int, default=16, help="pages answered at once (jobs/train_drafter --collect-batch)")
@click.option("--max-tokens", type=int, default=256)
@click.option("--num-taps", type=int, default=4)
@click.option("--tap-tokens", type=int, help="tokens a teacher-forced taps step (default the engine's budget)")
@click.option("--kv-cache-memory-gb", type=float)
@click.option("--warmup", type=int, default=2, help="images each collection reads first, untimed")
@click.option("--eager-max-images", type=int, help="the eager collection reads at most these (the first ones)")
@click.option("--seconds", type=float, help="the bench's own bound, from its start: the eager collection (run last, "
              "in batches of --batch images) starts no batch after it, and its rate is then over the images read")
@click.option("--out", type=click.Path(), help="JSON to write (rewritten after each phase: a run stopped midway "
              "keeps what it measured, complete false)")
def main(checkpoint, pages, max_pages, device, dtype, batch, max_tokens, num_taps, tap_tokens, kv_cache_memory_gb,
         warmup, eager_max_images, seconds, out):
    """One engine (graphs captured, as the job builds its target) runs the collection, then, its decode graphs set
    aside (graphs_off: what enforce_eager builds), the eager collection on the same images or the first of them.
    Each phase's seconds are echoed and written as it ends: the load (weights, glue compile, graph capture), the
    warm-ups (first prefills: kernel compiles and autotuning), each timed collection."""
    t_start = time.perf_counter()
    images = load_pages(pages)[:max_pages]
    result = {
        "complete": False, "torch_threads": torch.get_num_threads(), "checkpoint": checkpoint, "dtype": dtype,
        "batch": batch, "max_tokens": max_tokens, "images": len(images), "seconds_bound": seconds, "phases_s": {},
    }
    results = harness.ResultFile(out, harness.result_meta(
        __file__, "drafter training collection: block images a second, the eager collection (one eager generate "
        "with a tap recorder) against engine/drafter_training.collect (answers through the normal path, taps "
        "from packed teacher-forced prefills), same pages, same run, same engine", device=device)) if out else None

    def phase(name: str, t0: float, line: str = "") -> None:
        result["phases_s"][name] = round(time.perf_counter() - t0, 2)
        click.echo(f"[{time.perf_counter() - t_start:6.1f} s] {name}: {result['phases_s'][name]} s{line}")
        if results is not None:
            results.write(result)

    t = time.perf_counter()
    engine = collection_target(checkpoint, device, dtype, batch, kv_cache_memory_gb)  # as the job builds it
    layers = build_target_layer_ids(engine.cfg.text.num_hidden_layers, num_taps)
    result.update(tap_layers=layers, tap_tokens=tap_tokens or engine.runner.max_num_batched_tokens,
                  decode_graphs=len(engine.runner.graphs))
    phase("load", t, f" (weights, glue compile, {len(engine.runner.graphs)} decode graphs captured)")
    t = time.perf_counter()
    if warmup:
        collect(engine, images[:warmup], layers, DEFAULT_PROMPT, max_tokens, tap_tokens=tap_tokens)
        with graphs_off(engine):
            eager_collect(engine, images[:warmup], layers, DEFAULT_PROMPT, max_tokens)
    phase("warmup", t, f" ({warmup} images each way)")
    timings = {}
    new, new_s = timed(lambda: collect(engine, images, layers, DEFAULT_PROMPT, max_tokens, timings=timings,
                                       tap_tokens=tap_tokens), device)
    result.update(
        answers=len(new), answer_tokens=sum(len(e.ids) - e.prompt_len for e in new),
        prompt_tokens=sum(e.prompt_len for e in new), collect_s=round(new_s, 2),
        collect_images_per_s=round(len(images) / new_s, 3), collect_timings=timings,
        collect_ms_per_image=ms_per_image(timings, len(images)))
    phase("collect", time.perf_counter() - new_s, f": {len(images)} images, {result['collect_images_per_s']} images/s, "
          f"ms an image {result['collect_ms_per_image']}")
    most = len(images) if eager_max_images is None else min(eager_max_images, len(images))
    old, old_s, read = [], 0.0, 0
    with graphs_off(engine):
        while read < most:
            if seconds is not None and time.perf_counter() - t_start > seconds:
                click.echo(f"eager collection stopped after {read} images: --seconds {seconds} reached")
                break
            chunk = images[read:min(most, read + batch)]
            part, part_s = timed(lambda: eager_collect(engine, chunk, layers, DEFAULT_PROMPT, max_tokens), device)
            old, old_s, read = old + part, old_s + part_s, read + len(chunk)
            result.update(eager_images=read, eager_s=round(old_s, 2), eager_images_per_s=round(read / old_s, 3))
            phase(f"eager {read}", time.perf_counter() - part_s, f": {read} images, {result['eager_images_per_s']} "
                  "images/s")
    if read:
        # the same images: the seconds' ratio; the first of them only: the rates' (the eager batches were full)
        result["speedup"] = round(old_s / new_s if read == len(images) else
                                  result["collect_images_per_s"] / result["eager_images_per_s"], 2)
        result["speedup_basis"] = "same images" if read == len(images) else f"rates (eager on the first {read})"
    same = [a.ids == b.ids for a, b in zip(old, new)]
    diffs = [float(((a.taps[lid].float() - b.taps[lid].float()).abs().max() /
                    a.taps[lid].float().abs().max()).cpu())
             for a, b, s in zip(old, new, same) if s for lid in layers]
    result.update(answers_identical=sum(same), answers_compared=len(same),
                  taps_max_rel_diff=max(diffs) if diffs else None, complete=True,
                  bench_s=round(time.perf_counter() - t_start, 1))
    click.echo(json.dumps(result, indent=1))
    if results is not None:
        results.write(result)


if __name__ == "__main__":
    main()
