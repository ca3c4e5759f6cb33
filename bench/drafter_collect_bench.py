"""Block images a second of the drafter's training collection (engine/drafter_training.collect: answers through the engine's
normal path, then the taps from packed teacher-forced prefills) against the eager collection it replaced (one eager
generate with a tap recorder in the drafter's slot, taps kept as the target computes them), on the same pages in one
run; the answers and taps of the two are compared.

    python bench/drafter_collect_bench.py --checkpoint models/ocria-tiny --pages DIR [--device cuda --dtype bfloat16]
        [--batch 256] [--max-tokens 256] [--max-pages N] [--out bench/results/X.json]

The eager collection lives on here as the baseline of that measurement and as the oracle of the collection's taps
(tests/test_train_drafter.py); the job has one collection.
"""
from __future__ import annotations

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
from engine.options import DecodeTuning  # noqa: E402
from engine.step_metadata import to_device  # noqa: E402
from pipeline.train_drafter import load_pages  # noqa: E402


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


def eager_collect(engine: Engine, images, layer_ids, prompt: str, max_tokens: int,
                  soft_top_k: int = 0) -> list[Example]:
    """The collection the job had: the target's greedy answers in one batched generate of an eager engine
    (enforce_eager: a CUDA graph replays its decode without calling the recorder), the taps of every token it
    computes meanwhile (prompt in prefill, answer in decode) kept by a TapRecorder, and with soft_top_k the
    distribution of each answer token from the logits the engine keeps as it decodes."""
    if engine.device.type == "cuda" and not engine.options.enforce_eager:
        raise ValueError("eager_collect needs an engine built with enforce_eager=True (CUDA graphs skip the recorder)")
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
@click.option("--out", type=click.Path(), help="JSON to write")
def main(checkpoint, pages, max_pages, device, dtype, batch, max_tokens, num_taps, tap_tokens, kv_cache_memory_gb,
         warmup, out):
    images = load_pages(pages)[:max_pages]
    common = dict(device=device, dtype=dtype, max_num_seqs=batch, kv_cache_memory_gb=kv_cache_memory_gb,
                  tuning=DecodeTuning(prefill_min_seqs=max(1, batch // 8)))  # as jobs/train_drafter builds its target
    eager = Engine.from_checkpoint(checkpoint, enforce_eager=True, **common)
    layers = build_target_layer_ids(eager.cfg.text.num_hidden_layers, num_taps)
    eager_collect(eager, images[:warmup], layers, DEFAULT_PROMPT, max_tokens)
    old, old_s = timed(lambda: eager_collect(eager, images, layers, DEFAULT_PROMPT, max_tokens), device)
    del eager
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    engine = Engine.from_checkpoint(checkpoint, **common)
    collect(engine, images[:warmup], layers, DEFAULT_PROMPT, max_tokens, tap_tokens=tap_tokens)
    timings = {}
    new, new_s = timed(lambda: collect(engine, images, layers, DEFAULT_PROMPT, max_tokens, timings=timings,
                                       tap_tokens=tap_tokens), device)
    same = [a.ids == b.ids for a, b in zip(old, new)]
    diffs = [float(((a.taps[lid].float() - b.taps[lid].float()).abs().max() /
                    a.taps[lid].float().abs().max()).cpu())
             for a, b, s in zip(old, new, same) if s for lid in layers]
    result = {
        "torch_threads": torch.get_num_threads(), "checkpoint": checkpoint, "dtype": dtype, "batch": batch,
        "max_tokens": max_tokens, "tap_layers": layers,
        "tap_tokens": tap_tokens or engine.runner.max_num_batched_tokens,
        "images": len(images), "answers": len(new), "answer_tokens": sum(len(e.ids) - e.prompt_len for e in new),
        "prompt_tokens": sum(e.prompt_len for e in new),
        "eager_s": round(old_s, 2), "collect_s": round(new_s, 2),
        "eager_images_per_s": round(len(images) / old_s, 3), "collect_images_per_s": round(len(images) / new_s, 3),
        "speedup": round(old_s / new_s, 2), "collect_timings": timings,
        "answers_identical": sum(same), "answers_compared": len(same),
        "taps_max_rel_diff": max(diffs) if diffs else None,
    }
    click.echo(json.dumps(result, indent=1))
    if out:
        harness.write_result(out, result, harness.result_meta(
            __file__, "drafter training collection: block images a second, the eager collection (one eager generate "
            "with a tap recorder) against engine/drafter_training.collect (answers through the normal path, taps "
            "from packed teacher-forced prefills), same pages, same run", device=device))


if __name__ == "__main__":
    main()
