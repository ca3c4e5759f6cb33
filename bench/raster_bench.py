"""Rasterization speed, one process on one core: pages/s at the default page size (longest side 1288 px), with
and without text-layer extraction, and what PNG encoding would cost (why pages travel as raw arrays).

    python bench/raster_bench.py --out bench/results/raster_cpu.json
"""
from __future__ import annotations

import csv
import os
import platform
import sys
import time
from pathlib import Path

import click
import pymupdf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from pipeline.rasterize import RasterOptions, rasterize, render_page  # noqa: E402


def corpus_files(corpus: Path, limit_pages: int) -> list[Path]:
    rows = list(csv.DictReader(open(corpus / "manifest.csv")))
    ok = [r for r in rows if r["expected_behaviour"] == "ok" and r["category"] in ("text", "table", "multicol", "scan", "nonlatin")]
    return [corpus / r["filename"] for r in ok if int(r["pages"]) <= limit_pages]


@click.command()
@click.option("--corpus", default=str(ROOT.parent / "shared" / "corpus"))
@click.option("--out", default=None)
@click.option("--repeat", default=2, show_default=True)
def main(corpus: str, out: str | None, repeat: int) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    files = corpus_files(Path(corpus), limit_pages=20)
    data = [(f.name, f.read_bytes()) for f in files]
    results = {}
    for label, opts in [("render+text", RasterOptions()), ("render only", RasterOptions(extract_text=False))]:
        best = None
        for _ in range(repeat):
            pages, t0 = 0, time.perf_counter()
            for name, blob in data:
                for _ in rasterize(blob, name, opts):
                    pages += 1
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        results[label] = {"pages": pages, "seconds": best, "pages_per_s_per_core": pages / best}
    # PNG cost on a subset, for the record
    name, blob = data[0]
    doc = pymupdf.open(stream=blob, filetype="pdf")
    t0 = time.perf_counter()
    n = 0
    for page in doc:
        arr = render_page(page, 1288, 1288 * 1288)
        pymupdf.Pixmap(pymupdf.csRGB, arr.shape[1], arr.shape[0], arr.tobytes(), False).tobytes("png")
        n += 1
    results["render+png (first file)"] = {"pages": n, "pages_per_s_per_core": n / (time.perf_counter() - t0)}
    report = {"files": len(data), "target_longest_px": 1288, "cpu": platform.processor() or platform.machine(),
              "pymupdf": pymupdf.VersionBind, "results": results}
    for k, v in results.items():
        print(f"{k:<26} {v['pages']:>5} pages  {v['pages_per_s_per_core']:8.1f} pages/s/core")
    if out:
        harness.write_result(out, report, harness.result_meta(
            __file__, "PyMuPDF rasterization, one core, 1288 px longest side, corpus pages: pages/s with and without "
            "text-layer extraction, and with PNG encoding", device="cpu"), indent=2)


if __name__ == "__main__":
    main()
