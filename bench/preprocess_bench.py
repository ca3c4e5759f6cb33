"""Host cost of turning a rendered page into vision-tower input, one core: transformers-format float patches
(`ImageProcessor.__call__`) vs the uint8 patches the native backend ships (`merge_order_patches`), and what the
device-side expansion costs when it runs on this CPU instead.

    python bench/preprocess_bench.py --out bench/results/preprocess_cpu.json
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

import click
import pymupdf
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from engine.processor import ImageProcessor
from pipeline.rasterize import render_page


def timed_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@click.command()
@click.option("--pdf", default=str(ROOT.parent / "shared" / "corpus" / "olmocr__olmo-page-1.pdf"),
              show_default=True, help="a page of this PDF is rendered as the test image")
@click.option("--longest-px", default=1312, show_default=True, help="render size (scale-out bench: 1312)")
@click.option("--repeat", default=20, show_default=True)
@click.option("--out", default=None)
def main(pdf: str, longest_px: int, repeat: int, out: str | None) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    torch.set_num_threads(1)
    with pymupdf.open(pdf) as doc:
        image = render_page(doc[0], longest_px, longest_px * longest_px)
    proc = ImageProcessor(min_pixels=32 * 32, max_pixels=longest_px * longest_px)
    floats, grid = proc(image)
    raw, _ = proc.merge_order_patches(image)
    raw_t = torch.from_numpy(raw)
    assert torch.equal(proc.expand_patches(raw_t), torch.from_numpy(floats))  # same input to the vision tower
    result = {
        "image": list(image.shape), "grid": list(grid), "pdf": Path(pdf).name, "repeat": repeat,
        "float_patches_ms": timed_ms(lambda: proc(image), repeat), "float_patches_mb": floats.nbytes / 1e6,
        "uint8_patches_ms": timed_ms(lambda: proc.merge_order_patches(image), repeat), "uint8_patches_mb": raw.nbytes / 1e6,
        "expand_on_this_cpu_ms": timed_ms(lambda: proc.expand_patches(raw_t), repeat),
        "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
    }
    print(f"page {image.shape[1]}x{image.shape[0]} -> grid {grid}: float patches {result['float_patches_ms']:.1f} ms "
          f"({result['float_patches_mb']:.1f} MB), uint8 patches {result['uint8_patches_ms']:.1f} ms "
          f"({result['uint8_patches_mb']:.1f} MB); expansion on this CPU {result['expand_on_this_cpu_ms']:.1f} ms")
    if out:
        harness.write_result(out, result, harness.result_meta(
            __file__, f"host cost of a {longest_px} px page's vision input, one core: float patches vs uint8 patches, "
            f"and the uint8 patches' expansion on this CPU", device="cpu"), indent=2)


if __name__ == "__main__":
    main()
