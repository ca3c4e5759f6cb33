"""Write the sample corpus kept in samples/: a few PDFs and images, one of them deliberately broken.

    python jobs/make_samples.py --out samples

Deterministic (fixed text, no timestamps in the files), so regenerating changes nothing.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click
import pymupdf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.rasterize import render_page  # noqa: E402

REPORT = [
    ("# Quarterly Operations Report", [
        "The archive team digitised 12,480 pages in the third quarter, up 18% from the second quarter.",
        "Most of the growth came from the municipal records backlog, which is now 64% complete.",
        "## Highlights",
        "- Median turnaround fell from 9 days to 4 days.",
        "- Two scanners were replaced on 2026-07-14.",
        "- Error rate on spot checks: 0.7%.",
    ]),
    ("## Costs", [
        "Storage grew to 3.2 TB. Compute for parsing cost $412.50, or $33.05 per 1,000 pages.",
        "| Item | Q2 | Q3 |",
        "| --- | --- | --- |",
        "| Pages | 10,576 | 12,480 |",
        "| Hours | 310 | 298 |",
        "| Cost | $390.00 | $412.50 |",
        "Next quarter we expect 15,000 pages.",
    ]),
]

LETTER = ("Dear Ms. Alvarez,\n\nThank you for your order no. 4471-B of March 3. The shipment of 40 boxes left our "
          "warehouse in Leeds on March 9 and should arrive within five working days.\n\nYours sincerely,\nJ. Okafor")


def _page_with_lines(doc: pymupdf.Document, title: str, lines: list[str]) -> None:
    page = doc.new_page(width=612, height=792)
    y = 72
    page.insert_text((72, y), title.lstrip("# "), fontsize=18, fontname="hebo")
    y += 34
    for line in lines:
        bold = line.startswith("#")
        page.insert_text((72, y), line.lstrip("# "), fontsize=13 if bold else 11, fontname="hebo" if bold else "helv")
        y += 24 if bold else 18


def report_pdf() -> bytes:
    doc = pymupdf.open()
    for title, lines in REPORT:
        _page_with_lines(doc, title, lines)
    return doc.tobytes(garbage=3, deflate=True, no_new_id=True)


def letter_pdf() -> bytes:
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    page.insert_textbox(pymupdf.Rect(72, 90, 523, 700), LETTER, fontsize=12, fontname="tiro")
    return doc.tobytes(garbage=3, deflate=True, no_new_id=True)


def page_image(pdf: bytes, index: int, fmt: str) -> bytes:
    """A page rendered to an image file, as a scanner would deliver it."""
    page = pymupdf.open(stream=pdf, filetype="pdf").load_page(index)
    arr = render_page(page, target_longest_px=1100, max_pixels=1100 * 1100)
    pix = pymupdf.Pixmap(pymupdf.csRGB, arr.shape[1], arr.shape[0], arr.tobytes(), False)
    return pix.tobytes(fmt)


def tiff_pages(pdf: bytes) -> bytes:
    """A two-page TIFF (PyMuPDF writes one page per file, so the pages are joined with Pillow)."""
    import io

    from PIL import Image

    frames = [Image.open(io.BytesIO(page_image(pdf, i, "png"))).convert("RGB") for i in range(2)]
    buf = io.BytesIO()
    frames[0].save(buf, format="TIFF", save_all=True, append_images=frames[1:], compression="tiff_deflate")
    return buf.getvalue()


@click.command()
@click.option("--out", default="samples", show_default=True)
def main(out: str) -> None:
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    report, letter = report_pdf(), letter_pdf()
    files = {
        "report.pdf": report,
        "letter.pdf": letter,
        "scans/letter-scan.png": page_image(letter, 0, "png"),
        "scans/report-page2.jpg": page_image(report, 1, "jpg"),
        "scans/report.tiff": tiff_pages(report),
        # An error page saved under a .pdf name, as a failed download leaves it: must become one error row.
        "broken/download-error.pdf": b"<html><body><h1>403 Forbidden</h1></body></html>\n",
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        click.echo(f"{root / name}  {len(data):,} bytes")


if __name__ == "__main__":
    main()
