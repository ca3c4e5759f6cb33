"""Which kinds of text carry ocria-tiny's character errors on held-out pages: the saved answers of eval_ocr results,
aligned character by character with their references, each edit charged to the kind of reference text it falls in.

    .venv/bin/python bench/ocria_tiny_errors_by_block.py \
        --eval bench/results/ocria_tiny_s27_eval_native_ban64_c3_48_1536.json:0 \
        --eval bench/results/ocria_tiny_s27_eval_native_ban64_c3_pages48-95_1536.json:48 --out ...

Kinds of reference text: the kind of its line (jobs.eval_ocr.markdown_line_kinds: code, table, heading, list, and
paragraph, here "words"), except that words in paragraph and list lines that hold '_' or '\\', two slashes, or a
slash and a later dot are `paths` (the file lists and identifiers of licence files; "and/or" stays a word). The
alignment is one optimal edit script (ties broken towards substitution, then deletion); an insertion is charged to
the reference character before it. Each page's charged edits must add up to its edit distance (checked), so the
kinds' edits sum to the eval's pooled CER. Beside them, the share of reference characters in markdown lines (a
paragraph, a list item, a table row) that some answer line reads closely, or none does
(bench/ocria_tiny_error_profile.py's line match, which ignores order): lines read closely but in another order would
show as read; many lines misread mean the errors are reading, not the order of the columns.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobs.eval_ocr import (collapse_ws, edit_distance_rows, heldout_pages, levenshtein,  # noqa: E402
                           markdown_line_kinds, markdown_to_text)
from ocria_tiny_error_profile import LINE_MISSED_CER, LINE_READ_CER, line_profile  # noqa: E402

KINDS = ("words", "paths", "list", "heading", "table", "code")
_PATHY = re.compile(r"[_\\]|/.*/|/[^/]*\.")  # an identifier, or a path: two slashes, or one and a dot


def line_kinds(md: str) -> list[tuple[str, str]]:
    """(kind, text) for every line of a page's markdown with text, as markdown_to_text gives it for that line;
    paragraph lines are "words"."""
    out = []
    for line, kind in zip(md.split("\n"), markdown_line_kinds(md)):
        text = markdown_to_text(line)
        if text:
            out.append(("words" if kind == "paragraph" else kind, text))
    return out


def ref_char_kinds(lines: list[tuple[str, str]]) -> list[str]:
    """The kind of each character of the lines' texts joined by spaces: its line's, except that in words and list
    lines a word that looks like a file path or an identifier (_PATHY) is "paths"; a space goes with the character
    before it."""
    out: list[str] = []
    for n, (kind, text) in enumerate(lines):
        if n:
            out.append(out[-1])
        for m, word in enumerate(text.split(" ")):
            if m:
                out.append(out[-1])
            out += [("paths" if kind in ("words", "list") and _PATHY.search(word) else kind)] * len(word)
    return out


def edits_per_ref_char(hyp: str, ref: str) -> np.ndarray:
    """edits[i]: the edits one optimal alignment charges to ref[i] (its substitution or deletion, and insertions
    after it; insertions before ref[0] go to ref[0])."""
    n, m = len(ref), len(hyp)
    d = np.stack(list(edit_distance_rows(ref, hyp)))  # d[i, k]: distance of ref[:i] to hyp[:k]
    edits = np.zeros(max(n, 1), dtype=np.int64)
    i, k = n, m
    while i > 0 or k > 0:
        if i > 0 and k > 0 and d[i, k] == d[i - 1, k - 1] + (hyp[k - 1] != ref[i - 1]):
            edits[i - 1] += int(hyp[k - 1] != ref[i - 1])
            i, k = i - 1, k - 1
        elif i > 0 and d[i, k] == d[i - 1, k] + 1:
            edits[i - 1] += 1
            i -= 1
        else:  # insertion of hyp[k - 1] after ref[i - 1]
            edits[max(i - 1, 0)] += 1
            k -= 1
    return edits


def page_by_kind(hyp_md: str, ref_md: str) -> dict[str, list[int]]:
    """{kind: [reference characters, edits charged]} for one page."""
    lines = line_kinds(ref_md)
    ref = " ".join(text for _, text in lines)
    assert ref == collapse_ws(markdown_to_text(ref_md)), "line split does not rebuild the page's reference text"
    hyp = markdown_to_text(hyp_md)
    edits = edits_per_ref_char(hyp, ref)
    assert int(edits.sum()) == levenshtein(hyp, ref), "charged edits differ from the edit distance"
    out = {k: [0, 0] for k in KINDS}
    if not ref:  # nothing to charge an answer to on an empty page: its insertions count as words
        out["words"][1] = len(hyp)
        return out
    for kind, e in zip(ref_char_kinds(lines), edits.tolist()):
        out[kind][0] += 1
        out[kind][1] += e
    return out


def pool_path_share(pool_path: Path) -> float:
    """Share of a text pool's prose characters (words, spaces left out) in words that look like paths (_PATHY)."""
    from pipeline.synthetic import TextPool

    chars = path_chars = 0
    for paragraph in TextPool.from_json_gz(pool_path).prose:
        for word in paragraph.split():
            chars += len(word)
            path_chars += len(word) if _PATHY.search(word) else 0
    return round(path_chars / max(1, chars), 4)


def kind_table(pages: list[dict]) -> dict:
    """Pooled characters, edits, CER and shares per kind over per-page `by_kind` records."""
    sums = {k: [0, 0] for k in KINDS}
    for page in pages:
        for k, (chars, edits) in page["by_kind"].items():
            sums[k][0] += chars
            sums[k][1] += edits
    chars_all, edits_all = sum(c for c, _ in sums.values()), sum(e for _, e in sums.values())
    kinds = {k: {"ref_chars": c, "edits": e, "cer": round(e / c, 4) if c else None,
                 "share_of_chars": round(c / chars_all, 4), "share_of_edits": round(e / max(1, edits_all), 4)}
             for k, (c, e) in sums.items()}
    # where the reference's lines went (ocria_tiny_error_profile.line_profile, order-free): misread lines, or lines
    # read right in another order, or never written
    lines = {key: round(sum(p["lines"][key] * sum(c for c, _ in p["by_kind"].values()) for p in pages) / chars_all, 4)
             for key in ("chars_in_lines_read", "chars_in_lines_missed")}
    return {"pages": len(pages), "ref_chars": chars_all, "edits": edits_all, "cer": round(edits_all / chars_all, 4),
            "by_kind": kinds, "lines": lines}


def print_table(title: str, table: dict) -> None:
    print(f"{title}: {table['pages']} pages, CER {table['cer']:.4f}; characters in reference lines read (line CER <= "
          f"{LINE_READ_CER}) {table['lines']['chars_in_lines_read']:.3f}, missed (> {LINE_MISSED_CER}) "
          f"{table['lines']['chars_in_lines_missed']:.3f}")
    print(f"  {'kind':<8} {'chars':>7} {'share':>6} {'edits':>6} {'share':>6} {'CER':>6}")
    for k, v in table["by_kind"].items():
        cer = f"{v['cer']:.3f}" if v["cer"] is not None else "-"
        print(f"  {k:<8} {v['ref_chars']:>7} {v['share_of_chars']:>6.3f} {v['edits']:>6} {v['share_of_edits']:>6.3f} "
              f"{cer:>6}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eval", action="append", required=True,
                    help="RESULT.json:FIRST, an eval_ocr result and its --heldout-from; repeat to pool")
    ap.add_argument("--config", type=Path, default=Path("bench/results/ocria_tiny_eval_full_pages_1536_config.yaml"))
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from jobs.train_tiny import load_config

    cfg = load_config(args.config, [])
    pages, left_out = [], []
    for spec in args.eval:
        path, first = spec.rsplit(":", 1)
        saved = json.loads(Path(path).read_text())["heldout_synthetic"]["per_page"]
        refs = {p.name: p for p in heldout_pages(len(saved), cfg, args.synth, first=int(first))}
        for rec in saved:
            page = refs[rec["page"]]
            if len(page.reference_text) != rec["model_text"]["ref_chars"]:
                # drawn otherwise where the answer was scored (another PyMuPDF lays out another amount of text):
                # aligning the answer with this page would charge it edits it did not make
                left_out.append({"page": rec["page"], "ref_chars_scored": rec["model_text"]["ref_chars"],
                                 "ref_chars_here": len(page.reference_text)})
                continue
            kinds = page_by_kind(rec["model_output"], page.reference_md)
            profile = line_profile(rec["model_output"], page.reference_md)
            pages.append({"page": rec["page"], "columns": page.columns,
                          "by_kind": {k: v for k, v in kinds.items() if v[0]},
                          "lines": {k: profile[k] for k in ("chars_in_lines_read", "chars_in_lines_missed")}})
    if left_out:
        print(f"left out {len(left_out)} page(s) whose reference here differs from the one scored: {left_out}")
    out = {"all": kind_table(pages), "pages_left_out": left_out}
    print_table("all pages", out["all"])
    for columns in sorted({p["columns"] for p in pages}):
        out[f"columns_{columns}"] = kind_table([p for p in pages if p["columns"] == columns])
        print_table(f"{columns} column(s)", out[f"columns_{columns}"])
    pools = {name: pool_path_share(args.synth / f"pool_{name}.json.gz") for name in ("train", "heldout")}
    print(f"path characters in the prose pools: training {pools['train']:.3f}, held-out {pools['heldout']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "evals": args.eval, **out,
                                    "pool_path_share": pools, "per_page": pages}, indent=1))


if __name__ == "__main__":
    main()
