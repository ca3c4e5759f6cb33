"""Two models read the same held-out pages: their pooled CERs, page by page, and how sure the difference is.

Each side is one or more `research.ocria_tiny.eval_ocr` outputs (their `heldout_synthetic.per_page`), e.g. the two halves of pages
96-191. The pooled CER sums the edits of all pages over their reference characters, so a few pages that run on or
fall apart decide much of it: the report gives the median page, the pages that moved most and the pages that ran on
beside it, and a bootstrap over pages (both models resampled together, pages drawn with replacement) for the
difference's interval.

  python research/ocria_tiny/studies/paired_cer.py \\
      --a research/ocria_tiny/results/s28_eval_native_ban64_c3_pages{96-143,144-191}_1536.json \\
      --b research/ocria_tiny/results/s31_eval_native_ban64_c3_pages{96-143,144-191}_1536.json \\
      --out research/ocria_tiny/results/s31_paired_c3_pages96-191.json

`--pages FIRST LAST` takes one range of files that hold more (session 32 read pages 0-191 in one file per model).
Pages whose references differ between the sides (another PyMuPDF drew another document) are left out and listed.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path


def read_pages(files: list[Path], pages: tuple[int, int] | None = None, section: str = "heldout_synthetic") -> list[dict]:
    """The held-out pages' rows of all `files` (or another section's, e.g. corpus), only held-out pages first..last
    (inclusive) when `pages` says so."""
    rows = [p for f in files for p in json.loads(f.read_text())[section]["per_page"]]
    if pages is None:
        return rows
    return [p for p in rows if pages[0] <= int(p["page"].rsplit("_", 1)[1]) <= pages[1]]


def page_errors(rows: list[dict]) -> dict[str, tuple[float, int]]:
    """page -> (edits, reference characters) of the plain-text CER."""
    return {p["page"]: (p["model_text"]["cer"] * p["model_text"]["ref_chars"], p["model_text"]["ref_chars"])
            for p in rows}


def run_on_pages(rows: list[dict], ratio: float = 1.25) -> dict:
    """Pages whose answer is over `ratio` times its reference markdown's length (a run into loops or into text the
    page does not hold), and their share of all the edits."""
    edits = {page: e for page, (e, _) in page_errors(rows).items()}
    long = sorted(p["page"] for p in rows if len(p["model_output"]) > ratio * p["model_md"]["ref_chars"])
    return {"ratio": ratio, "pages": long,
            "share_of_edits": round(sum(edits[p] for p in long) / max(1e-9, sum(edits.values())), 3)}


def pooled(errors: dict[str, tuple[float, int]], pages: list[str]) -> float:
    return sum(errors[p][0] for p in pages) / sum(errors[p][1] for p in pages)


def bootstrap_difference(a: dict, b: dict, pages: list[str], draws: int, seed: int) -> list[float]:
    """pooled(b) - pooled(a) on `draws` resamplings of the pages, sorted."""
    rng = random.Random(seed)
    diffs = []
    for _ in range(draws):
        sample = [pages[rng.randrange(len(pages))] for _ in pages]
        diffs.append(pooled(b, sample) - pooled(a, sample))
    return sorted(diffs)


def references_differ(a: list[dict], b: list[dict]) -> list[str]:
    """Pages both sides read whose references are not the same length: drawn by another PyMuPDF (1.26.7 on the H200,
    2.0 here), a few synthetic pages lay their text out otherwise and keep other text."""
    ref = {p["page"]: p["model_text"]["ref_chars"] for p in a}
    return sorted(p["page"] for p in b if p["page"] in ref and ref[p["page"]] != p["model_text"]["ref_chars"])


def compare(a: dict, b: dict, draws: int = 2000, seed: int = 0, moved: int = 4) -> dict:
    if set(a) != set(b):
        raise ValueError(f"the two sides read different pages: {sorted(set(a) ^ set(b))[:5]} ...")
    pages = sorted(a)
    cer = {side: {p: e[p][0] / e[p][1] for p in pages} for side, e in (("a", a), ("b", b))}
    diffs = bootstrap_difference(a, b, pages, draws, seed)
    change = sorted(pages, key=lambda p: cer["b"][p] - cer["a"][p])
    return {
        "pages": len(pages),
        "pooled": {"a": round(pooled(a, pages), 4), "b": round(pooled(b, pages), 4)},
        "difference_b_minus_a": round(pooled(b, pages) - pooled(a, pages), 4),
        "bootstrap_90pct": [round(diffs[int(0.05 * draws)], 4), round(diffs[int(0.95 * draws) - 1], 4)],
        "share_of_draws_b_better": round(sum(d < 0 for d in diffs) / draws, 3),
        "median_page": {"a": round(statistics.median(cer["a"].values()), 4),
                        "b": round(statistics.median(cer["b"].values()), 4)},
        "pages_b_better": sum(cer["b"][p] < cer["a"][p] for p in pages),
        "pages_b_worse": sum(cer["b"][p] > cer["a"][p] for p in pages),
        "largest_gains": [f"{p} {cer['a'][p]:.3f} -> {cer['b'][p]:.3f}" for p in change[:moved]],
        "largest_losses": [f"{p} {cer['a'][p]:.3f} -> {cer['b'][p]:.3f}" for p in change[::-1][:moved]],
        "bootstrap": {"draws": draws, "seed": seed},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, nargs="+", required=True, help="eval_ocr outputs of model A (the reference)")
    ap.add_argument("--b", type=Path, nargs="+", required=True, help="eval_ocr outputs of model B, the same pages")
    ap.add_argument("--pages", type=int, nargs=2, metavar=("FIRST", "LAST"),
                    help="only held-out pages FIRST..LAST of the files (e.g. one range of a 0-191 read)")
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    result = {"a": [str(f) for f in args.a], "b": [str(f) for f in args.b], "page_range": args.pages}
    rows = {"a": read_pages(args.a, args.pages), "b": read_pages(args.b, args.pages)}
    differ = references_differ(rows["a"], rows["b"])
    if differ:  # another PyMuPDF lays some pages out otherwise: those are other documents, not comparable
        rows = {side: [p for p in r if p["page"] not in differ] for side, r in rows.items()}
        result["left_out_references_differ"] = differ
    result |= compare(page_errors(rows["a"]), page_errors(rows["b"]), args.draws, args.seed)
    result["run_on"] = {side: run_on_pages(r) for side, r in rows.items()}
    text = json.dumps(result, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
