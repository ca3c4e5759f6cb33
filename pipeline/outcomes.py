"""What a row's status and error kind mean, and which failures a later run retries.

A permanent failure is a fact about the file (it is encrypted, cut off, not a PDF): parsing the same bytes again gives
the same answer, so it is recorded once and a changed file (new size or mtime) is parsed afresh anyway. A retryable
failure is a fact about the run (a slow or busy machine, storage, a lost actor, the engine): a rerun may succeed.
docs/outcomes.md says the same for users; tests/test_outcomes.py keeps the two in step.
"""
from __future__ import annotations

# Page rows: `ok` (read by the model), `blank` (nothing drawn on the page: not sent to the model), `fallback` (the
# engine failed and the page's text layer stands in), `error` (see the kinds below).
PAGE_STATUSES = ("ok", "blank", "fallback", "error")

PERMANENT_KINDS = {
    "unsupported": "the file's extension is not one the job reads (pdf, png, jpg, jpeg, tif, tiff)",
    "empty": "the file has 0 bytes, or it is an intact PDF whose page tree holds no pages",
    "not_pdf": "named .pdf, but no %PDF- marker in its first 1024 bytes (an HTML error page, text, a failed download)",
    "truncated": "the file stops before its end: no startxref/%%EOF in its last 1024 bytes, or its xref points past "
                 "its last byte, and MuPDF could not recover its pages",
    "damaged": "the cross-reference table or trailer is broken beyond MuPDF's repair (the file does not open, or "
               "repair finds no pages)",
    "page_tree": "the page tree is broken (a cycle, a wrong page count, a page that cannot be loaded)",
    "encrypted": "the document needs a user password",
    "page_damaged": "one page whose content MuPDF cannot draw (the document's other pages are parsed)",
    "too_large": "drawing the page (or decoding an image document) ran out of the render process's memory cap "
                 "(raster.memory_limit_mb)",
}
RETRYABLE_KINDS = {
    "timeout": "a page was not drawn within raster.page_timeout_s (the renderer is killed and the next page drawn)",
    "crash": "the render process died on a page (a MuPDF crash, or killed for memory by the system)",
    "unreadable": "the file could not be read from storage",
    "engine": "the engine failed on the page (with parse.fallback_to_text_layer and a text layer: status fallback)",
    "incomplete": "the stream lost some of the document's pages (an actor lost beyond Ray's retries)",
}
ERROR_KINDS = {**PERMANENT_KINDS, **RETRYABLE_KINDS}


def is_retryable(kind: str | None) -> bool:
    """Whether a later run parses a document that failed with `kind` again (up to run.max_attempts). An unknown
    kind (a row written by an older version) is retried: only known facts about a file stop a retry."""
    return kind not in PERMANENT_KINDS
