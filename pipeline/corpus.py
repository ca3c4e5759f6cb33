"""A page-shaped corpus made on the spot, for benchmarks of the whole job (pipeline/report.py, bench/scale_out.py):
US-letter PDFs of dense deterministic text, written by PyMuPDF alone, so no corpus has to be shipped or fetched."""
from __future__ import annotations

import random
from pathlib import Path

# US letter in points
LETTER = (612.0, 792.0)

_SYLLABLES = ("ka", "lo", "mi", "ren", "sta", "vo", "den", "qua", "tri", "mon", "pel", "sar", "ul", "bri", "cor", "fen")


def _paragraph(rng: random.Random, words: int) -> str:
    out = []
    for _ in range(words):
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
        out.append(str(rng.randint(10, 9999)) if rng.random() < 0.06 else w)
    return " ".join(out).capitalize() + "."


def make_corpus(folder: Path, n_docs: int, pages_per_doc: int, seed: int = 0, total_pages: int | None = None,
                paragraphs: int = 7) -> list[Path]:
    """n_docs US-letter PDFs of pages_per_doc pages each (the last one shorter where total_pages, the corpus's pages,
    asks for fewer): a heading and `paragraphs` dense paragraphs of deterministic text (7: ~450 words a page, like a
    report page). Same arguments -> same files."""
    import pymupdf

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    left = n_docs * pages_per_doc if total_pages is None else total_pages
    for d in range(n_docs):
        rng = random.Random(seed * 1_000_003 + d)
        doc = pymupdf.open()
        for p in range(min(pages_per_doc, left)):
            page = doc.new_page(width=LETTER[0], height=LETTER[1])
            page.insert_text((72, 80), f"Report {d:05d} - section {p + 1}", fontsize=16)
            body = "\n\n".join(_paragraph(rng, rng.randint(50, 90)) for _ in range(paragraphs))
            page.insert_textbox(pymupdf.Rect(72, 100, LETTER[0] - 72, LETTER[1] - 60), body, fontsize=9.5)
        left -= doc.page_count
        path = folder / f"doc{d:05d}.pdf"
        doc.save(path)
        doc.close()
        paths.append(path)
    return paths
