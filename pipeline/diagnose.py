"""Why a PDF that MuPDF could not open (or that opened with no pages) failed, from what the file is: its header,
its end, the offsets its cross-reference table promises against its size, and what MuPDF warned while repairing.

Pure functions of the bytes and MuPDF's warning text: no PyMuPDF calls here, so each rule is tested on its own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

HEAD = TAIL = 1024  # PDF readers look for the version marker and the end-of-file trailer this far from each end
WARNINGS_SHOWN = 400  # characters of MuPDF's warnings kept in an error message

_STARTXREF = re.compile(rb"startxref\s*(\d+)")
_XREF_ENTRY = re.compile(rb"(\d{10}) (\d{5}) n")
# MuPDF's words for a file whose structure it found broken, whether or not it then repaired it
_STRUCTURE_WARNING = re.compile(r"repair|xref|trailer|syntax error|format error|expected '?(obj|endobj)|object number|"
                                r"cannot find object|object missing|startxref", re.IGNORECASE)


@dataclass(frozen=True)
class PdfFacts:
    size: int
    header_at: int | None  # offset of "%PDF-" within the first HEAD bytes
    tail_has_end: bool  # "startxref" or "%%EOF" in the last TAIL bytes
    startxref: int | None  # the last startxref offset in the file
    xref_max_offset: int | None  # the largest in-use object offset of its classic xref tables
    repaired: bool  # MuPDF said it repaired the file
    page_tree_warned: bool  # MuPDF said the page tree is broken
    structure_warned: bool = False  # MuPDF said the cross-reference table, trailer or an object is broken

    def _offsets_past_end(self) -> str | None:
        if self.startxref is not None and self.startxref >= self.size:
            return f"its startxref points to byte {self.startxref} but the file has {self.size} bytes"
        if self.xref_max_offset is not None and self.xref_max_offset >= self.size:
            return f"its xref places an object at byte {self.xref_max_offset} but the file has {self.size} bytes"
        return None

    def cut_off(self) -> str | None:
        """Why the file looks cut off (it stops before the trailer a PDF ends with), or None."""
        if self.tail_has_end:
            return None
        past = self._offsets_past_end()
        return f"it ends at byte {self.size} without the startxref/%%EOF trailer a PDF ends with" + (
            f", and {past}" if past else "")

    def misplaced_xref(self) -> str | None:
        """Why the offsets, not the length, are wrong: the file ends as a PDF does, but its xref points past its
        objects, beyond its last byte (bytes taken out of its middle, by an edit or a text-mode transfer). None
        otherwise."""
        past = self._offsets_past_end() if self.tail_has_end else None
        return f"{past}, though the file ends with the trailer a PDF ends with" if past else None


def facts(data: bytes, warnings: str) -> PdfFacts:
    marks = _STARTXREF.findall(data)
    offsets = [int(m[0]) for m in _XREF_ENTRY.findall(data)]
    low = warnings.lower()
    return PdfFacts(
        size=len(data), header_at=_found(data[:HEAD].find(b"%PDF-")),
        tail_has_end=b"startxref" in data[-TAIL:] or b"%%EOF" in data[-TAIL:],
        startxref=int(marks[-1]) if marks else None, xref_max_offset=max(offsets) if offsets else None,
        repaired="repair" in low, page_tree_warned="page tree" in low or "kids" in low,
        structure_warned=bool(_STRUCTURE_WARNING.search(warnings)),
    )


def _found(i: int) -> int | None:
    return None if i < 0 else i


def what_it_looks_like(data: bytes) -> str:
    head = data[:HEAD].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html", b"<?xml", b"<head", b"<body")):
        return "an HTML or XML page (a failed download or an error page?)"
    if head.startswith((b"{", b"[")):
        return "JSON text (an API's error answer?)"
    sample = data[:HEAD]
    if sample and sum(32 <= b < 127 or b in (9, 10, 13) for b in sample) / len(sample) > 0.95:
        return f"plain text ({sample[:40].decode('ascii', 'replace').strip()!r}...)"
    return "binary data of another kind"


def warnings_text(warnings: str) -> str:
    """MuPDF's warnings as one line for an error message: kept in order, repeats and blank lines dropped."""
    seen, out = set(), []
    for line in warnings.splitlines():
        line = line.strip()
        if line and line not in seen and not line.startswith("... repeated"):
            seen.add(line)
            out.append(line)
    text = "; ".join(out)
    return text if len(text) <= WARNINGS_SHOWN else text[: WARNINGS_SHOWN - 3] + "..."


def out_of_memory(failure: str) -> bool:
    """Whether MuPDF failed for want of memory ("malloc (300010000 bytes) failed"): under the render process's
    address-space cap that is a page or image too large to draw, not a damaged file."""
    low = failure.lower()
    return "out of memory" in low or (("malloc" in low or "calloc" in low or "realloc" in low) and "failed" in low)


def classify_unopened(data: bytes, warnings: str, failure: str, repaired: bool = False,
                      broken: tuple[str, str] | None = None) -> tuple[str, str]:
    """(kind, message) for a PDF that did not open, whose page count could not be read, or that has no pages.
    `failure` says what went wrong in MuPDF's words ("no pages" when the document opened empty); `repaired` is
    MuPDF's own flag for a document it repaired while opening; `broken` is (kind, what) when a document with no
    pages failed a check of its trailer, catalog and page tree (MuPDF reads some broken trees as empty, silently).

    A file that starts %PDF- is never `not_pdf`; a file that ends as a PDF does is never `truncated` (wrong offsets
    in a file of the right length are damage); `empty` is an intact PDF only."""
    f = facts(data, warnings)
    said = warnings_text(warnings)
    mupdf = f" (MuPDF: {failure}{'; ' + said if said else ''})"
    if out_of_memory(failure):
        return "too_large", f"out of memory while opening the document{mupdf}"
    if f.header_at is None:
        return "not_pdf", f"no %PDF- marker in the first {HEAD} bytes: the file is {what_it_looks_like(data)}{mupdf}"
    if why := f.cut_off():
        return "truncated", f"the file is cut off: {why}{mupdf}"
    if why := f.misplaced_xref():
        return "damaged", f"the cross-reference table does not match the file: {why}{mupdf}"
    if f.page_tree_warned or "page tree" in failure.lower() or "number of pages" in failure.lower():
        return "page_tree", f"the page tree is broken{mupdf}"
    if failure != "no pages":
        return "damaged", f"the cross-reference table or trailer is broken beyond repair{mupdf}"
    if f.repaired or repaired:
        return "damaged", f"MuPDF repaired the broken cross-reference table and found no pages{mupdf}"
    if f.structure_warned:
        return "damaged", f"MuPDF found no pages and warned that the file's structure is broken{mupdf}"
    if broken:
        kind, what = broken
        return kind, f"no pages can be read: {what}{mupdf}"
    return "empty", (f"the PDF is intact (trailer, catalog and page tree check out) but its page tree holds no "
                     f"pages{mupdf}")


def classify_page_failure(failure: str) -> str:
    """The kind of one page that could not be loaded or drawn."""
    low = failure.lower()
    if out_of_memory(failure):
        return "too_large"
    return "page_tree" if "page tree" in low or "number of pages" in low else "page_damaged"
