"""The driver at archive scale, small enough for every run: the Arrow plan, listing and reconcile give what the
per-document Python they replaced gave, and a plan holds Python objects only for the documents it has work for
(bench/archive_scale.py times 10 k to 1 M documents)."""
import fnmatch
import random
import tracemalloc
from collections import Counter
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import StorageConfig
from pipeline.outcomes import PERMANENT_KINDS, RETRYABLE_KINDS, is_retryable
from pipeline.output import DocMeta, OutputStore
from pipeline.plan import plan_run, unique_listing
from pipeline.schema import DOCUMENT_SCHEMA, PAGE_SCHEMA, empty_row
from pipeline.storage import LISTING_SCHEMA, ListedFile, list_documents, list_table, listing_table, resolve


def reference_plan(listed, committed, retry_failed, max_attempts, limit=None, model_id=None, page_models=None,
                   reparse=False):
    """The planner as it was, one Python dict per committed row: what the Arrow plan must agree with."""
    last = {r["uri"]: r for r in committed.select(["uri", "status", "error_kind", "size_bytes", "mtime_ns",
                                                   "attempt"]).to_pylist()}
    todo, skipped, other_model = {}, Counter(), {}
    for f in listed:
        prev = last.get(f.uri)
        changed = prev is not None and (prev["size_bytes"], prev["mtime_ns"]) != (f.size, f.mtime_ns)
        if prev is None or changed:
            if retry_failed:
                skipped["not failed before (--retry-failed)"] += 1
                continue
            attempt = 1
        elif prev["status"] == "ok":
            others = (page_models or {}).get(f.uri, set()) - {model_id}
            if model_id is None or not others:
                skipped["already done"] += 1
                continue
            if not reparse:
                other_model[f.uri] = sorted(others)
                skipped["parsed by another model"] += 1
                continue
            attempt = 1
        elif retry_failed:
            attempt = prev["attempt"] + 1
        elif not is_retryable(prev["error_kind"]):
            skipped[f"{prev['error_kind']} (not retried: --retry-failed forces)"] += 1
            continue
        elif prev["attempt"] < max_attempts:
            attempt = prev["attempt"] + 1
        else:
            skipped[f"failed {prev['attempt']} times (use --retry-failed)"] += 1
            continue
        if limit is not None and len(todo) >= limit:
            skipped["over --limit"] += 1
            continue
        todo[f.uri] = DocMeta(f.size, f.mtime_ns, attempt)
    return todo, skipped, other_model


def archive(n, seed=0, work=0.1):
    """n listed documents (a few listed twice, as overlapping inputs give), a committed table holding most of them
    in every state (some twice, the later row counting) and page models: `work` of them not plainly done."""
    rng = random.Random(seed)
    listed = [ListedFile(f"s3://b/a/{rng.randrange(10**9):09d}-{i}.pdf", rng.randrange(1, 10**6), 10**18 + i)
              for i in range(n)]
    listed += rng.sample(listed, n // 500)
    rows, models = [], {}
    kinds = [None, *PERMANENT_KINDS, *RETRYABLE_KINDS, "unknown-old-kind"]
    for f in listed[:n]:
        if rng.random() < work:
            state = rng.choice(["new", "changed", "size", "failed", "failed", "theirs", "mixed", "null-status"])
        else:
            state = "done"
        if state == "new":
            continue
        row = dict(uri=f.uri, size_bytes=f.size, mtime_ns=f.mtime_ns, status="ok", attempt=1)
        if state == "changed":
            row["mtime_ns"] -= 1
        elif state == "size":
            row["size_bytes"] = None
        elif state == "failed":
            row.update(status="error", error_kind=rng.choice(kinds), attempt=rng.randint(1, 4))
        elif state == "null-status":
            row["status"] = None
        if rng.random() < 0.02:  # an older commit of the same document, superseded by the row after it
            rows.append(dict(row, status="error", error_kind="timeout", attempt=9))
        rows.append(row)
        models[f.uri] = {"done": {"m-1"}, "theirs": {"m-0"}, "mixed": {"m-0", "m-1"}}.get(state, {"m-1"})
        if rng.random() < 0.05:
            models.pop(f.uri)  # pages that name no model
    base = dict(run_id="r", sha256="s", committed_at=datetime.now(timezone.utc))
    committed = pa.Table.from_pylist([empty_row(DOCUMENT_SCHEMA, **base, **r) for r in rows], schema=DOCUMENT_SCHEMA)
    return listed, committed, models


def model_table(models):
    pairs = [(u, m) for u, ms in models.items() for m in sorted(ms)]
    return pa.table({"uri": [u for u, _ in pairs], "model_id": [m for _, m in pairs]})


@pytest.mark.parametrize("retry_failed,limit,model_id,reparse", [
    (False, None, None, False), (False, None, "m-1", False), (False, 300, "m-1", True), (True, None, "m-1", False),
    (True, 50, None, False), (False, None, "m-2", True),
])
def test_arrow_plan_agrees_with_the_per_document_reference(retry_failed, limit, model_id, reparse):
    listed, committed, models = archive(20_000, work=0.15)
    want = reference_plan(listed, committed, retry_failed, 3, limit, model_id, models, reparse)
    for listing, pm in ((listed, models), (listing_table(listed), model_table(models))):
        plan = plan_run(listing, committed, retry_failed, 3, limit, model_id, pm, reparse)
        assert list(plan.todo.items()) == list(want[0].items())  # the same documents, in listing order
        assert plan.skipped == want[1] and plan.other_model == want[2]


def test_unique_listing_keeps_each_uri_once_in_first_place():
    listed = [ListedFile("c", 1, 1), ListedFile("a", 1, 1), ListedFile("c", 2, 2), ListedFile("b", 1, 1)]
    by_uri = {}
    for f in listed:
        by_uri[f.uri] = f
    assert unique_listing(listing_table(listed)).to_pylist() == listing_table(list(by_uri.values())).to_pylist()


def python_objects_peak(fn) -> int:
    """Peak bytes of Python objects allocated while fn runs (Arrow's buffers are not Python objects)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_plan_holds_python_objects_for_its_work_not_for_the_archive():
    """The same 1,000 documents of work in a 10 k and a 40 k archive: the planner's Python objects stay about the
    same (the per-document planner held one dict per committed document: 4x)."""
    peaks = {}
    for n, work in ((10_000, 0.1), (40_000, 0.025)):
        listed, committed, models = archive(n, seed=1, work=work)
        listing, pm = listing_table(listed), model_table(models)
        plan = plan_run(listing, committed, False, 3, None, "m-1", pm, False)
        assert plan.skipped["already done"] > 0.85 * n
        peaks[n] = python_objects_peak(lambda: plan_run(listing, committed, False, 3, None, "m-1", pm, False))
    assert peaks[40_000] < 1.5 * peaks[10_000], peaks
    assert peaks[40_000] < 40_000 * 100, peaks  # well under one small Python object per listed document


def test_listing_table_matches_fnmatch_on_each_name(tmp_path):
    names = ["a.pdf", "B.PDF", "x/c.pdf", "x/tmp/d.pdf", "x/y/e.png", "x/y/f.txt", "2026/01/g.pdf", "2026/01/h.PNG",
             "weird[1].pdf", "q?.jpg", ".hidden.pdf"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"%PDF" * len(name))
    for include, exclude in ((["*.pdf", "*.png"], []), (["*.pdf"], ["*/tmp/*", "b.*"]), (["2026/*/*.pdf"], []),
                             (["*"], ["*.png", "*[1]*"]), (["weird[[]1].pdf", "q?.jpg"], []), ([], [])):
        def matches(rel, patterns):
            name = rel.rsplit("/", 1)[-1]
            return any(fnmatch.fnmatch(rel.lower(), p.lower()) or fnmatch.fnmatch(name.lower(), p.lower())
                       for p in patterns)
        want = sorted(f"file://{tmp_path}/{n}" for n in names if matches(n, include) and not matches(n, exclude))
        table = list_table(str(tmp_path), StorageConfig(), include, exclude)
        assert table.schema == LISTING_SCHEMA and table["uri"].to_pylist() == want
        assert [f.uri for f in list_documents(str(tmp_path), StorageConfig(), include, exclude)] == want
        assert all(f.size == 4 * len(f.uri.split(f"{tmp_path}/", 1)[1]) for f in
                   list_documents(str(tmp_path), StorageConfig(), include, exclude))


def test_reconcile_over_many_parts_keeps_each_newest_commit(tmp_path):
    """200 parts of overlapping documents (retries, changed files) reconciled to the newest commit of each."""
    rng = random.Random(3)
    store = OutputStore(resolve(str(tmp_path / "out"), StorageConfig()))
    newest = {}
    for p in range(200):
        name = f"part-2026{p // 50:02d}01T000000Z-r-{p:06d}.parquet"
        uris = sorted({f"u{rng.randrange(2000)}" for _ in range(rng.randrange(1, 30))})
        docs = [empty_row(DOCUMENT_SCHEMA, run_id=name, uri=u, status="ok", attempt=p) for u in uris]
        pages = [empty_row(PAGE_SCHEMA, run_id=name, uri=u, page_index=i, page_count=2, text=f"{u}@{p}")
                 for u in uris for i in range(2)]
        for folder, rows, schema in ((store.pages_dir, pages, PAGE_SCHEMA),
                                     (store.documents_dir, docs, DOCUMENT_SCHEMA)):
            store.loc.fs.create_dir(folder, recursive=True)
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), f"{folder}/{name}", filesystem=store.loc.fs)
        newest.update({u: p for u in uris})
    expected = store.documents()  # before the repair: each URI's rows in its newest part, in part order
    expected = expected.filter(pa.array([newest[u] == a for u, a in zip(expected["uri"].to_pylist(),
                                                                          expected["attempt"].to_pylist())]))
    report = store.reconcile(["uri", "attempt", "run_id"])
    assert report.documents.equals(expected.select(["uri", "attempt", "run_id"]))
    assert report.documents.equals(store.documents(["uri", "attempt", "run_id"]))
    docs = store.documents()
    assert sorted(zip(docs["uri"].to_pylist(), docs["attempt"].to_pylist())) == sorted(newest.items())
    pages = Counter(zip(store.pages()["uri"].to_pylist(), store.pages()["text"].to_pylist()))
    assert pages == Counter({(u, f"{u}@{p}"): 2 for u, p in newest.items()})
    assert report.superseded_documents > 0 and store.reconcile().parts_rewritten == 0
    assert store.reconcile().documents is None and store.reconcile([]).documents.num_columns == 0
    assert store.page_models() == {} and store.page_model_table().num_rows == 0
