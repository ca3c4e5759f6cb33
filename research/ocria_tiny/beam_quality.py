"""ocria-tiny read with beam search in the native engine: what beams buy in CER, whether the engine's beam search is
transformers', and how often a beam member continues itself.

    python -m research.ocria_tiny.beam_quality export --pages build/beam_pages       # here (pymupdf, .synth)
    python3 -m research.ocria_tiny.beam_quality run --pages build/beam_pages --out $OUT/beam   # H200, carry the pages
    python -m research.ocria_tiny.beam_quality parents --pages build/beam_pages --out parents.json   # CPU

`export` draws the held-out synthetic pages research.ocria_tiny.eval_ocr scores (same config, pool and seeds) and writes
them as PNG files with their reference text, so the GPU machine needs neither pymupdf nor the text pools.
`run` does two things, each recorded as soon as it is done:
  1. ocria-tiny, bf16, CUDA graphs: every page read greedy and with --beams, timed (pages/s) and scored (CER);
  2. the same engine in fp32 against transformers' generate(num_beams, early_stopping=True) in fp32 on the first
     --check-pages pages, greedy and with beams: identical texts are expected (TF32 off on both sides).
`parents`: the share of member-steps whose parent is the member itself, the copy kernels/copy_rows leaves out.
What a beam step costs at Qwen3.5-4B's shape is the engine's benchmark: bench/beam_search_bench.py.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.beam_search_bench import empty_cache, table
from bench.engine_bench import sync
from research.ocria_tiny.eval_ocr import (EnginePageReader, HFPageReader, Score, heldout_pages, markdown_to_text,
                                          pool_fingerprint)
from research.ocria_tiny.train_config import load_config

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "models" / "ocria-tiny"


def export(args) -> None:
    from PIL import Image

    cfg = load_config(args.config, [])
    args.pages.mkdir(parents=True, exist_ok=True)
    refs = []
    for p in heldout_pages(args.heldout, cfg, args.synth):
        Image.fromarray(p.image).save(args.pages / f"{p.name}.png", optimize=True)
        refs.append({"page": p.name, "reference_text": p.reference_text})
    meta = {"config": str(args.config), "pool": pool_fingerprint(args.synth), "pages": refs}
    (args.pages / "pages.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {len(refs)} pages to {args.pages}")


def load_pages(folder: Path) -> tuple[list[str], list[np.ndarray], list[str]]:
    from PIL import Image

    meta = json.loads((folder / "pages.json").read_text())
    names = [p["page"] for p in meta["pages"]]
    images = [np.asarray(Image.open(folder / f"{n}.png").convert("RGB")) for n in names]
    return names, images, [p["reference_text"] for p in meta["pages"]]


def read_timed(reader, images, max_new_tokens: int) -> tuple[list[str], float]:
    device = reader.backend.engine.device
    reader.read(images[:2], 8)  # warm-up: first-use compilation stays out of the timing
    sync(device)
    t = time.perf_counter()
    texts = reader.read(images, max_new_tokens)
    sync(device)
    return texts, time.perf_counter() - t


def tiny_quality(pages, beams: list[int], max_new_tokens: int, device: str, model: Path = TINY) -> list[dict]:
    names, images, refs = pages
    rows = []
    for k in beams:
        reader = EnginePageReader(model, device, num_beams=k, batch=len(images), dtype="auto")  # bf16 on CUDA
        texts, wall = read_timed(reader, images, max_new_tokens)
        score = Score()
        for hyp, ref in zip(texts, refs):
            score.add(markdown_to_text(hyp), ref)
        dtype = str(reader.backend.engine.dtype).replace("torch.", "")
        rows.append({"part": f"ocria-tiny {dtype}", "num_beams": k, "pages": len(images), "wall_s": wall,
                     "pages_per_s": len(images) / wall, **{f"text_{k2}": v for k2, v in score.summary().items()}})
        reader.close()
        empty_cache()
    return rows


def tiny_exactness(pages, beams: list[int], n: int, max_new_tokens: int, device: str,
                   model: Path = TINY) -> list[dict]:
    names, images, _ = pages
    images = images[:n]
    hf = HFPageReader(model, device)
    rows = []
    for k in beams:
        hf.num_beams = k
        reader = EnginePageReader(model, device, num_beams=k, batch=len(images), dtype="float32")
        native = reader.read(images, max_new_tokens)
        reference = [hf.read([im], max_new_tokens)[0] for im in images]  # one at a time: no padding
        same = [a == b for a, b in zip(native, reference)]
        diff = Score()
        for a, b in zip(native, reference):
            diff.add(a, b)
        rows.append({"part": "ocria-tiny fp32 vs transformers", "num_beams": k, "pages": len(images),
                     "identical": sum(same), "cer_between": diff.summary()["cer"],
                     "first_mismatch": next(({"page": nm, "native": a[:120], "transformers": b[:120]}
                                             for nm, a, b, s in zip(names, native, reference, same) if not s), None)})
        reader.close()
    del hf, reader
    empty_cache()
    return rows


def run(args) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 comparison must not compute in TF32 on one side
    torch.backends.cudnn.allow_tf32 = False
    args.out.mkdir(parents=True, exist_ok=True)
    meta = json.loads((args.pages / "pages.json").read_text())
    result = {"command": "python3 -m research.ocria_tiny.beam_quality " + " ".join(sys.argv[1:]),
              "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
              "torch": torch.__version__, "pages": {k: v for k, v in meta.items() if k != "pages"}, "rows": []}

    def record(rows):
        result["rows"] += rows
        (args.out / "beam_quality.json").write_text(json.dumps(result, indent=1) + "\n")
        print(table(rows), flush=True)

    t = time.perf_counter()
    pages = tuple(x[:args.num_pages] for x in load_pages(args.pages))
    record(tiny_quality(pages, [1] + args.beams, args.max_new_tokens, args.device, args.model))
    record(tiny_exactness(pages, [1] + args.beams, args.check_pages, args.max_new_tokens, args.device, args.model))
    print(f"ocria-tiny parts: {time.perf_counter() - t:.0f} s", flush=True)
    print("\n" + table(result["rows"]))


def parent_shares(args) -> None:
    """How often a beam member continues itself (its parent is its own row) when ocria-tiny reads real pages: the
    share of the per-step cache copy that kernels/copy_rows leaves out."""
    names, images, _ = load_pages(args.pages)
    reader = EnginePageReader(args.model, args.device, num_beams=args.beams, batch=args.num_pages)
    engine = reader.backend.engine
    copy, steps = engine.beams.copy_to_members, []

    def recording_copy(beams):
        for _, choice in beams:
            if choice.num_rows > 1:  # forked: rows are members
                steps.append((choice.parents.cpu() == torch.arange(choice.parents.shape[1])).float().mean(1))
        return copy(beams)

    engine.beams.copy_to_members = recording_copy
    reader.read(images[:args.num_pages], args.max_new_tokens)
    reader.close()
    stay = torch.cat(steps)
    out = {"command": "python -m research.ocria_tiny.beam_quality " + " ".join(sys.argv[1:]),
           "pages": names[:args.num_pages], "num_beams": args.beams, "request_steps": len(stay),
           "share_of_members_continuing_themselves": float(stay.mean()),
           "share_of_steps_where_all_do": float((stay == 1).float().mean())}
    print(json.dumps(out, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="held-out pages as PNG files with their reference text")
    ex.add_argument("--pages", type=Path, required=True)
    ex.add_argument("--heldout", type=int, default=24)
    ex.add_argument("--config", type=Path,
                    default=ROOT / "research/ocria_tiny/results/eval_full_pages_1536_config.yaml")
    ex.add_argument("--synth", type=Path, default=ROOT / ".synth")
    rn = sub.add_parser("run", help="pages read greedy and with beams (CER, pages/s); fp32 against transformers")
    rn.add_argument("--pages", type=Path, required=True, help="the exported pages")
    rn.add_argument("--out", type=Path, required=True)
    rn.add_argument("--model", type=Path, default=TINY)
    rn.add_argument("--beams", default="4", type=lambda s: [int(x) for x in s.split(",")])
    rn.add_argument("--num-pages", type=int, default=None, help="default: all exported pages")
    rn.add_argument("--check-pages", type=int, default=4)
    rn.add_argument("--device", default="cuda")
    rn.add_argument("--max-new-tokens", type=int, default=1024)
    ps = sub.add_parser("parents", help="how often beam members continue themselves")
    ps.add_argument("--pages", type=Path, required=True)
    ps.add_argument("--out", type=Path, required=True)
    ps.add_argument("--model", type=Path, default=TINY)
    ps.add_argument("--device", default="cpu")
    ps.add_argument("--beams", type=int, default=4)
    ps.add_argument("--num-pages", type=int, default=4)
    ps.add_argument("--max-new-tokens", type=int, default=1024)
    args = ap.parse_args(argv)
    {"export": export, "run": run, "parents": parent_shares}[args.cmd](args)


if __name__ == "__main__":
    main()
