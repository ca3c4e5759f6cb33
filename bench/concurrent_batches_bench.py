"""What `parse.concurrent_batches` buys: batches of pages whose outputs differ in length, parsed one call after
another (the engine drains to a batch of one before the next call's pages arrive) vs by two callers at once (the next
batch's pages join the engine while the last one's finish). Same pages, same per-page lengths (ignore_eos), same
engine; checks that every page gets the same tokens either way.

    python bench/concurrent_batches_bench.py --out bench/results/concurrent_batches_cpu.json            # CPU, ocria-tiny
    python3 bench/concurrent_batches_bench.py --device cuda --checkpoint CKPT --out $OUT/concurrent.json   # GPU
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from engine.interface import PageRequest, SamplingParams
from engine.native_backend import NativeBackend


def batches_of_pages(n_batches: int, batch: int, size: int, min_tokens: int, max_tokens: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [[PageRequest(f"b{b}p{i}", rng.integers(0, 256, (size, int(size * 0.77), 3), dtype=np.uint8),
                         sampling=SamplingParams(max_tokens=int(rng.integers(min_tokens, max_tokens + 1))))
             for i in range(batch)] for b in range(n_batches)]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


@click.command()
@click.option("--checkpoint", default=str(ROOT / "models" / "ocria-tiny"), show_default=True)
@click.option("--device", default="cpu", type=click.Choice(["cpu", "cuda"]))
@click.option("--batches", default=6, show_default=True)
@click.option("--batch-size", default=16, show_default=True, help="pages per call (= the engine's max_num_seqs)")
@click.option("--page-px", default=256, show_default=True, help="longest side of the page images")
@click.option("--min-tokens", default=8, show_default=True)
@click.option("--max-tokens", default=160, show_default=True)
@click.option("--out", default=None)
def main(checkpoint, device, batches, batch_size, page_px, min_tokens, max_tokens, out):
    backend = NativeBackend(checkpoint, device=device, dtype="auto", ignore_eos=True, max_num_seqs=batch_size)
    pages = batches_of_pages(batches, batch_size, page_px, min_tokens, max_tokens)
    backend.parse(pages[0])  # warm-up (compile, graphs)
    seq, t_seq = timed(lambda: [backend.parse(b) for b in pages])
    with ThreadPoolExecutor(2) as pool:
        conc, t_conc = timed(lambda: list(pool.map(backend.parse, pages)))
    _, t_seq2 = timed(lambda: [backend.parse(b) for b in pages])  # again: no warm-up left to one side's cost
    t_seq = min(t_seq, t_seq2)
    same = all(a.text == b.text and a.output_tokens == b.output_tokens
               for x, y in zip(seq, conc) for a, b in zip(x, y))
    n = batches * batch_size
    tokens = sum(r.output_tokens for b in seq for r in b)
    result = {
        "checkpoint": Path(checkpoint).name, "batches": batches, "batch_size": batch_size,
        "page_px": page_px, "output_tokens_per_page": [min_tokens, max_tokens], "pages": n, "output_tokens": tokens,
        "one_call_at_a_time": {"s": t_seq, "pages_per_s": n / t_seq, "tokens_per_s": tokens / t_seq},
        "two_calls_at_once": {"s": t_conc, "pages_per_s": n / t_conc, "tokens_per_s": tokens / t_conc},
        "speedup": t_seq / t_conc, "same_outputs": same,
    }
    print(f"{n} pages, {tokens} tokens ({device}): one call at a time {t_seq:.1f} s ({n / t_seq:.2f} pages/s), "
          f"two at once {t_conc:.1f} s ({n / t_conc:.2f} pages/s): x{t_seq / t_conc:.2f}; same outputs: {same}")
    backend.close()
    if out:
        harness.write_result(out, result, harness.result_meta(
            __file__, f"parse.concurrent_batches: {batches} batches of {batch_size} pages with {min_tokens}-"
            f"{max_tokens} output tokens each, parsed one call at a time vs two calls at once on one engine "
            f"({Path(checkpoint).name})", device=device), indent=2)
    if not same:
        sys.exit("outputs differ between the two ways")


if __name__ == "__main__":
    main()
