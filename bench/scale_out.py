"""Issue #5: the parse job on 1 GPU, then on every GPU of the host, in one command; throughput scaling measured.

    python3 bench/scale_out.py --out $OUT --work /tmp/so --pages 900 --budget-s 500  # GPU host: 4B shape, random weights
    python bench/scale_out.py --tiny --device cpu --out /tmp/so            # CPU smoke: tiny model, 1 vs 2 engines

Steps: (1) a random-weight checkpoint in the real HF format (engine.testing.write_random_checkpoint): the Qwen3.5-4B
shape in bf16, its processor's max_pixels set so a US-letter page is ~1,300 image tokens; (2) a local corpus of
multi-page PDFs of deterministic text (PyMuPDF only, no text pools needed); (3) the real job (pipeline.job, the code
path of jobs/parse_corpus.py) once with 1 engine actor and once with one per GPU, each into its own output folder,
every page generating exactly --gen-tokens tokens (model.options.ignore_eos); (4) each run's stats (pipeline/stats.py)
-> <out>/scale_out.json and a short table.

Weak scaling: the run on n GPUs parses n x --pages pages, so every run keeps its GPUs busy about as long. With
--budget-s the all-GPU run is shrunk, from the 1-GPU run's measured rates, to what still fits (the JSON says so).
Scaling efficiency = steady pages/s on n GPUs / (n x steady pages/s on 1 GPU); steady = after the warm-up (every
engine has started, loaded the model, captured its graphs and returned a first batch).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness
from bench.gpu_sampler import GpuSampler
from pipeline.corpus import make_corpus

# A US-letter page (pipeline.corpus): at 1312 px on the long side the processor (32 px per merged token) makes it
# 41 x 32 tokens.
PAGE_LONGEST_PX = 1312
GPU_MAX_PIXELS = PAGE_LONGEST_PX * PAGE_LONGEST_PX
TINY_LONGEST_PX, TINY_MAX_PIXELS = 256, 256 * 256


# ------------------------------------------------------------------------------------------------ checkpoint

def build_checkpoint(out: Path, tiny: bool, seed: int = 0) -> Path:
    from engine.testing import write_random_checkpoint
    from bench.engine_bench import REAL_TEXT, REAL_VISION, TINY_TEXT, TINY_VISION

    if tiny:  # vocab past the tokenizer's, as in the 4B shape: ids with no token decode to nothing
        return write_random_checkpoint(out, dict(TINY_TEXT, vocab_size=2048), TINY_VISION, min_pixels=32 * 32,
                                       max_pixels=TINY_MAX_PIXELS, seed=seed, shard_bytes=200_000)
    return write_random_checkpoint(out, REAL_TEXT, REAL_VISION, min_pixels=32 * 32, max_pixels=GPU_MAX_PIXELS,
                                   seed=seed, note="random weights, Qwen3.5-4B shape (bench/scale_out.py)")


# ------------------------------------------------------------------------------------------------ runs

def job_config(args, checkpoint: Path, corpus: Path, output: Path, engines: int, n_docs: int):
    from pipeline.config import load_config

    cpu = args.device == "cpu"
    overrides = {
        "input": {"uris": [str(corpus)], "limit": n_docs},
        "output": str(output),
        "model": {"backend": "native", "checkpoint": str(checkpoint), "device": args.device,
                  "dtype": "auto" if cpu else "bfloat16", "max_tokens": args.gen_tokens,
                  "options": {"ignore_eos": True, "max_num_seqs": args.batch_size}},
        "raster": {"target_longest_px": TINY_LONGEST_PX if args.tiny else PAGE_LONGEST_PX},
        "parse": {"num_actors": engines, "batch_size": args.batch_size,
                  # 2 cores: fractional requests that leave room for a rasterizer and Ray Data's own tasks
                  **({"cpus_per_actor": 0.25} if cpu else {})},
        "run": {"commit_every_docs": args.commit_every, **({"num_cpus": args.num_cpus} if args.num_cpus else {})},
    }
    return load_config(None, overrides)


def run_one(args, checkpoint: Path, corpus: Path, engines: int, n_docs: int, sampler: GpuSampler,
            echo=print) -> dict:
    from pipeline.job import prepare, run

    output = Path(args.work or args.out) / f"run-{engines}"
    cfg = job_config(args, checkpoint, corpus, output, engines, n_docs)
    t0 = time.perf_counter()
    summary = run(prepare(cfg), echo=echo)
    summary["command_s"] = time.perf_counter() - t0  # incl. Ray start and stop, which the job's wall_s leaves out
    summary["output"] = str(output)
    start = summary["stream_started_unix"]  # GPU load in use, from nvidia-smi: after the warm-up and overall
    summary["gpu_util_steady_pct"] = sampler.mean_utilization(start + summary["warmup_s"], start + summary["wall_s"])
    summary["gpu_util_pct"] = sampler.mean_utilization(start, start + summary["wall_s"])
    return summary


def scaling_rows(runs: list[dict]) -> list[dict]:
    """Per run: GPUs (engines on CPU), pages/s overall and steady, per GPU, efficiency vs the 1-engine run."""
    base = next(r for r in runs if r["engine_actors"] == 1)
    rows = []
    for r in runs:
        n = r["engine_actors"]
        rows.append({
            "engines": n, "gpus": r["gpus"], "pages": r["pages"], "documents": r["documents"],
            "pages_per_s": r["pages_per_s"], "steady_pages_per_s": r["steady_pages_per_s"],
            "steady_pages_per_s_per_engine": r["steady_pages_per_s"] / n,
            # a run too short for a steady phase has none (0): its efficiency is not defined
            "scaling_efficiency": (r["steady_pages_per_s"] / (n * base["steady_pages_per_s"])
                                   if base["steady_pages_per_s"] else float("nan")),
            "scaling_efficiency_overall": r["pages_per_s"] / (n * base["pages_per_s"]),
            "output_tokens_per_s": r["output_tokens_per_s"],
            "engine_busy_fraction": r["engine_busy_fraction"], "gpu_idle_fraction": 1 - r["engine_busy_fraction"],
            "raster_busy_fraction": r["raster_busy_fraction"], "raster_actors": r["raster_actors"],
            "wall_s": r["wall_s"], "warmup_s": r["warmup_s"], "first_result_s": r["first_result_s"],
            "command_s": r["command_s"],
            "gpu_util_steady_pct": _mean(r.get("gpu_util_steady_pct")),
        })
    return rows


def _mean(per_gpu: dict | None) -> float | None:
    return sum(per_gpu.values()) / len(per_gpu) if per_gpu else None


def format_rows(rows: list[dict], unit: str) -> str:
    head = (f"{unit:>5} {'pages':>6} {'pages/s':>8} {'steady':>8} {'/' + unit:>8} {'effic.':>7} {'busy':>6} "
            f"{'idle':>6} {'raster':>7} {'wall s':>7} {'warmup s':>9} {'GPU %':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['engines']:>5} {r['pages']:>6} {r['pages_per_s']:>8.2f} {r['steady_pages_per_s']:>8.2f} "
                     f"{r['steady_pages_per_s_per_engine']:>8.2f} {r['scaling_efficiency']:>7.2f} "
                     f"{r['engine_busy_fraction']:>6.2f} {r['gpu_idle_fraction']:>6.2f} "
                     f"{r['raster_busy_fraction']:>7.2f} {r['wall_s']:>7.1f} {r['warmup_s']:>9.1f} "
                     f"{'-' if r['gpu_util_steady_pct'] is None else format(r['gpu_util_steady_pct'], '.0f'):>6}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for scale_out.json")
    ap.add_argument("--work", help="folder for the checkpoint, corpus and run outputs (default: --out; the 4B "
                                   "checkpoint is 9 GB, so on the device machine keep it out of $OUT)")
    ap.add_argument("--tiny", action="store_true", help="tiny random model and small pages (CPU smoke)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--engines", type=int, default=None,
                    help="engines of the second run (default: every GPU; 2 on CPU)")
    ap.add_argument("--pages", type=int, default=None, help="pages per GPU (engine) in each run (default 900, tiny 8)")
    ap.add_argument("--pages-per-doc", type=int, default=None, help="default 8, tiny 2")
    ap.add_argument("--gen-tokens", type=int, default=None, help="output tokens per page (default 750, tiny 8)")
    ap.add_argument("--batch-size", type=int, default=None, help="pages per engine call (default 64, tiny 4)")
    ap.add_argument("--commit-every", type=int, default=64, help="documents per committed output part")
    ap.add_argument("--num-cpus", type=float, default=None, help="CPUs of the local Ray (default: all; tiny: 2)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="seconds this command may take in all: the all-GPU run is shrunk to fit, from the 1-GPU "
                         "run's measured start-up and rate")
    ap.add_argument("--checkpoint", help="use this checkpoint folder instead of building one")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    tiny = args.tiny
    args.pages = args.pages or (8 if tiny else 900)
    args.pages_per_doc = args.pages_per_doc or (2 if tiny else 8)
    args.gen_tokens = args.gen_tokens or (8 if tiny else 750)
    args.batch_size = args.batch_size or (4 if tiny else 64)
    if args.device == "cpu" and not args.num_cpus:
        args.num_cpus = 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out, work = Path(args.out), Path(args.work or args.out)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)

    if args.engines is None:
        if args.device == "cuda":
            import torch

            args.engines = torch.cuda.device_count()
            if args.engines < 1:
                sys.exit("no CUDA GPU visible: use --device cpu (with --tiny) for the CPU smoke")
        else:
            args.engines = 2
    timings = {}
    t = time.perf_counter()
    checkpoint = Path(args.checkpoint) if args.checkpoint else build_checkpoint(work / "checkpoint", tiny)
    timings["checkpoint_s"] = time.perf_counter() - t
    t = time.perf_counter()
    docs_per_engine = math.ceil(args.pages / args.pages_per_doc)
    corpus = work / "corpus"
    make_corpus(corpus, docs_per_engine * args.engines, args.pages_per_doc)
    timings["corpus_s"] = time.perf_counter() - t
    print(f"checkpoint {checkpoint} ({timings['checkpoint_s']:.1f} s); corpus {docs_per_engine * args.engines} docs x "
          f"{args.pages_per_doc} pages ({timings['corpus_s']:.1f} s)", flush=True)

    result = {"args": vars(args), "timings": timings, "runs": [], "scaling": []}
    json_path = out / "scale_out.json"
    unit = "GPU" if args.device == "cuda" else "engine"
    # the driver opens no CUDA context (the engines' processes own the GPUs): the device key is the run's own note
    results = harness.ResultFile(json_path, harness.result_meta(
        __file__, f"the parse job (local Ray, PyMuPDF, one engine actor per {unit}) on 1 then {args.engines} "
        f"{unit}s, {args.pages} generated pages per {unit}, {'tiny' if tiny else '4B'} shape, random weights, "
        f"{args.gen_tokens} tokens a page: pages/s and scaling efficiency", argv, _device_note(args.device)))
    plan = [(1, docs_per_engine)] + ([(args.engines, docs_per_engine * args.engines)] if args.engines > 1 else [])
    sampler = GpuSampler(out / "gpu_samples.csv").start()
    try:
        for engines, n_docs in plan:
            if engines > 1 and args.budget_s and result["runs"]:
                n_docs = _fit_budget(args, result["runs"][0], engines, n_docs, time.perf_counter() - t_start, result)
            print(f"--- run: {engines} engine(s), {n_docs} documents", flush=True)
            result["runs"].append(run_one(args, checkpoint, corpus, engines, n_docs, sampler))
            result["scaling"] = scaling_rows(result["runs"])
            results.write(result, indent=2, default=str)  # kept if a later run dies
    finally:
        sampler.stop()
    result["timings"]["total_s"] = time.perf_counter() - t_start
    results.write(result, indent=2, default=str)
    print(format_rows(result["scaling"], "GPUs" if args.device == "cuda" else "eng"))
    print(f"wrote {json_path}  (total {result['timings']['total_s']:.0f} s)")
    return result


def _fit_budget(args, first: dict, engines: int, n_docs: int, elapsed: float, result: dict) -> int:
    """Documents of the n-engine run that fit in what is left of --budget-s, from the 1-engine run's start-up
    (command time not spent in steady streaming) and steady rate, assuming perfect scaling, with 15% to spare."""
    startup = first["command_s"] - (first["pages"] - first["warmup_pages"]) / max(first["steady_pages_per_s"], 1e-9)
    left = args.budget_s - elapsed - startup
    fit = int(max(left, 0) * 0.85 * engines * first["steady_pages_per_s"] / args.pages_per_doc)
    fit = max(engines, min(n_docs, fit))
    if fit < n_docs:
        result["budget_note"] = (f"--budget-s {args.budget_s:g}: the {engines}-engine run was shrunk from {n_docs} to "
                                 f"{fit} documents (start-up {startup:.0f} s, {left:.0f} s left)")
        print(result["budget_note"], flush=True)
    return fit


def _device_note(device: str) -> dict:
    note = {"device": device, "cpu_count": os.cpu_count(),
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")}
    if device == "cuda":
        import torch

        note.update(gpus=torch.cuda.device_count(), torch=torch.__version__)  # no CUDA context in the driver
    return note


if __name__ == "__main__":
    main()
