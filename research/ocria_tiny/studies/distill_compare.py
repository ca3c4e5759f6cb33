"""Which drafter recipe carries better to answers it has not seen: training partly on the target's own distribution
(jobs/train_drafter.py --distill), and the DFlash2 architecture (--dflash2) against DFlash? One collection of the
target's answers (with its top-k soft labels), then one drafter per (--arch, --distill) pair, each on the same
answers, the same answers kept out: validation loss (greedy labels) and the tau estimate (engine/drafter_training.walk_tau
since it replaced the mean over random anchors; the results files say which) at each check.

    .venv/bin/python -m research.ocria_tiny.drafter_pages --synth .drafter/synth --split train --pages 50 --out PAGES
    .venv/bin/python -m research.ocria_tiny.studies.distill_compare --pages PAGES --out OUT.json [--distill 0 0.5]
        [--arch dflash dflash2]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from engine.drafter_training import collect
from engine.interface import DEFAULT_PROMPT
from engine.llm_engine import Engine
from engine.models.dflash import build_target_layer_ids
from pipeline.train_drafter import TrainDrafterConfig, load_pages, train


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", default="models/ocria-tiny")
    ap.add_argument("--distill", type=float, nargs="+", default=[0.0, 0.5])
    ap.add_argument("--arch", nargs="+", choices=["dflash", "dflash2"], default=["dflash"])
    ap.add_argument("--seed", type=int, default=0, help="training's seed (initialisation, anchors, page order)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--val-pages", type=int, default=24)
    ap.add_argument("--val-every", type=int, default=50)
    ap.add_argument("--collect-batch", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args(argv)
    base = dict(checkpoint=args.checkpoint, pages=args.pages, collect_batch=args.collect_batch, num_layers=4,
                intermediate_size=1024, num_taps=4, block_size=16, gamma=7, anchors=64, pages_per_step=4, lr=2e-3,
                steps=args.steps, val_pages=args.val_pages, val_every=args.val_every, max_tokens=args.max_tokens,
                save_dtype="float32", distill_top_k=16, seed=args.seed)
    target = Engine.from_checkpoint(args.checkpoint, max_num_seqs=args.collect_batch)
    layers = build_target_layer_ids(target.cfg.text.num_hidden_layers, base["num_taps"])
    t0 = time.perf_counter()
    examples = collect(target, load_pages(args.pages), layers, DEFAULT_PROMPT, base["max_tokens"],
                       soft_top_k=base["distill_top_k"])
    result = {"command": "python -m research.ocria_tiny.studies.distill_compare " + " ".join(argv or []),
              "answers": len(examples), "answer_tokens": sum(len(e.ids) - e.prompt_len for e in examples),
              "collect_s": round(time.perf_counter() - t0, 1), "config": base, "runs": []}
    print(f"collected {result['answers']} answers ({result['answer_tokens']} tokens) in {result['collect_s']} s")
    for arch, d in [(a, d) for a in args.arch for d in args.distill]:
        cfg = TrainDrafterConfig(**base, out=str(Path(args.out).with_suffix("") / f"{arch}_distill_{d}"), distill=d,
                                 dflash2=arch == "dflash2")
        log = train(cfg, echo=lambda *_: None, collected=examples)
        best = min(log["val_losses"], key=lambda x: x[1])
        tau = dict(log["val_tau_estimate"])
        result["runs"].append({"arch": arch, "distill": d, "train_seconds": log["train_seconds"], "val_losses": log["val_losses"],
                               "val_tau_estimate": log["val_tau_estimate"], "best_step": best[0],
                               "best_val_loss": best[1], "tau_estimate_at_best": tau[best[0]],
                               "best_tau_estimate": max(tau.values())})
        print(json.dumps(result["runs"][-1]))
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
