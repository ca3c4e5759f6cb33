"""How many characters one merged image token must hold on ocria-tiny's line pages: per page, the merged token grid
(rows x columns) against the answer's length in tokens and in characters, and how often the line CTC loss
(jobs/train_tiny.LineCTC: `ctc_subframes` frames per column, one character each) cannot align at all (fewer frames than
characters plus repeats).

    python bench/ocria_tiny_line_density.py --font-px 22,32 --out bench/results/ocria_tiny_line_density.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.text_line_ctc import ctc_min_frames
from jobs.train_tiny import PromptBuilder, answer_chars, load_config, page_stream


@click.command()
@click.option("--font-px", default="22,32", show_default=True)
@click.option("--canvas-px", default=None, type=int, help="curriculum canvas_px (default: the page size)")
@click.option("--pages", default=200, show_default=True)
@click.option("--model-dir", default=str(ROOT / "models" / "ocria-tiny"), show_default=True)
@click.option("--synth", default=str(ROOT / ".synth"), show_default=True)
@click.option("--out", default=None)
def main(font_px: str, canvas_px: int | None, pages: int, model_dir: str, synth: str, out: str | None) -> None:
    canvas = f", canvas_px: {canvas_px}" if canvas_px else ""
    lines = (f"data.curriculum=[{{until_page: 100000000, font_px: [{font_px}], max_chars: [8, 40], crop: true, "
             f"strict_chars: true{canvas}}}]")
    cfg = load_config(ROOT / "configs" / "train_tiny.yaml", [lines])
    merge = cfg["model"]["vision"]["spatial_merge_size"]
    subframes = cfg["train"]["ctc_subframes"]
    stream = iter(page_stream(cfg, Path(synth), Path(model_dir), 0))
    tok = PromptBuilder(Path(model_dir), cfg["prompt"]).tok
    rows = []
    for _ in range(pages):
        item = next(stream)
        grid = item["grid"]
        answer = item["labels"][item["labels"] != -100][:-1].tolist()  # without <|im_end|>
        chars = answer_chars(tok, answer)
        rows.append((int(grid[1]) // merge, int(grid[2]) // merge, len(answer), len(chars), ctc_min_frames(chars)))
    a = np.array(rows)
    line = a[:, 0] <= cfg["train"].get("ctc_max_rows", 3)
    result = {
        "font_px": font_px, "canvas_px": canvas_px, "pages": pages,
        "token_rows_p5_p50_p95": np.percentile(a[:, 0], [5, 50, 95]).tolist(),
        "token_columns_p5_p50_p95": np.percentile(a[:, 1], [5, 50, 95]).tolist(),
        "answer_tokens_p5_p50_p95": np.percentile(a[:, 2], [5, 50, 95]).tolist(),
        "answer_chars_p5_p50_p95": np.percentile(a[:, 3], [5, 50, 95]).tolist(),
        "median_columns_per_answer_token": float(np.median(a[:, 1] / np.maximum(a[:, 2], 1))),
        "median_chars_per_column": float(np.median(a[:, 3] / a[:, 1])),
        "ctc_subframes": subframes,
        "share_ctc_line_pages": float(line.mean()),
        "share_of_ctc_line_pages_ctc_cannot_align": float((a[line, 1] * subframes < a[line, 4]).mean()),
        "command": "python bench/ocria_tiny_line_density.py " + " ".join(sys.argv[1:]),
    }
    print(json.dumps(result, indent=1))
    if out:
        Path(out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
