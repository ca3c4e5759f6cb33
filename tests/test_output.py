"""Commit protocol and resume planning, without Ray: whole documents per part, orphan and superseded parts
repaired, reruns skip what is done and retry what failed."""
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from pipeline.config import StorageConfig
from pipeline.output import DocMeta, DocumentAssembler, OutputStore, document_row
from pipeline.plan import plan_run
from pipeline.schema import DOCUMENT_SCHEMA, PAGE_SCHEMA, empty_row
from pipeline.storage import ListedFile, resolve


def page(uri, i, n, status="ok", **kw):
    return empty_row(PAGE_SCHEMA, run_id="r", uri=uri, sha256="s-" + uri, page_index=i, page_count=n, total_pages=n,
                     status=status, text=f"{uri}#{i}", prompt_tokens=3, output_tokens=5, raster_s=0.1, parse_s=0.2, **kw)


def error_row(uri, kind="damaged"):
    return empty_row(PAGE_SCHEMA, run_id="r", uri=uri, page_index=-1, page_count=0, total_pages=0, status="error",
                     error_kind=kind, error="bad")


def test_assembler_waits_for_whole_documents_and_ignores_duplicates():
    a = DocumentAssembler()
    assert a.add(page("a", 1, 3)) is None
    assert a.add(page("b", 0, 1))[0]["uri"] == "b"
    assert a.add(page("a", 1, 3)) is None  # duplicate from a retried task
    assert a.add(page("a", 0, 3)) is None
    done = a.add(page("a", 2, 3))
    assert [r["page_index"] for r in done] == [0, 1, 2]
    assert a.add(page("a", 2, 3)) is None  # late duplicate after commit
    assert a.incomplete() == []


def test_document_failure_replaces_pages_already_received():
    a = DocumentAssembler()
    a.add(page("a", 0, 5))
    done = a.add(error_row("a", "timeout"))
    assert len(done) == 1 and done[0]["page_index"] == -1
    assert a.add(page("a", 1, 5)) is None  # pages still in flight are dropped
    a.add(page("c", 0, 2))
    assert a.incomplete() == [("c", 1, 2)]


def test_document_row_counts_and_status():
    rows = [page("a", 0, 2), page("a", 1, 2, status="fallback")]
    d = document_row("run", rows, DocMeta(10, 20, 1), max_pages=500)
    assert (d["status"], d["pages"], d["pages_ok"], d["pages_fallback"], d["output_tokens"]) == ("ok", 2, 1, 1, 10)
    bad = document_row("run", [page("a", 0, 2), page("a", 1, 2, status="error", error_kind="engine", error="x")],
                       DocMeta(10, 20, 2), max_pages=500)
    assert bad["status"] == "error" and bad["pages_error"] == 1 and bad["attempt"] == 2
    failed = document_row("run", [error_row("b")], DocMeta(1, 2, 1), max_pages=500)
    assert failed["status"] == "error" and failed["pages"] == 0 and failed["error_kind"] == "damaged"


@pytest.fixture
def store(tmp_path):
    return OutputStore(resolve(str(tmp_path / "out"), StorageConfig()))


def commit(store, run_id, docs):
    pages, rows = [], []
    for uri, status in docs:
        p = [page(uri, 0, 1)] if status == "ok" else [error_row(uri)]
        pages += p
        rows.append(document_row(run_id, p, DocMeta(1, 1, 1), 500))
    return store.commit(run_id, pages, rows)


def test_reconcile_removes_orphans_and_keeps_the_newest_commit(store):
    commit(store, "20260101T000000Z-a", [("x", "error"), ("y", "ok")])
    commit(store, "20260102T000000Z-b", [("x", "ok")])  # the retry of x succeeded
    # A crash between the two writes of a part leaves a pages file with no documents file.
    store.loc.fs.create_dir(store.pages_dir, recursive=True)
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist([page("z", 0, 1)], schema=PAGE_SCHEMA),
                   store.pages_dir + "/part-20260103T000000Z-c-000001.parquet", filesystem=store.loc.fs)
    assert sorted(store.pages().column("uri").to_pylist()) == ["x", "x", "y"]  # readers already ignore the orphan
    report = store.reconcile()
    assert (report.orphan_parts_removed, report.superseded_documents) == (1, 1)
    docs = store.documents()
    assert sorted(zip(docs.column("uri").to_pylist(), docs.column("status").to_pylist())) == [("x", "ok"), ("y", "ok")]
    pages = store.pages()
    assert sorted(pages.column("uri").to_pylist()) == ["x", "y"]
    assert store.reconcile().superseded_documents == 0  # idempotent


def test_reconcile_deletes_parts_left_empty(store):
    commit(store, "20260101T000000Z-a", [("x", "error")])
    commit(store, "20260102T000000Z-b", [("x", "ok")])
    store.reconcile()
    assert len(store.loc.fs.get_file_info(__import__("pyarrow.fs").fs.FileSelector(store.documents_dir))) == 1


def committed(rows):
    base = dict(run_id="r", sha256="s", committed_at=datetime.now(timezone.utc))
    return pa.Table.from_pylist([empty_row(DOCUMENT_SCHEMA, **base, **r) for r in rows], schema=DOCUMENT_SCHEMA)


def test_plan_skips_done_retries_failed_and_picks_up_changes():
    listed = [ListedFile(u, 10, 100) for u in ("new", "done", "failed", "gave-up", "changed")]
    prior = committed([
        dict(uri="done", status="ok", size_bytes=10, mtime_ns=100, attempt=1),
        dict(uri="failed", status="error", size_bytes=10, mtime_ns=100, attempt=1),
        dict(uri="gave-up", status="error", size_bytes=10, mtime_ns=100, attempt=3),
        dict(uri="changed", status="ok", size_bytes=10, mtime_ns=99, attempt=1),
    ])
    plan = plan_run(listed, prior, retry_failed=False, max_attempts=3)
    assert {u: m.attempt for u, m in plan.todo.items()} == {"new": 1, "failed": 2, "changed": 1}
    assert plan.skipped["already done"] == 1 and sum(plan.skipped.values()) == 2
    only_failed = plan_run(listed, prior, retry_failed=True, max_attempts=3)
    assert {u: m.attempt for u, m in only_failed.todo.items()} == {"failed": 2, "gave-up": 4}
    limited = plan_run(listed, prior, retry_failed=False, max_attempts=3, limit=1)
    assert list(limited.todo) == ["new"] and limited.skipped["over --limit"] == 2


def test_plan_lists_or_reparses_documents_another_model_parsed():
    listed = [ListedFile(u, 10, 100) for u in ("mine", "theirs", "mixed", "unknown")]
    prior = committed([{"uri": u, "status": "ok", "size_bytes": 10, "mtime_ns": 100, "attempt": 1} for u in
                       ("mine", "theirs", "mixed", "unknown")])
    models = {"mine": {"m-1"}, "theirs": {"m-0"}, "mixed": {"m-0", "m-1"}}  # "unknown": no page names a model
    plan = plan_run(listed, prior, False, 3, model_id="m-1", page_models=models)
    assert plan.todo == {} and plan.other_model == {"theirs": ["m-0"], "mixed": ["m-0"]}
    assert plan.skipped == {"already done": 2, "parsed by another model": 2}
    again = plan_run(listed, prior, False, 3, model_id="m-1", page_models=models, reparse=True)
    assert {u: m.attempt for u, m in again.todo.items()} == {"theirs": 1, "mixed": 1} and not again.other_model


def test_page_models_reads_committed_parts_only(store):
    rows = [page("a", 0, 2, model_id="m-0"), page("a", 1, 2, model_id="m-1"), page("b", 0, 1, model_id="m-1")]
    store.commit("20260101T000000Z-a", rows, [document_row("r", rows[:2], DocMeta(1, 1, 1), 500),
                                             document_row("r", rows[2:], DocMeta(1, 1, 1), 500)])
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist([page("c", 0, 1, model_id="m-2")], schema=PAGE_SCHEMA),  # an orphan part
                   store.pages_dir + "/part-20260102T000000Z-b-000001.parquet", filesystem=store.loc.fs)
    assert store.page_models() == {"a": {"m-0", "m-1"}, "b": {"m-1"}}


def test_prepare_refuses_an_output_another_model_parsed_unless_reparse(tmp_path, tiny_checkpoint):
    """A rerun into an output whose documents another checkpoint parsed stops before Ray, naming --reparse; with it
    those documents are parsed again. The same checkpoint skips them as done."""
    from conftest import ROOT

    from pipeline.checkpoint import validate
    from pipeline.config import ConfigError, load_config
    from pipeline.job import prepare

    (tmp_path / "in").mkdir()
    src = tmp_path / "in" / "letter.pdf"
    src.write_bytes((ROOT / "samples" / "letter.pdf").read_bytes())
    base = {"input": {"uris": [str(tmp_path / "in")]}, "output": str(tmp_path / "out"),
            "model": {"checkpoint": str(tiny_checkpoint), "device": "cpu"}}
    [todo] = prepare(load_config(None, base)).plan.todo.items()
    store = OutputStore(resolve(str(tmp_path / "out"), StorageConfig()))

    def commit_parsed_by(model_id, run_id):
        rows = [page(todo[0], 0, 1, model_id=model_id)]
        store.commit(run_id, rows, [document_row(run_id, rows, todo[1], 500)])

    commit_parsed_by("tiny-random-0123456789", "20260101T000000Z-a")
    with pytest.raises(ConfigError, match="1 document.* parsed by another model .*tiny-random-0123456789.*--reparse"):
        prepare(load_config(None, base))
    again = prepare(load_config(None, base | {"run": {"reparse": True}})).plan
    assert list(again.todo) == [todo[0]] and again.todo[todo[0]].attempt == 1
    commit_parsed_by(validate(str(tiny_checkpoint)), "20260102T000000Z-b")  # the reparse, committed
    OutputStore(resolve(str(tmp_path / "out"), StorageConfig())).reconcile()
    assert prepare(load_config(None, base)).plan.skipped == {"already done": 1}
