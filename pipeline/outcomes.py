"""What a row's status and error kind mean, and which failures a later run retries.

A permanent failure is a fact about the file (it is encrypted, cut off, not a PDF): parsing the same bytes again gives
the same answer, so it is recorded once and a changed file (new size or mtime) is parsed afresh anyway. A retryable
failure is a fact about the run (a slow or busy machine, storage, a lost actor, the engine): a rerun may succeed.
docs/outcomes.md says the same for users; tests/test_outcomes.py keeps the two in step.
"""
from __future__ import annotations

# Page rows: `ok` (read by the model), `blank` (nothing drawn on the page: not sent to the model; `error` holds
# MuPDF's warnings when it drew blank over content that failed to decode), `fallback` (the engine failed and the
# page's text layer stands in), `error` (see the kinds below).
PAGE_STATUSES = ("ok", "blank", "fallback", "error")

PERMANENT_KINDS = {
    "unsupported": "the file's extension is not one the job reads (pdf, png, jpg, jpeg, tif, tiff)",
    "empty": "the file has 0 bytes, or it is an intact PDF (nothing repaired or warned, its trailer, catalog and page "
             "tree as an empty document's are) whose page tree holds no pages",
    "not_pdf": "named .pdf, but no %PDF- marker in its first 1024 bytes (an HTML error page, text, a failed download); "
               "a file that starts %PDF- is never this",
    "truncated": "the file stops before its end (no startxref/%%EOF in its last 1024 bytes), and MuPDF could not "
                 "recover its pages",
    "damaged": "the cross-reference table, trailer or objects are broken: the file does not open, MuPDF repaired it "
               "(or warned that its structure is broken) and found no pages, or it ends as a PDF does but its xref "
               "points past its objects",
    "page_tree": "the page tree is broken (a cycle, a wrong page count, a page that cannot be loaded, a catalog "
                 "without one, kids that are missing or not pages)",
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


# The command line's exit status (jobs/parse_corpus.py), for a cron job or an orchestrator to act on; docs/outcomes.md
# has the same table (tests/test_outcomes.py keeps the two in step).
EXIT_OK = 0
EXIT_CRASHED = 1  # Python's own status for an uncaught exception
EXIT_NOT_STARTED = 2  # click's status for a bad flag, too
EXIT_SOME_FAILED = 3
EXIT_ALL_FAILED = 4
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C)
EXIT_TERMINATED = 143  # SIGTERM (pipeline.terminate)
EXIT_STATUSES = {
    EXIT_OK: "the run finished and every document it parsed is ok, or there was nothing to parse; with "
             "--allow-errors, also when documents failed",
    EXIT_CRASHED: "the run stopped on an unexpected error (its traceback is printed); the documents committed before "
                  "it are kept, and the same command resumes",
    EXIT_NOT_STARTED: "the run could not start: a flag, the config, the checkpoint, an input, the output, the object "
                      "store or the Ray cluster is not usable (one line says what to fix); nothing was parsed",
    EXIT_SOME_FAILED: "the run finished, and some of its documents failed while others are ok: their rows say why, "
                      "and a rerun retries those whose kind is retryable",
    EXIT_ALL_FAILED: "the run finished, and every document it had to parse failed (or none came back): most likely "
                     "a problem of the run (storage, the engine), not of the files",
    EXIT_INTERRUPTED: "stopped by Ctrl-C (SIGINT): as for 143",
    EXIT_TERMINATED: "stopped by SIGTERM: whole documents finished before it are committed, the output is "
                     "consistent, and the same command resumes",
}


def exit_status(planned: int, documents: int, documents_error: int, allow_errors: bool = False) -> int:
    """The status of a run that finished: `planned` documents to parse, `documents` came back, `documents_error` of
    them failed. A planned document that never came back counts as failed."""
    failed = documents_error + max(0, planned - documents)
    if not failed or allow_errors:
        return EXIT_OK
    return EXIT_ALL_FAILED if failed >= max(planned, documents) else EXIT_SOME_FAILED
