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

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.train_drafter import TrainDrafterConfig, train  # noqa: E402


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

