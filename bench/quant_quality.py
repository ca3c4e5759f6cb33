"""ocria-tiny bf16 vs FP8 vs NVFP4 on the same held-out synthetic pages: CER of each, paired per page.

  python bench/quant_quality.py --synth .synth --heldout 24 --heldout-from 2000 \
      --model bf16=models/ocria-tiny --model fp8=models/ocria-tiny-fp8 --model nvfp4=models/ocria-tiny-nvfp4 \
      --out bench/results/ocria_tiny_quant_quality.json

Each model reads the pages through the ocria-tiny evaluation (research/ocria_tiny/eval_ocr.py, run as a subprocess:
the native engine, CPU fp32, blocks of 8
lines at the shipped 32 px glyph size, one read per block, loops dropped as the job does), so every model sees the
same page images. Reported: each model's micro CER (total edits / total reference characters, plain text), the
difference to bf16 in CER points (x 100) with a paired bootstrap 95 % interval over pages (2,000 draws), how many
pages read identically, and the CER of each quantized model's output against bf16's (how much the text moved).
Targets (issue 42): FP8 within 0.2 CER points of bf16, NVFP4 within 0.5.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

TARGET_POINTS = {"fp8": 0.2, "nvfp4": 0.5}
# the ocria-tiny evaluation and its 1,536 px page config
EVAL_MODULE = "research.ocria_tiny.eval_ocr"
EVAL_CONFIG = "research/ocria_tiny/results/eval_full_pages_1536_config.yaml"
EVAL_FLAGS = ["--reader", "native",
              "--no-tesseract", "--loop-drop-tokens", "64", "--loop-ban-next",
              "--glyph-px", "32", "--block-lines", "8", "--block-scales", "1", "--corpus-pages", "0"]


def eval_flags(device: str, dtype: str) -> list[str]:
    """The evaluation's flags: EVAL_FLAGS on `device` in `dtype` (CPU fp32 by default; a GPU reads in bf16, many
    more pages in the same time)."""
    return [*EVAL_FLAGS, "--device", device, "--dtype", dtype]


def run_eval(model: Path, synth: Path, n: int, first: int, batch: int, out: Path, options: list[str] = (),
             flags: list[str] = ()) -> dict:
    cmd = [sys.executable, "-m", EVAL_MODULE, "--config", EVAL_CONFIG, "--model", str(model), "--synth", str(synth), "--heldout", str(n),
           "--heldout-from", str(first), "--batch", str(batch), "--out", str(out), *(flags or eval_flags("cpu", "float32")),
           *(f"--engine-option={o}" for o in options)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def weights_digest(ckpt: Path) -> str:
    """sha256 of the checkpoint's weight files (first 16 hex digits): which bytes were read."""
    h = hashlib.sha256()
    for f in sorted(ckpt.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def paired(base: list[dict], other: list[dict], draws: int = 2000, seed: int = 0) -> dict:
    """CER difference (other - base) in points with a paired bootstrap over pages."""
    ref = np.array([p["model_text"]["ref_chars"] for p in base], dtype=float)
    eb = np.array([p["model_text"]["cer"] for p in base]) * ref
    eo = np.array([p["model_text"]["cer"] for p in other]) * ref
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ref), (draws, len(ref)))
    diffs = (eo[idx].sum(1) - eb[idx].sum(1)) / ref[idx].sum(1) * 100
    return {"cer_diff_points": round(float((eo.sum() - eb.sum()) / ref.sum() * 100), 4),
            "ci95_points": [round(float(np.percentile(diffs, 2.5)), 4), round(float(np.percentile(diffs, 97.5)), 4)],
            "median_page_diff_points": round(float(np.median((eo - eb) / ref)) * 100, 4),
            "pages_worse": int((eo > eb).sum()), "pages_better": int((eo < eb).sum()),
            "pages_identical_output": int(sum(a["model_output"] == b["model_output"] for a, b in zip(base, other)))}


def main(argv: list[str] | None = None) -> int:
    from pipeline.text import levenshtein

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True,
                    help="NAME=PATH[,KEY=VALUE...] (engine options, e.g. gdn_state_dtype=bfloat16); the first is the "
                         "baseline")
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--heldout", type=int, default=24)
    ap.add_argument("--heldout-from", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--note", default="", help="how the inputs were made (kept in the results)")
    ap.add_argument("--device", default="cpu", help="where the evaluation reads (cuda: in --dtype bfloat16, say)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--work", type=Path, default=None,
                    help="keep each model's eval JSON here and reuse it when it is there (same pages and flags)")
    args = ap.parse_args(argv)
    specs = {name: rest.split(",") for name, rest in (m.split("=", 1) for m in args.model)}
    models = {name: parts[0] for name, parts in specs.items()}
    options = {name: parts[1:] for name, parts in specs.items()}
    results, seconds, read_from = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name, path in models.items():
            t0 = time.time()
            cached = work / f"{name}_{args.heldout_from}_{args.heldout}_{args.device}_{args.dtype}.json"
            full = (json.loads(cached.read_text()) if cached.is_file() else
                    run_eval(Path(path), args.synth, args.heldout, args.heldout_from, args.batch, cached,
                             options[name], eval_flags(args.device, args.dtype)))
            results[name], read_from[name] = full["heldout_synthetic"], full["model"]
            seconds[name] = results[name]["model_text"].get("seconds", round(time.time() - t0, 1))
            print(name, results[name]["model_text"], file=sys.stderr)
    base_name = next(iter(models))
    base = results[base_name]["per_page"]
    rows = {}
    for name, r in results.items():
        row = {"checkpoint": models[name], "engine_options": options[name], "weights_sha256": weights_digest(Path(models[name])), "cer": round(r["model_text"]["cer"], 5), "wer": round(r["model_text"]["wer"], 5),
               "ref_chars": r["model_text"]["ref_chars"], "pages": r["model_text"]["pages"],
               "block_images_read": r.get("block_images_read"), "wall_s": seconds[name],
               "read_from": read_from[name]}
        if Path(read_from[name]).resolve() != Path(models[name]).resolve() and Path(read_from[name]).is_dir():
            row["read_from_sha256"] = weights_digest(Path(read_from[name]))  # the same bytes, read before a copy
        if name != base_name:
            row["vs_" + base_name] = paired(base, r["per_page"])
            moved = sum(levenshtein(a["model_output"], b["model_output"]) for a, b in zip(base, r["per_page"]))
            row["output_cer_vs_" + base_name] = round(moved / max(1, sum(len(b["model_output"]) for b in base)), 5)
            kind = None if options[name] else (  # the weight-precision targets are a checkpoint's
                "fp8" if "fp8" in name and "nvfp4" not in name else "nvfp4" if "nvfp4" in name else None)
            if kind:
                row["target_points"] = TARGET_POINTS[kind]
                row["within_target"] = row["vs_" + base_name]["cer_diff_points"] <= TARGET_POINTS[kind]
        rows[name] = row
    out = {"pages": f"held-out synthetic pages {args.heldout_from}-{args.heldout_from + args.heldout - 1}",
           "note": args.note, "pool": results[base_name].get("pool"), "eval": f"{EVAL_MODULE} {EVAL_CONFIG}", "eval_flags": eval_flags(args.device, args.dtype), "models": rows,
           "per_page": {name: [{"page": p["page"], "cer": p["model_text"]["cer"], "ref_chars": p["model_text"]["ref_chars"]}
                               for p in r["per_page"]] for name, r in results.items()}}
    harness.write_result(args.out, out, harness.result_meta(
        __file__, f"{' vs '.join(models)} on held-out synthetic pages {args.heldout_from}-"
        f"{args.heldout_from + args.heldout - 1} (CPU fp32, one read per 8-line block): CER of each, the difference to "
        f"{base_name} with a paired bootstrap interval, pages read identically", argv, "cpu"))
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
