"""Screen spans for the engine's loop stop and loop drop (engine/loop_guard.py) on saved answers, without decoding
again.

    python bench/ocria_tiny_loop_stop_replay.py --eval build/s21/eval_native_greedy_c1.json \
        --model build/cand_s21_c1 --spans 16 24 32 48 64 --out build/s21/loop_replay_c1.json

For each held-out page of an eval_ocr result (its `model_output`), the answer is tokenized again, cut where the
guard would fire, and scored; the page's reference markdown goes through the same guard, so a span that would cut a
true page (a long table rule, a run of dots) shows up. Re-tokenized text can split differently from what the model
generated, so this is a screen: the engine run with --loop-stop-tokens is the measurement. The drop reads on after a
loop, so a saved answer is what the engine would have generated with it too: only the re-tokenizing differs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.loop_guard import LoopDrop, find_loop  # noqa: E402
from jobs.eval_ocr import Score, corpus_pages, heldout_pages, markdown_to_text  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eval", type=Path, required=True, help="an eval_ocr result with model_output per page")
    ap.add_argument("--model", type=Path, required=True, help="the model folder whose tokenizer wrote the answers")
    ap.add_argument("--config", type=Path, default=Path("bench/results/ocria_tiny_eval_full_pages_1536_config.yaml"))
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--spans", type=int, nargs="+", default=[16, 24, 32, 48, 64])
    ap.add_argument("--heldout-from", type=int, default=0, help="the eval's first held-out page (its --heldout-from)")
    ap.add_argument("--corpus", type=Path, default=None,
                    help="replay the eval's corpus pages instead, rendered again from this corpus folder")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from tokenizers import Tokenizer

    from jobs.train_tiny import load_config

    tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    result, cfg = json.loads(args.eval.read_text()), load_config(args.config, [])
    if args.corpus is not None:
        saved = result["corpus"]["per_page"]
        pages = corpus_pages(args.corpus, len(saved), cfg)
    else:
        saved = result["heldout_synthetic"]["per_page"]
        pages = heldout_pages(len(saved), cfg, args.synth, first=args.heldout_from)
    refs = {p.name: p for p in pages}
    summary = {}
    for span in [0] + args.spans:
        score, drop_score, cut_pages, dropped_pages, cut_refs = Score(), Score(), [], [], []
        for rec in saved:
            page = refs[rec["page"]]
            ids = tok.encode(rec["model_output"], add_special_tokens=False).ids
            keep = find_loop(ids, span) if span else None
            text = tok.decode(ids[:keep]) if keep is not None else rec["model_output"]
            res = score.add(markdown_to_text(text), page.reference_text)
            if keep is not None:
                cut_pages.append({"page": rec["page"], "tokens": len(ids), "kept": keep, "cer": round(res["cer"], 4)})
            drop = LoopDrop.over(ids, span) if span else None
            kept = drop.kept(ids) if drop else ids
            res = drop_score.add(markdown_to_text(tok.decode(kept)), page.reference_text)
            if len(kept) < len(ids):
                dropped_pages.append({"page": rec["page"], "tokens": len(ids), "kept": len(kept),
                                      "spans": drop.spans, "cer": round(res["cer"], 4)})
            ref_ids = tok.encode(page.reference_md, add_special_tokens=False).ids if page.reference_md else []
            if span and find_loop(ref_ids, span) is not None:
                cut_refs.append(rec["page"])
        summary[span] = {"cer": round(score.summary()["cer"], 4), "pages_cut": cut_pages, "references_cut": cut_refs,
                         "drop_cer": round(drop_score.summary()["cer"], 4), "pages_dropped_in": dropped_pages}
        print(f"span {span:>3}: stop CER {summary[span]['cer']:.4f} ({len(cut_pages)} answers cut), drop CER "
              f"{summary[span]['drop_cer']:.4f} ({len(dropped_pages)} answers), references a loop would cut "
              f"{len(cut_refs)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "eval": str(args.eval),
                                    "by_span": summary}, indent=1))


if __name__ == "__main__":
    main()
