"""`research.ocria_tiny.eval_ocr` through a read-through cache of the native reader's answers, so ways of combining block reads (more
sizes, the main-read guard) can be compared on the same reads without reading again.

Every image the reader reads is logged to READ_CACHE (jsonl: the image's sha1 with its shape, the answer); images
found in it, or in the files of READ_CACHE_MORE (comma-separated; gzipped ones too, as the logs committed in
research/ocria_tiny/results/s37_read_cache_*.jsonl.gz), are answered from it. On one machine and thread
count the reads are deterministic, so a replay reproduces a direct read (session 37: pages 912-959 at three sizes,
0 of 48 pages differ from R18's direct read).

MAIN_READ_GUARD=1 adds session 37's main-read guard (rule R21, not shipped: no change on fresh pages 1344-1439): a
block whose reads hold no majority keeps its main read instead of the vote where the two lengths differ by more than
8 printed characters and 10 %, and the main read's is nearer the length its ink predicts (its glyph runs times the
page's printed characters per run on its settled blocks; 1.06 with fewer than 100 such runs).

  READ_CACHE=build/s37/trace/cache_f1.jsonl OMP_NUM_THREADS=1 python research/ocria_tiny/studies/read_cache.py --model M \\
      --config research/ocria_tiny/results/eval_full_pages_1536_config.yaml --synth .synth --batch 96 --reader native \\
      --no-tesseract --loop-drop-tokens 64 --loop-ban-next --device cpu --dtype float32 --glyph-px 32 \\
      --block-lines 8 --block-scales 1 0.9375 1.0625 0.875 1.125 --corpus-pages 0 --heldout 48 --heldout-from 1344 \\
      --out OUT.json
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

import pipeline.blocks as blocks
from research.ocria_tiny import eval_ocr
from pipeline.vote import majority

GUARD_MIN_GAP, GUARD_GAP_SHARE, GUARD_MIN_GLYPHS, DEFAULT_CHARS_PER_GLYPH = 8, 0.1, 100, 1.06


def image_key(image: np.ndarray) -> str:
    return hashlib.sha1(str(image.shape).encode() + np.ascontiguousarray(image).tobytes()).hexdigest()


def load_cache(paths: list[Path]) -> dict[str, str]:
    cache = {}
    for path in paths:
        if path.exists():
            text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
            for line in text.splitlines():
                row = json.loads(line)
                cache[row["h"]] = row["t"]
    return cache


def with_main_read_guard(read_at_scales):
    """`pipeline.blocks.read_at_scales` with the guard applied to its answers (strings: eval_ocr's reads)."""

    def guarded(images, wanted, token_px, scales, read, text, combine, views=None):
        reads = []

        def keep_reads(answers):
            reads.append([text(a) for a in answers])
            return combine(answers)

        out = list(read_at_scales(images, wanted, token_px, scales, read, text, keep_reads, views))
        if len(scales) < 2:
            return out
        settled = [majority(r, len(scales)) is not None for r in reads]
        chars, runs = {}, {}
        for (p, _, b), done, o in zip(wanted, settled, out):
            if done and b.glyphs >= blocks.RUN_ON_MIN_GLYPHS:
                chars[p] = chars.get(p, 0) + blocks.printed_chars(text(o))
                runs[p] = runs.get(p, 0) + b.glyphs
        for i, ((p, _, b), done, r) in enumerate(zip(wanted, settled, reads)):
            if done or b.glyphs < blocks.RUN_ON_MIN_GLYPHS:
                continue
            per_run = chars[p] / runs[p] if runs.get(p, 0) >= GUARD_MIN_GLYPHS else DEFAULT_CHARS_PER_GLYPH
            expected = per_run * b.glyphs
            v, m = blocks.printed_chars(text(out[i])), blocks.printed_chars(r[0])
            if abs(v - m) > max(GUARD_MIN_GAP, GUARD_GAP_SHARE * max(v, m)) and abs(m - expected) < abs(v - expected):
                out[i] = r[0]
        return out

    return guarded


def main(argv: list[str] | None = None) -> int:
    log_path = Path(os.environ["READ_CACHE"])
    more = [Path(p) for p in os.environ.get("READ_CACHE_MORE", "").split(",") if p]
    cache = load_cache(more + [log_path])
    stats = {"from_cache": 0, "read": 0}
    direct_read = eval_ocr.EnginePageReader.read

    def cached_read(self, images, max_new_tokens=512):
        keys = [image_key(im) for im in images]
        todo = [i for i, k in enumerate(keys) if k not in cache]
        stats["from_cache"] += len(images) - len(todo)
        stats["read"] += len(todo)
        if todo:
            with log_path.open("a") as log:
                for i, text in zip(todo, direct_read(self, [images[i] for i in todo], max_new_tokens)):
                    cache[keys[i]] = text
                    log.write(json.dumps({"h": keys[i], "t": text}) + "\n")
        return [cache[k] for k in keys]

    eval_ocr.EnginePageReader.read = cached_read
    if os.environ.get("MAIN_READ_GUARD") == "1":
        blocks.read_at_scales = with_main_read_guard(blocks.read_at_scales)
    rc = eval_ocr.main(argv)
    print(json.dumps({"read_cache": stats}), file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
