"""What rows say and what reruns do with them: the documented kinds and statuses are the code's, permanent failures
are recorded once, retryable ones retried up to run.max_attempts, blank pages counted, and a rerun with nothing left
to parse finishes in seconds without Ray."""
import re
import subprocess
import sys
import time
from datetime import datetime, timezone

import pyarrow as pa

from conftest import ROOT
from pipeline.config import StorageConfig
from pipeline.outcomes import ERROR_KINDS, PAGE_STATUSES, PERMANENT_KINDS, RETRYABLE_KINDS, is_retryable
from pipeline.output import DocMeta, OutputStore, document_row
from pipeline.plan import plan_run
from pipeline.schema import DOCUMENT_SCHEMA, PAGE_SCHEMA, empty_row
from pipeline.stats import RunStats, format_table
from pipeline.storage import ListedFile, resolve

DOCS = ROOT / "docs" / "outcomes.md"


def _table_keys_of(section: str, key: str) -> list[str]:
    """The first column's keys (`key`'s group) of the markdown table after `section` in docs/outcomes.md."""
    text = DOCS.read_text()
    body = text[text.index(section):]
    table = body[body.index("\n|"):]
    rows = []
    for line in table.splitlines()[1:]:
        if not line.startswith("|"):
            break
        rows += re.findall(key, line)
    return rows


def _table_keys(section: str) -> list[str]:
    """The first column's `names` of the markdown table after `section` in docs/outcomes.md."""
    return _table_keys_of(section, r"^\| `(\w+)`")


def test_the_docs_name_every_kind_and_status_the_code_has():
    assert _table_keys("## Page status") == list(PAGE_STATUSES)
    assert _table_keys("**Permanent**") == list(PERMANENT_KINDS)
    assert _table_keys("**Retryable**") == list(RETRYABLE_KINDS)
    assert not set(PERMANENT_KINDS) & set(RETRYABLE_KINDS)


def committed(rows):
    base = dict(run_id="r", sha256="s", size_bytes=10, mtime_ns=100, committed_at=datetime.now(timezone.utc))
    return pa.Table.from_pylist([empty_row(DOCUMENT_SCHEMA, **(base | r)) for r in rows], schema=DOCUMENT_SCHEMA)


def test_permanent_failures_are_recorded_once_and_retryable_ones_retried():
    kinds = sorted(ERROR_KINDS) + ["from-an-older-version"]
    listed = [ListedFile(k, 10, 100) for k in kinds] + [ListedFile("spent", 10, 100), ListedFile("changed", 11, 100)]
    prior = committed([dict(uri=k, status="error", error_kind=k, attempt=1) for k in kinds]
                      + [dict(uri="spent", status="error", error_kind="timeout", attempt=3),
                         dict(uri="changed", status="error", error_kind="encrypted", attempt=1)])
    plan = plan_run(listed, prior, retry_failed=False, max_attempts=3)
    retried = {u: m.attempt for u, m in plan.todo.items()}
    assert retried == {**{k: 2 for k in RETRYABLE_KINDS}, "from-an-older-version": 2, "changed": 1}
    assert plan.skipped == {**{f"{k} (not retried: --retry-failed forces)": 1 for k in PERMANENT_KINDS},
                            "failed 3 times (use --retry-failed)": 1}
    assert "encrypted (not retried: --retry-failed forces)" in plan.summary()
    forced = plan_run(listed, prior, retry_failed=True, max_attempts=3)
    assert set(forced.todo) == set(kinds) | {"spent"} and forced.todo["spent"].attempt == 4


def page(uri, i, n, status="ok", **kw):
    return empty_row(PAGE_SCHEMA, run_id="r", uri=uri, sha256="s", page_index=i, page_count=n, total_pages=n,
                     status=status, text="" if status == "blank" else f"{uri}#{i}", raster_s=0.1, **kw)


def test_blank_pages_are_counted_and_a_retryable_page_error_leads():
    rows = [page("a", 0, 4), page("a", 1, 4, "blank"),
            page("a", 2, 4, "error", error_kind="page_damaged", error="page 2: bad colour space"),
            page("a", 3, 4, "error", error_kind="timeout", error="page 3: not drawn within 60 s")]
    doc = document_row("r", rows, DocMeta(1, 1, 1), 500)
    assert (doc["pages_ok"], doc["pages_blank"], doc["pages_error"], doc["status"]) == (1, 1, 2, "error")
    assert doc["error_kind"] == "timeout" and is_retryable(doc["error_kind"])  # page 3 may draw on a rerun
    stats = RunStats("r", 1, 0, 1.0)
    stats.add_document(doc, rows)
    stats.wall_s = 1.0
    s = stats.summary()
    assert (s["pages"], s["pages_ok"], s["pages_blank"], s["pages_error"]) == (4, 1, 1, 2)
    assert "blank 1" in format_table(s)


def test_a_rerun_with_nothing_retryable_left_finishes_in_seconds_without_ray(tmp_path, tiny_checkpoint):
    """The output already holds every listed document: done, or failed for good. The job is run with `ray` made
    unimportable: it must not need it, and it must finish quickly."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "good.pdf").write_bytes((ROOT / "samples" / "letter.pdf").read_bytes())
    (inputs / "locked.pdf").write_bytes(b"%PDF-1.7 stands in for an encrypted file")
    (inputs / "page.html.pdf").write_bytes(b"<html>403</html>")
    store = OutputStore(resolve(str(tmp_path / "out"), StorageConfig()))
    listed = {f.name: f.stat() for f in inputs.iterdir()}
    rows, docs = [], []
    for name, kind in (("good.pdf", None), ("locked.pdf", "encrypted"), ("page.html.pdf", "not_pdf")):
        uri = f"file://{inputs / name}"
        mine = [page(uri, 0, 1)] if kind is None else [empty_row(
            PAGE_SCHEMA, run_id="r", uri=uri, page_index=-1, page_count=0, total_pages=0, status="error",
            error_kind=kind, error="as a real run records it")]
        rows += mine
        docs.append(document_row("r", mine, DocMeta(listed[name].st_size, listed[name].st_mtime_ns, 1), 500))
    store.commit("20260101T000000Z-a", rows, docs)
    code = ("import sys, runpy; sys.modules['ray'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "jobs/parse_corpus.py"), "--input", str(inputs),
                           "--output", str(tmp_path / "out"), "--checkpoint", str(tiny_checkpoint)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    seconds = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "0 to process" in proc.stdout and "1 already done" in proc.stdout and "nan" not in proc.stdout
    assert "encrypted (not retried" in proc.stdout and "not_pdf (not retried" in proc.stdout
    # imports and the checkpoint check, nothing parsed: 7 s on an idle 2-core machine, 34 s at a load of 16
    assert seconds < 60, seconds
    assert store.documents().num_rows == 3


def test_the_docs_name_every_exit_status_and_each_run_gets_the_right_one():
    from pipeline.outcomes import (EXIT_ALL_FAILED, EXIT_OK, EXIT_SOME_FAILED, EXIT_STATUSES, EXIT_TERMINATED,
                                   exit_status)

    assert [int(k) for k in _table_keys_of("## Exit status", r"^\| `(\d+)`")] == sorted(EXIT_STATUSES)
    assert EXIT_TERMINATED == 143 and len(set(EXIT_STATUSES)) == 7
    assert exit_status(planned=0, documents=0, documents_error=0) == EXIT_OK  # nothing to do
    assert exit_status(planned=6, documents=6, documents_error=0) == EXIT_OK
    assert exit_status(planned=6, documents=6, documents_error=1) == EXIT_SOME_FAILED
    assert exit_status(planned=6, documents=6, documents_error=6) == EXIT_ALL_FAILED
    assert exit_status(planned=6, documents=5, documents_error=0) == EXIT_SOME_FAILED  # one never came back
    assert exit_status(planned=6, documents=0, documents_error=0) == EXIT_ALL_FAILED  # none came back
    assert exit_status(planned=6, documents=6, documents_error=6, allow_errors=True) == EXIT_OK
    assert exit_status(planned=6, documents=6, documents_error=1, allow_errors=True) == EXIT_OK
