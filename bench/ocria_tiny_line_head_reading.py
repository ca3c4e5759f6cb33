"""Does ocria-tiny's vision tower read better than its decoder writes? The text-line CTC head (jobs/text_line_ctc.py,
trained beside the model, not shipped) reads each text line of the held-out full pages straight from the merged
image tokens, placed by the page's text layer; the decoder's CER on the same pages comes from a jobs.eval_ocr output
of the same checkpoint. A head reading far better than the decoder says the image features hold the glyphs and the
decoder loses them.

  .venv/bin/python bench/ocria_tiny_line_head_reading.py --model build/cand_s17_c3 \
      --head build/s17/call3/run/ckpt/text_line_ctc_head.pt --heldout 24 \
      --config bench/results/ocria_tiny_eval_full_pages_1536_config.yaml \
      --decoder-eval bench/results/ocria_tiny_s17_eval_1536.json --out bench/results/ocria_tiny_s17_line_head_reading.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from jobs.eval_ocr import HFPageReader, heldout_pages
    from jobs.text_line_ctc import CTC_CLASSES, GEOM_CHARS, GEOM_COLS, GEOM_MIN_FRAMES, LINE_BUCKETS, TextLineCTC
    from jobs.train_tiny import encode_page, encoded_batch, load_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--head", type=Path, required=True, help="text_line_ctc_head.pt of the same checkpoint")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--heldout", type=int, default=24)
    ap.add_argument("--decoder-eval", type=Path, required=True, help="jobs.eval_ocr output of the same checkpoint")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    cfg = load_config(args.config, [])
    cfg["train"]["text_line_ctc_weight"] = 1.0  # the pages then carry their text lines (synth_config); same images
    decoder = {r["page"]: r["model_text"] for r in json.loads(args.decoder_eval.read_text())["heldout_synthetic"]["per_page"]}
    reader = HFPageReader(args.model)
    saved = torch.load(args.head, map_location="cpu")
    head = TextLineCTC(reader.model, 1.0, saved["weight"].shape[0] // (LINE_BUCKETS * CTC_CLASSES))  # its subframes
    head.head.load_state_dict(saved)
    rows = []
    for p in heldout_pages(args.heldout, cfg, args.synth):
        item = encode_page(p.image, p.reference_md, reader.processor, reader.builder, reader.merge,
                           cfg["data"]["max_answer_tokens"], p.lines)
        batch = encoded_batch([item], reader.builder, reader.processor)
        geom = batch["line_geom"]
        kept = geom[:, GEOM_COLS] * head.subframes >= geom[:, GEOM_MIN_FRAMES]
        kept_chars = int(geom[kept, GEOM_CHARS].sum())
        cer = head.reading_cer(reader.model, batch, reader.merge)
        rows.append({"page": p.name, "lines": len(geom), "line_chars": int(geom[:, GEOM_CHARS].sum()),
                     "line_chars_read_by_head": kept_chars, "head_cer": None if cer is None else round(cer, 4),
                     "decoder_cer": round(decoder[p.name]["cer"], 4), "ref_chars": decoder[p.name]["ref_chars"]})
        print(json.dumps(rows[-1]), flush=True)
    read = [r for r in rows if r["head_cer"] is not None]
    out = {"command": "python bench/ocria_tiny_line_head_reading.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "summary": {
               "pages": len(rows),
               "head_cer": round(sum(r["head_cer"] * r["line_chars_read_by_head"] for r in read)
                                 / sum(r["line_chars_read_by_head"] for r in read), 4),
               "share_of_line_chars_the_head_reads": round(sum(r["line_chars_read_by_head"] for r in rows)
                                                           / sum(r["line_chars"] for r in rows), 4),
               "decoder_cer": round(sum(r["decoder_cer"] * r["ref_chars"] for r in rows)
                                    / sum(r["ref_chars"] for r in rows), 4)},
           "per_page": rows}
    print(json.dumps(out["summary"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
