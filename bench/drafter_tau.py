"""tau of a drafter on block images: greedy reads with speculation at each block size (and, with --check-plain,
plain reads of the same images, whose answers must be identical).

    python bench/drafter_tau.py --checkpoint models/ocria-tiny --drafter DRAFTER --pages PNG_DIR [--pages ...] --out OUT.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from engine.interface import DEFAULT_PROMPT, SamplingParams  # noqa: E402
from engine.llm_engine import Engine  # noqa: E402
from engine.drafter_training import divergences, tau_row  # noqa: E402


def load_page_sets(folders, prefix: str, max_tokens: int) -> dict[str, list[dict]]:
    """Each folder's PNG images (those whose name starts with `prefix`) as greedy read requests, by folder name."""
    from PIL import Image

    sets = {}
    for folder in folders:
        files = sorted(f for f in Path(folder).glob("*.png") if f.name.startswith(prefix))
        sets[Path(folder).name] = [dict(request_id=f.stem, prompt=DEFAULT_PROMPT,
                                        image=np.asarray(Image.open(f).convert("RGB")),
                                        sampling=SamplingParams(max_tokens=max_tokens)) for f in files]
    return sets


def engine_options(sets: dict[str, list[dict]], device: str, dtype: str) -> dict:
    return dict(device=device, dtype=dtype, max_num_seqs=min(128, max(1, *map(len, sets.values()))))


def plain_reads(checkpoint: str, sets: dict[str, list[dict]], device: str, dtype: str):
    """(the plain engine, its answers by set): what speculative reads are checked against."""
    engine = Engine.from_checkpoint(checkpoint, **engine_options(sets, device, dtype))
    return engine, {name: engine.generate(reqs) for name, reqs in sets.items()}


def tau_rows(checkpoint: str, drafter: str, sets: dict[str, list[dict]], blocks, device: str, dtype: str,
             plain=None, plain_engine=None):
    """Rows of tau_row, one per (block, set), as each is measured: the drafter reads every set greedily with
    block - 1 speculative tokens. plain: plain_reads' answers, which the speculative ones must equal; with
    plain_engine also the divergences where they do not."""
    opts = engine_options(sets, device, dtype)
    for block in blocks:
        engine = Engine.from_checkpoint(checkpoint, speculative=dict(
            drafter=drafter, num_speculative_tokens=block - 1, max_batch=None), **opts)
        for name, reqs in sets.items():
            t = time.perf_counter()
            spec = engine.generate(reqs)
            ref = plain[name] if plain is not None else None
            row = dict(tau_row(ref, spec, block), page_set=name, seconds=round(time.perf_counter() - t, 1),
                       answer_tokens=sum(o.output_tokens for o in spec))
            if plain_engine is not None:  # answers that differ: where, and how close plain decoding's top two were
                row["divergences"] = divergences(plain_engine, reqs, ref, spec)
            yield row


@click.command()
@click.option("--checkpoint", required=True)
@click.option("--drafter", required=True)
@click.option("--pages", "page_sets", required=True, multiple=True,
              help="folder of PNG images (those whose name starts with --prefix); repeat for several sets")
@click.option("--prefix", default="", help="only images whose file name starts with this")
@click.option("--block", "blocks", type=int, multiple=True, default=(16, 8), show_default=True)
@click.option("--max-tokens", type=int, default=160, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--check-plain", is_flag=True)
@click.option("--out", required=True, type=click.Path())
def main(checkpoint, drafter, page_sets, prefix, blocks, max_tokens, device, dtype, check_plain, out):
    sets = load_page_sets(page_sets, prefix, max_tokens)
    plain_engine, plain = plain_reads(checkpoint, sets, device, dtype) if check_plain else (None, None)
    results = harness.ResultFile(out, harness.result_meta(
        __file__, f"tau of the drafter {Path(drafter).name} on {Path(checkpoint).name}'s greedy reads of block "
        f"images at block {', '.join(map(str, blocks))} ({dtype})"
        + (", answers checked against plain decoding" if check_plain else ""), device=device))
    result = {"pages": {name: [r["request_id"] for r in reqs] for name, reqs in sets.items()}, "rows": []}
    for row in tau_rows(checkpoint, drafter, sets, blocks, device, dtype, plain, plain_engine):
        result["rows"].append(row)
        click.echo(json.dumps(row))
        results.write(result)


if __name__ == "__main__":
    main()
