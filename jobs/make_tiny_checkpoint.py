"""Build a tiny random-weight Qwen3.5 VL checkpoint in the real HF `qwen3_5` format.

    python jobs/make_tiny_checkpoint.py --out models/tiny-random --seed 0

The weights are random: generated text is not meaningful. It exists so that loaders, the native engine, the
transformers baseline and the pipeline can be tested end to end on CPU. Same seed (and Python/torch/transformers
versions) -> byte-identical files.
"""
from __future__ import annotations

import click

from engine.testing import build_tiny_checkpoint


@click.command()
@click.option("--out", required=True, type=click.Path(file_okay=False), help="checkpoint folder to (re)create")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--dtype", default="bfloat16", show_default=True, type=click.Choice(["bfloat16", "float32"]))
def main(out: str, seed: int, dtype: str) -> None:
    path = build_tiny_checkpoint(out, seed, dtype)
    for f in sorted(path.iterdir()):
        click.echo(f"{f.stat().st_size:>10}  {f}")


if __name__ == "__main__":
    main()
