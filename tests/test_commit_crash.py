"""The commit protocol stopped at every write and delete of a commit and of a reconcile, on local disk, S3 and GCS;
each stop is followed by a resume, and the output must hold every document once with all its pages.

A crash is a BaseException raised by the storage call instead of performing it, so nothing after it runs, as
when the driver is killed there. The sequence of calls is recorded from a run without a crash first, so every
point of the protocol as the code performs it is covered, not a list that could drift from it."""
from collections import Counter
from contextlib import contextmanager

import pytest

import pipeline.output as output
from pipeline.config import StorageConfig
from pipeline.output import DocMeta, OutputStore, document_row
from pipeline.schema import PAGE_SCHEMA, empty_row
from pipeline.storage import resolve


class Crash(BaseException):
    """Nothing in the code under test catches a BaseException: like SIGKILL, it ends the run at this point."""


@contextmanager
def storage_calls(monkeypatch, crash_before: int | None = None):
    """Records (op, part) of each write and delete the output module makes; raises Crash instead of call number
    `crash_before`."""
    calls = []
    real_write, real_delete = output.write_parquet_atomic, output.delete_file

    def hooked(op, real):
        def call(fs, path, *args):
            if len(calls) == crash_before:
                raise Crash(f"{op} {path}")
            calls.append((op, "/".join(path.rsplit("/", 2)[-2:])))
            return real(fs, path, *args)
        return call

    with monkeypatch.context() as mp:
        mp.setattr(output, "write_parquet_atomic", hooked("write", real_write))
        mp.setattr(output, "delete_file", hooked("delete", real_delete))
        yield calls


@pytest.fixture(params=["local", "s3", "gcs"])
def new_output(request, tmp_path):
    """A factory of empty output locations, each in a fresh folder or bucket of the store under test."""
    if request.param == "local":
        count = iter(range(1000))
        storage = StorageConfig()
        return lambda: OutputStore(resolve(str(tmp_path / f"out{next(count)}"), storage))
    store = request.getfixturevalue(f"{request.param}_store")
    storage = StorageConfig(**store.storage)
    return lambda: OutputStore(resolve(store.uri(f"{store.new_bucket()}/out"), storage))


def page_rows(run_id, uri, n, tag=""):
    if n == 0:  # a failed document: its one error row
        return [empty_row(PAGE_SCHEMA, run_id=run_id, uri=uri, page_index=-1, page_count=0, total_pages=0,
                          status="error", error_kind="crash", error="renderer died")]
    return [empty_row(PAGE_SCHEMA, run_id=run_id, uri=uri, sha256="s", page_index=i, page_count=n, total_pages=n,
                      status="ok", text=f"{uri}#{i}{tag}") for i in range(n)]


def commit(store, run_id, docs, tag=""):
    """One part holding `docs` ({uri: pages, 0 for a failed document})."""
    pages, rows = [], []
    for uri, n in docs.items():
        p = page_rows(run_id, uri, n, tag)
        pages += p
        rows.append(document_row(run_id, p, DocMeta(1, 1, 1), 500))
    return store.commit(run_id, pages, rows)


def visible(store):
    """(documents by URI, page texts by URI) as a reader sees them now."""
    docs = Counter(store.documents().column("uri").to_pylist())
    texts = {}
    for p in store.pages().to_pylist():
        texts.setdefault(p["uri"], []).append(p["text"])
    return docs, texts


def assert_no_lost_page(store):
    """What any reader may rely on at every moment, even mid-crash: the newest commit of each document (the last
    row for its URI: parts are read in commit order) has all its pages. An older, superseded row may have lost
    its pages to a reconcile cut short; the next reconcile removes that row."""
    pages = store.pages()
    have = set(zip(*(pages.column(c).to_pylist() for c in ("run_id", "uri", "page_index"))))
    newest = {d["uri"]: d for d in store.documents().to_pylist()}
    for d in newest.values():
        want = [-1] if d["status"] == "error" and d["pages"] == 0 else range(d["pages"])
        missing = [i for i in want if (d["run_id"], d["uri"], i) not in have]
        assert not missing, f"{d['uri']} is committed by {d['run_id']} but its pages {missing} are gone"


def assert_exactly_once(store, expected: dict[str, list]):
    """Each document once, with exactly the expected page texts, and no pages part without its documents part."""
    docs, texts = visible(store)
    assert dict(docs) == {u: 1 for u in expected}, docs
    assert {u: sorted(t, key=str) for u, t in texts.items()} == {u: sorted(t, key=str) for u, t in expected.items()}
    fs = store.loc.fs
    names = lambda d: sorted(p.rsplit("/", 1)[1] for p in output.list_parquet(fs, d))  # noqa: E731
    assert names(store.pages_dir) == names(store.documents_dir), "a pages part without its commit record is left"


DRIVER_RUN = {"20260101T000000000000Z-aaaaaa": [{"a": 2, "b": 0}, {"c": 3}]}


def texts_of(docs, tag=""):
    return {u: [r["text"] for r in page_rows("x", u, n, tag)] for u, n in docs.items()}


def drive(store, runs):
    for run_id, parts in runs.items():
        for docs in parts:
            commit(store, run_id, docs)


def resume(store):
    """What the next job does: reconcile, skip committed documents, commit the rest again."""
    store = OutputStore(store.loc)
    store.reconcile()
    done = set(store.documents().column("uri").to_pylist())
    todo = {u: n for part in DRIVER_RUN["20260101T000000000000Z-aaaaaa"] for u, n in part.items() if u not in done}
    if todo:
        commit(store, "20260102T000000000000Z-bbbbbb", todo)
    store.reconcile()
    return store


def test_driver_killed_at_each_write_of_a_commit_then_resumed(new_output, monkeypatch):
    with storage_calls(monkeypatch) as calls:
        drive(new_output(), DRIVER_RUN)
    assert [op for op, _ in calls] == ["write"] * 4
    expected = texts_of({"a": 2, "b": 0, "c": 3})
    for stop in range(len(calls) + 1):
        store = new_output()
        with storage_calls(monkeypatch, crash_before=stop):
            try:
                drive(store, DRIVER_RUN)
            except Crash:
                pass
        assert_no_lost_page(store)
        assert_exactly_once(resume(store), expected)


# Output left by earlier runs: run 1 failed on x and parsed y and z; run 2 parsed x again (its retry) and z again
# (the file changed), and died between the two writes of its second part (w, never committed).
EARLIER = {"20260101T000000000000Z-aaaaaa": [{"x": 0, "y": 2}, {"z": 1}],
           "20260102T000000000000Z-bbbbbb": [{"x": 3, "z": 2}]}
ORPHAN = ("20260102T000000000000Z-bbbbbb", {"w": 1})


def earlier_output(store):
    drive(store, EARLIER)
    rows = page_rows(ORPHAN[0], "w", 1)
    output.write_parquet_atomic(store.loc.fs, f"{store.pages_dir}/part-{ORPHAN[0]}-000002.parquet",
                                __import__("pyarrow").Table.from_pylist(rows, schema=PAGE_SCHEMA))
    return store


def test_reconcile_killed_at_each_write_and_delete_then_run_again(new_output, monkeypatch):
    store = earlier_output(new_output())
    with storage_calls(monkeypatch) as calls:
        report = store.reconcile()
    assert (report.orphan_parts_removed, report.superseded_documents, report.parts_rewritten) == (1, 2, 2)
    # The orphan is deleted; run 1's first part rewritten without x (pages first); its second part, left empty,
    # deleted (pages first).
    assert [op for op, _ in calls] == ["delete", "write", "write", "delete", "delete"]
    expected = texts_of({"y": 2, "x": 3, "z": 2})
    for stop in range(len(calls) + 1):
        store = earlier_output(new_output())
        with storage_calls(monkeypatch, crash_before=stop):
            try:
                store.reconcile()
            except Crash:
                pass
        assert_no_lost_page(store)
        again = OutputStore(store.loc)
        again.reconcile()
        assert_exactly_once(again, expected)
        assert again.reconcile().parts_rewritten == 0  # nothing left to repair
