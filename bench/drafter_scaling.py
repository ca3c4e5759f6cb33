"""tau against data: the target answers the pages once (as many as the largest size), then for each size N, smallest
first, a drafter trained on the answers to the first N pages only (the same config, seed and time or step budget
every size), and its tau at each --blocks on the held-out synthetic and corpus block images (bench/drafter_tau.py's
reads, checked against plain decoding). Rows go to --out as each is measured; a PNG of tau against pages beside it.

    python bench/drafter_scaling.py --checkpoint models/ocria-tiny --sizes 3600,12000,25000,50000 \\
        --render research.ocria_tiny.drafter_pages:block_images --render-arg synth=.drafter/synth \\
        --render-arg split=train --render-arg checkpoint=models/ocria-tiny --render-workers 12 \\
        --tau-pages .drafter/heldout --tau-pages .drafter/corpus --train-seconds 60 \\
        --device cuda --dtype bfloat16 --set collect_batch=256 --set kv_cache_memory_gb=8 --set num_layers=4 ... \\
        [--collect-bench OUT/collect_bench.json] --out OUT/drafter_scaling.json

A page is what the source gives one at a time: a synthetic page drawn by --render (cut into its block images, ~3.5
each for the train pool), or one image of a --pages folder / Parquet. --set KEY=VALUE sets any other
jobs/train_drafter.py field (pipeline/train_drafter.TrainDrafterConfig), e.g. num_layers=4, dflash2=true, distill=0.5.

Memory: the collection keeps every answer's tapped hidden states where the target ran (GPU memory on CUDA): per token
fed, num_taps x hidden_size x the dtype's bytes = 4 x 256 x 2 = 2 KiB at ocria-tiny's shape in bf16 (4 KiB in
fp32), plus with distill the top-k soft labels (16 x 12 bytes per answer token). A block image of the train pool
feeds ~300 prompt + ~85 answer tokens (bench/results/h200_drafter_train_tau.json, cpu_drafter_collect.json): ~0.8 MB;
a synthetic page ~3.5 of them: ~2.7 MB. So 3.6 k pages take ~10 GB, 12 k ~32 GB, 25 k ~68 GB, 50 k ~135 GB: 50 k
does not fit a ~100 GB budget nor an H200's 141 GB beside the engines. --memory-gb bounds it (default 100 on the CPU;
on CUDA the device's memory less 24 GB for the engines and training, at most 100): the bytes a page measured so far
project each size before its pages are read, and the sizes beyond the budget are dropped (listed in the JSON's
`dropped` with the GB they would need; ~20 k pages fit an H100, ~37 k an H200); the smallest is checked after its
first group of pages and, if it does not fit, the run stops there, saying so.

Time: at ~22 block images/s (H100, bench/results/h100_drafter_dflash2_tau_e.json) 1,000 pages take ~160 s to
collect, 50 k ~2.2 h: one 600 s device call holds ~2 k pages beside the training and tau reads. Where that time
goes is the JSON's `collection` (engine/drafter_training.collection_summary, rewritten after each size and echoed on
its line): the start until the first answers, the steady images/s after the first group, the seconds and ms an image
spent waiting for drawn pages, preprocessing, answering, tapping and in other host work, and the renderers' capacity.
"""
from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from bench.drafter_tau import load_page_sets, plain_reads, tau_rows  # noqa: E402
from engine.drafter_training import Example, collect_groups, collection_summary  # noqa: E402
from engine.models.dflash import build_target_layer_ids  # noqa: E402
from pipeline.train_drafter import (  # noqa: E402
    TrainDrafterConfig, config_target, drawn_pages, load_pages, train)

ROW_FIELDS = ("tau", "verify_steps", "drafted", "accepted", "acceptance_by_position", "identical_to_plain",
              "identical_pages", "seconds")
ENGINES_RESERVE_GB = 24  # collection KV (8 GB in drafter_h200.sh) + tau engines + training activations


class MemoryBudget(RuntimeError):
    pass


def example_bytes(ex: Example) -> int:
    """What an answer holds: its taps, its soft labels, and its ids (a list of Python ints, ~36 bytes a token)."""
    n = sum(t.numel() * t.element_size() for t in ex.taps.values()) + 36 * len(ex.ids)
    if ex.soft is not None:
        n += sum(t.numel() * t.element_size() for t in ex.soft)
    return n


def default_budget_gb(device: str) -> float:
    if torch.device(device).type == "cuda":
        total = torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**30
        return max(1.0, min(100.0, total - ENGINES_RESERVE_GB))
    return 100.0


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(",", " ").split()]


def page_lists(cfg: TrainDrafterConfig, most: int):
    """The source's pages in order, each as its list of images (an iterable): a --pages folder or Parquet gives one
    image a page; drawn pages come from worker processes (drawn_pages, a RenderedPages with its stats) while the
    target reads the ones drawn before."""
    if cfg.pages is not None:
        images = load_pages(cfg.pages)
        if len(images) < most:
            raise click.UsageError(f"--pages {cfg.pages}: {len(images)} images, fewer than the largest size {most}")
        return [[im] for im in images[:most]]
    return drawn_pages(cfg, most)


def plot(result: dict, png: Path) -> bool:
    """tau against pages seen, one line per (split, block); False where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    splits = list(dict.fromkeys(r["split"] for r in result["rows"]))  # colour: the split; line style: the block
    blocks = sorted({r["block_size"] for r in result["rows"]}, reverse=True)
    for split, block in itertools.product(splits, blocks):
        pts = sorted((r["pages"], r["tau"]) for r in result["rows"] if (r["split"], r["block_size"]) == (split, block))
        ax.plot(*zip(*pts), marker="o", color=f"C{splits.index(split)}",
                linestyle=["-", "--", ":", "-."][blocks.index(block) % 4], label=f"{split}, block {block}")
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xticks(sorted({r["pages"] for r in result["rows"]}))  # the sizes themselves, written out
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("training pages seen")
    ax.set_ylabel("tau (tokens per verify step)")
    cfg = result["config"]
    ax.set_title(f"drafter tau against data ({result['device']}, {cfg['train_seconds'] or cfg['steps']}"
                 f"{' s' if cfg['train_seconds'] else ' steps'} a size)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return True


@click.command(context_settings={"show_default": True})
@click.option("--checkpoint", required=True, help="target checkpoint folder")
@click.option("--pages", help="folder of page images or .parquet of raster rows (one image a page)")
@click.option("--render", help="or pages drawn by module:function (jobs/train_drafter.py --render)")
@click.option("--render-arg", "render_args", multiple=True, help="KEY=VALUE: a keyword argument of the function")
@click.option("--render-first", type=int, default=0, help="the first drawn page's number")
@click.option("--render-workers", type=int, default=4)
@click.option("--sizes", required=True, help="training pages of each drafter, e.g. '3600,12000,25000,50000'")
@click.option("--blocks", default="16,8", help="verify block sizes tau is measured at")
@click.option("--tau-pages", "tau_dirs", multiple=True, required=True,
              help="folder of PNG block images tau is measured on (its name is the row's split); repeat")
@click.option("--train-seconds", type=float, help="each drafter's training time (TrainDrafterConfig.max_seconds)")
@click.option("--steps", type=int, help="each drafter's training steps (with --train-seconds: at most these)")
@click.option("--device", default="cpu")
@click.option("--dtype", default="float32")
@click.option("--config", "config_path", type=click.Path(exists=True), help="YAML with TrainDrafterConfig fields")
@click.option("--set", "sets", multiple=True, help="KEY=VALUE: a TrainDrafterConfig field, e.g. num_layers=4")
@click.option("--memory-gb", type=float, help="budget of the collected answers (default: see the docstring)")
@click.option("--check-plain/--no-check-plain", default=True, help="tau reads' answers against plain decoding's")
@click.option("--collect-bench", type=click.Path(), help="bench/drafter_collect_bench.py's JSON of the same run")
@click.option("--out", required=True, type=click.Path(), help="JSON to write (the PNG and drafters go beside it)")
def main(checkpoint, pages, render, render_args, render_first, render_workers, sizes, blocks, tau_dirs,
         train_seconds, steps, device, dtype, config_path, sets, memory_gb, check_plain, collect_bench, out):
    import yaml
    from pydantic import ValidationError

    sizes, blocks = parse_ints(sizes), parse_ints(blocks)
    if not sizes or sorted(set(sizes)) != sizes or sizes[0] < 1:
        raise click.UsageError(f"--sizes {sizes}: give ascending, distinct page counts >= 1")
    if train_seconds is None and steps is None:
        raise click.UsageError("give each drafter's budget: --train-seconds and/or --steps")
    for kv in (*render_args, *sets):
        if "=" not in kv:
            raise click.UsageError(f"{kv}: give KEY=VALUE")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    drafters = out.with_suffix("")  # OUT.json -> OUT/pages_N/ for each size's drafter
    data = yaml.safe_load(Path(config_path).read_text()) if config_path else {}
    data.update(dict(kv.split("=", 1) for kv in sets))
    data.update({k: v for k, v in dict(pages=pages, render=render).items() if v is not None})
    data.update(checkpoint=checkpoint, render_pages=sizes[-1] if data.get("render") else 0,
                render_first=render_first, render_workers=render_workers, device=device, dtype=dtype,
                out=str(drafters / "drafter"), heldout=0, max_seconds=train_seconds, steps=steps or 1_000_000)
    if render_args:
        data["render_args"] = {**data.get("render_args", {}), **dict(a.split("=", 1) for a in render_args)}
    try:
        base = TrainDrafterConfig(**data)
    except ValidationError as e:
        raise click.UsageError(str(e)) from None
    if base.init:
        raise click.UsageError("--set init=...: each size trains a drafter from scratch")
    budget_gb = memory_gb or default_budget_gb(device)
    tau_sets = load_page_sets(tau_dirs, "", base.max_tokens)
    results = harness.ResultFile(out, harness.result_meta(
        __file__, "drafter tau against training data: one collection of the target's answers, then per size N a "
        "drafter trained on the answers to the first N pages (same config, seed and budget), tau on held-out "
        "synthetic and corpus block images", device=device))
    result = {
        "torch": torch.__version__,
        "config": {"sizes": sizes, "blocks": blocks, "train_seconds": train_seconds, "steps": steps,
                   "memory_gb": round(budget_gb, 1), "tau_pages": {k: len(v) for k, v in tau_sets.items()},
                   "check_plain": check_plain, "train": base.model_dump()},
        "rows": [], "png": None,
    }
    if collect_bench:
        bench = json.loads(Path(collect_bench).read_text())
        # its speedup: the eager collection's seconds over the collection's on the same images in that run, or
        # their rates' ratio where its --seconds stopped the eager one early; none where it stopped before that
        result["collection_speedup"] = bench.get("speedup")
        result["collection_bench"] = {k: bench.get(k) for k in (
            "device", "complete", "images", "batch", "eager_images", "eager_images_per_s", "collect_images_per_s",
            "speedup_basis", "collect_ms_per_image", "phases_s", "answers_identical", "answers_compared")}

    def write():
        results.write(result)

    pages_in = page_lists(base, sizes[-1])
    if hasattr(pages_in, "start"):
        pages_in.start()  # the workers draw the first pages while the target loads
    t0 = time.perf_counter()
    target = config_target(base)  # as jobs/train_drafter builds it
    layer_ids = build_target_layer_ids(target.cfg.text.num_hidden_layers, base.num_taps)
    result["target_load_s"] = round(time.perf_counter() - t0, 1)
    examples, bounds, used, dropped = [], [], 0, {}  # bounds: per size kept, (pages, answers, block images)
    read = {"pages": 0, "images": 0}
    timings: dict = {}
    source = iter(pages_in)

    def summarize():  # where the collection's time went so far (engine/drafter_training.collection_summary)
        result["collection"] = collection_summary(timings, result["target_load_s"], getattr(pages_in, "stats", None))
        result["collection_timings"] = {k: v for k, v in timings.items() if k != "groups"}
        return result["collection"]

    def take(n):  # the next n pages' images, counting the pages started
        for images in itertools.islice(source, n):
            read["pages"] += 1
            yield from images

    t1 = time.perf_counter()
    try:
        for k, n in enumerate(sizes):
            per_page = used / read["pages"] if read["pages"] else None
            if per_page is not None and per_page * n > budget_gb * 2**30:
                dropped = {m: round(per_page * m / 2**30, 1) for m in sizes[k:]}
                click.echo(f"sizes {sizes[k:]} dropped: their answers would take {dropped} GB at "
                           f"{per_page / 2**20:.2f} MB a page, over the budget of {budget_gb:.0f} GB (--memory-gb)")
                break

            def check(part, _images, n=n, first=k == 0):
                """The smallest size stops after its first group if the answers to its pages will not fit; a
                larger one (checked before it starts) only if they no longer do."""
                size = used + sum(map(example_bytes, part))
                projected = size / read["pages"] * (n if first else read["pages"])
                if projected > budget_gb * 2**30:
                    raise MemoryBudget(
                        f"the answers to {n} pages would take ~{size / read['pages'] * n / 2**30:.1f} GB "
                        f"({size / read['pages'] / 2**20:.2f} MB a page after {read['pages']}), over the budget of "
                        f"{budget_gb:.0f} GB (--memory-gb): use smaller --sizes or a larger budget")

            try:
                part, images = collect_groups(target, take(n - bounds[-1][0] if bounds else n), base.collect_group,
                                              layer_ids, base.prompt, base.max_tokens,
                                              soft_top_k=base.distill_top_k if base.distill > 0 else 0,
                                              tap_tokens=base.tap_tokens, timings=timings, on_group=check)
            except MemoryBudget as e:
                if k == 0:
                    raise click.ClickException(str(e)) from None
                dropped = {m: None for m in sizes[k:]}
                click.echo(f"sizes {sizes[k:]} dropped: {e}")
                read["pages"] = bounds[-1][0]  # the answers to the size's pages read so far are let go
                break
            examples += part
            used += sum(map(example_bytes, part))
            read["images"] += images
            bounds.append((n, len(examples), read["images"]))
            click.echo(f"collected the answers to {n} pages ({read['images']} images, {len(examples)} answers, "
                       f"{used / 2**30:.2f} GB) at {time.perf_counter() - t1:.0f} s: {summarize()['line']}")
            write()  # a run stopped later keeps the collection's breakdown so far
    finally:
        if hasattr(source, "close"):  # drawn pages: the renderers end here
            source.close()
    collection_s = time.perf_counter() - t1
    del target
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    result.update(collection_s=round(collection_s, 1), collection_pages=read["pages"],
                  collection_images=read["images"], collection_answers=len(examples),
                  collection_answer_tokens=sum(len(e.ids) - e.prompt_len for e in examples),
                  collection_pages_per_s=round(read["pages"] / collection_s, 3),
                  collection_images_per_s=round(read["images"] / collection_s, 3),
                  collection_gb=round(used / 2**30, 2), collection_mb_per_page=round(used / read["pages"] / 2**20, 3),
                  dropped=dropped)
    summarize()
    write()
    click.echo(f"collection: {read['pages']} pages, {read['images']} images, {len(examples)} answers in "
               f"{collection_s:.0f} s ({result['collection_pages_per_s']} pages/s), {used / 2**30:.2f} GB: "
               f"{result['collection']['line']}")
    plain = plain_reads(checkpoint, tau_sets, device, dtype)[1] if check_plain else None
    png = out.with_suffix(".png")
    for n, answers, images in bounds:
        subset = examples[:answers]  # the answers to pages 0 .. n - 1, in page order
        # only the target's embedding and LM head are used when the answers are given: a small KV cache will do
        cfg = base.model_copy(update=dict(out=str(drafters / f"pages_{n}"), kv_cache_memory_gb=1.0
                                          if torch.device(device).type == "cuda" else base.kv_cache_memory_gb))
        log = train(cfg, echo=click.echo, collected=subset, collected_pages=n)
        losses = log["losses"]
        size = dict(pages=n, answers=len(subset), train_answers=log["answers"], block_images=images,
                    answer_tokens=sum(len(e.ids) - e.prompt_len for e in subset), train_seconds=log["train_seconds"],
                    steps=log["steps"], loss_last=round(sum(losses[-20:]) / len(losses[-20:]), 4))
        for row in tau_rows(checkpoint, cfg.out, tau_sets, blocks, device, dtype, plain):
            result["rows"].append(dict(size, block_size=row["block_size"], split=row["page_set"],
                                       **{k: row[k] for k in ROW_FIELDS}))
            click.echo(json.dumps(result["rows"][-1]))
            write()
        result["png"] = png.name if plot({**results.meta, **result}, png) else None
        write()
    if result["png"] is None:
        click.echo("matplotlib is not installed: no PNG")
    return result


if __name__ == "__main__":
    main()
