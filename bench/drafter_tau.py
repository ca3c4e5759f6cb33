"""tau of a drafter on block images: greedy reads with speculation at each block size (and, with --check-plain,
plain reads of the same images, whose answers must be identical).

    python bench/drafter_tau.py --checkpoint models/ocria-tiny --drafter DRAFTER --pages PNG_DIR --out OUT.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.interface import DEFAULT_PROMPT, SamplingParams  # noqa: E402
from engine.llm_engine import Engine  # noqa: E402
from jobs.train_drafter import tau_row  # noqa: E402


@click.command()
@click.option("--checkpoint", required=True)
@click.option("--drafter", required=True)
@click.option("--pages", required=True, help="folder of PNG images (those whose name starts with --prefix)")
@click.option("--prefix", default="", help="only images whose file name starts with this")
@click.option("--block", "blocks", type=int, multiple=True, default=(16, 8), show_default=True)
@click.option("--max-tokens", type=int, default=160, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--check-plain", is_flag=True)
@click.option("--out", required=True, type=click.Path())
def main(checkpoint, drafter, pages, prefix, blocks, max_tokens, device, check_plain, out):
    from PIL import Image

    files = sorted(f for f in Path(pages).glob("*.png") if f.name.startswith(prefix))
    reqs = [dict(request_id=f.stem, prompt=DEFAULT_PROMPT, image=np.asarray(Image.open(f).convert("RGB")),
                 sampling=SamplingParams(max_tokens=max_tokens)) for f in files]
    opts = dict(device=device, dtype="float32", max_num_seqs=max(1, len(reqs)))
    plain = Engine.from_checkpoint(checkpoint, **opts).generate(reqs) if check_plain else None
    result = {"command": "python bench/drafter_tau.py " + " ".join(sys.argv[1:]), "pages": [f.name for f in files],
              "rows": []}
    for block in blocks:
        t = time.perf_counter()
        spec = Engine.from_checkpoint(checkpoint, drafter=drafter, spec_block_size=block, **opts).generate(reqs)
        row = dict(tau_row(plain, spec, block), seconds=round(time.perf_counter() - t, 1),
                   answer_tokens=sum(o.output_tokens for o in spec))
        result["rows"].append(row)
        click.echo(json.dumps(row))
        Path(out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
