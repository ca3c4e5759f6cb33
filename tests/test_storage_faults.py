"""Storage that misbehaves: the job's own storage code (pipeline.storage, pipeline.output, the rasterize stage) pointed
at tests/fault_proxy.py in front of the S3 and GCS test servers, which throttles, answers 5xx, resets connections
mid-body and stalls. Ray-free: the whole job under faults is bench/storage_faults.py."""
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

import pipeline.storage as storage
from conftest import ObjectStore
from fault_proxy import FaultProxy, Rule
from faults import pdf_pages
from pipeline.config import StorageConfig, load_config
from pipeline.job import _stream_and_commit, prepare
from pipeline.outcomes import is_retryable
from pipeline.output import OutputStore
from pipeline.schema import PAGE_SCHEMA, empty_row
from pipeline.stages import RasterizeStage
from pipeline.stats import RunStats
from test_commit_crash import (DRIVER_RUN, assert_exactly_once, assert_no_lost_page, drive, earlier_output, resume,
                               texts_of)

# slow: backoff waits and retry budgets spent on purpose, ~5 min in all (make test-system runs them)
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
MIX = ("slowdown", "throttle", "error", "reset")


@pytest.fixture
def faulty(object_store: ObjectStore, monkeypatch):
    """(the store, a fault proxy in front of its server, the job's storage config pointed at the proxy). The
    store's own `fs` reaches the server directly: setup and inspection see no faults."""
    monkeypatch.setattr(storage, "STORAGE_BACKOFF_S", 0.05)  # the same tries, shorter waits
    monkeypatch.setattr(storage, "STORAGE_BACKOFF_CAP_S", 0.2)
    storage.RETRIES.clear()
    key = "s3_endpoint" if object_store.scheme == "s3" else "gcs_endpoint"
    proxy = FaultProxy(object_store.storage[key], "s3" if object_store.scheme == "s3" else "gcs", seed=7)
    cfg = StorageConfig(**{**object_store.storage, key: proxy.url}, request_timeout_s=2, retry_time_limit_s=1)
    yield object_store, proxy, cfg
    proxy.close()


def through(cfg: StorageConfig, store: ObjectStore, path: str) -> OutputStore:
    return OutputStore(storage.resolve(store.uri(path), cfg))


def test_transient_faults_on_list_read_and_write_are_retried_to_success(faulty):
    store, proxy, cfg = faulty
    b = store.new_bucket()
    docs = {f"{b}/in/d{i}.pdf": bytes([i]) * (20_000 + i) for i in range(6)}
    for path, data in docs.items():
        store.put(path, data)
    proxy.set_rules(*(Rule("*", f, rate=0.06) for f in MIX))  # about 1 request in 4

    listed = storage.list_documents(store.uri(f"{b}/in"), cfg, ["*.pdf"], [])
    assert [f.uri for f in listed] == sorted(store.uri(p) for p in docs)
    fs = storage.resolve(store.uri(b), cfg).fs
    assert all(storage.read_bytes(fs, store.uri(p)) == data for p, data in docs.items())
    out = through(cfg, store, f"{b}/out")
    drive(out, DRIVER_RUN)
    out.reconcile()
    assert_exactly_once(out, texts_of({"a": 2, "b": 0, "c": 3}))

    assert proxy.faults() >= 5, (proxy.injected, proxy.seen)
    assert set(k for k, _ in proxy.injected) >= {"list", "get", "put"}, proxy.injected


@pytest.mark.parametrize("kind", ["list", "get", "put", "delete"])
def test_a_store_that_keeps_failing_fails_the_operation_after_a_bounded_number_of_requests(faulty, kind):
    store, proxy, cfg = faulty
    b = store.new_bucket()
    store.put(f"{b}/in/a.pdf", b"%PDF-1.7 " * 1000)
    fs = storage.resolve(store.uri(b), cfg).fs
    op = {"list": lambda: storage.list_parquet(fs, f"{b}/in"),
          "get": lambda: storage.read_bytes(fs, store.uri(f"{b}/in/a.pdf")),
          "put": lambda: storage.write_parquet_atomic(fs, f"{b}/out/x.parquet", pa.table({"a": [1]})),
          "delete": lambda: storage.delete_file(fs, f"{b}/in/a.pdf")}[kind]
    proxy.set_rules(Rule(kind, "slowdown", rate=1.0))
    with pytest.raises(OSError) as e:
        op()
    assert not isinstance(e.value, FileNotFoundError), e.value  # a throttled store is not a missing object
    # S3: 3 tries of each request (the AWS SDK) per try of the operation; GCS: as many as fit in retry_time_limit_s
    per_try = 3 if store.scheme == "s3" else 6
    assert 2 <= proxy.seen[kind] <= storage.STORAGE_TRIES * per_try, proxy.seen
    assert storage.RETRIES[{"list": "list", "get": "read", "put": "write", "delete": "delete"}[kind]] == \
        storage.STORAGE_TRIES - 1


def test_a_document_whose_reads_keep_failing_is_one_retryable_error_row_and_the_rest_are_committed(
        faulty, tiny_checkpoint, tmp_path):
    store, proxy, cfg = faulty
    b = store.new_bucket()
    for name in ("a", "bad", "c"):
        store.put(f"{b}/in/{name}.pdf", pdf_pages(False, False))
    job = load_config(None, {"input": {"uris": [store.uri(f"{b}/in")]}, "output": store.uri(f"{b}/out"),
                             "storage": cfg.model_dump(), "run": {"commit_every_docs": 1, "num_cpus": 2},
                             "model": {"checkpoint": str(tiny_checkpoint), "device": "cpu"}})
    proxy.set_rules(Rule("get", "error", rate=1.0, path=r"bad\.pdf"), *(Rule("*", f, rate=0.05) for f in MIX))
    prep = prepare(job)  # reconcile and listing go through the proxy too
    stage = RasterizeStage(cfg, prep.raster, page_timeout_s=30, memory_limit_mb=2048)

    class Dataset:  # what the engine stage hands the driver, without Ray or a model: the drawn pages, read as text
        def iter_batches(self, **_):
            for uri in prep.plan.todo:
                for t in stage(pa.table({"uri": [uri]})):
                    rows = [empty_row(PAGE_SCHEMA, **{k: r[k] for k in ("uri", "sha256", "page_index", "page_count",
                                                                           "total_pages", "status", "error_kind",
                                                                           "error")}, run_id=prep.run_id, text="t")
                            for r in t.to_pylist()]
                    yield pa.Table.from_pylist(rows, schema=PAGE_SCHEMA)

    _stream_and_commit(Dataset(), prep, RunStats(prep.run_id, 1, 0, 0.0), 0.0, echo=lambda *_: None)
    stage.renderer.close()
    proxy.set_rules()
    out = OutputStore(prep.store.loc)
    out.reconcile()
    docs = {d["uri"].rsplit("/", 1)[1]: d for d in out.documents().to_pylist()}
    assert sorted(docs) == ["a.pdf", "bad.pdf", "c.pdf"]
    assert [docs[n]["status"] for n in ("a.pdf", "c.pdf")] == ["ok", "ok"]
    bad = docs["bad.pdf"]
    assert (bad["status"], bad["error_kind"], bad["pages"]) == ("error", "unreadable", 0), bad
    assert is_retryable(bad["error_kind"]) and "cannot read the file" in bad["error"]
    pages = Counter(p["uri"].rsplit("/", 1)[1] for p in out.pages().to_pylist())
    assert pages == {"a.pdf": 2, "c.pdf": 2, "bad.pdf": 1}
    assert proxy.injected[("get", "error")] >= storage.STORAGE_TRIES


def puts_of_a_clean_run(store, proxy, cfg, b) -> int:
    proxy.reset_counts()
    drive(through(cfg, store, f"{b}/probe"), DRIVER_RUN)
    return proxy.seen["put"]


def test_commit_writes_that_fail_for_good_leave_the_promised_output_and_a_rerun_completes_it(faulty, monkeypatch):
    """Every write of the commit protocol refused from the k-th request on (for each k): the commit raises, no
    document is both committed and not, no pages part is visible without its record, and a rerun commits exactly
    the missing documents."""
    store, proxy, cfg = faulty
    monkeypatch.setattr(storage, "STORAGE_TRIES", 2)  # what a spent budget leaves does not depend on its size
    b = store.new_bucket()
    puts = puts_of_a_clean_run(store, proxy, cfg, b)
    expected = texts_of({"a": 2, "b": 0, "c": 3})
    raised = 0
    for k in range(0, puts, max(1, puts // 8)):  # S3 puts directory markers too: a sample of the stops
        out = through(cfg, store, f"{b}/out{k}")
        proxy.set_rules(Rule("put", "error", rate=1.0, skip=k))
        try:
            drive(out, DRIVER_RUN)
        except OSError:
            raised += 1
        proxy.set_rules()
        assert_no_lost_page(out)
        assert_exactly_once(resume(out), expected)
    assert raised >= 2, raised  # each of the parts could not be committed at some k


def test_reconcile_with_listings_failing_for_good_deletes_nothing_committed(faulty):
    """A listing that fails must not read as an empty folder: reconcile would take every pages part for an orphan."""
    store, proxy, cfg = faulty
    b = store.new_bucket()
    out = earlier_output(through(cfg, store, f"{b}/out"))
    # every listing, every one after the first, and the documents listing alone: on GCS that one, read as an empty
    # folder, once made reconcile delete all 4 pages parts of the 3 committed ones
    for rule in (Rule("list", "slowdown", rate=1.0), Rule("list", "slowdown", rate=1.0, skip=1),
                 Rule("list", "slowdown", rate=1.0, path="documents")):
        proxy.set_rules(rule)
        with pytest.raises(OSError):
            OutputStore(out.loc).reconcile()
        proxy.set_rules()
        assert_no_lost_page(out)
    again = OutputStore(out.loc)
    again.reconcile()
    assert_exactly_once(again, texts_of({"y": 2, "x": 3, "z": 2}))


def test_commit_and_reconcile_under_transient_faults_give_every_document_once(faulty):
    store, proxy, cfg = faulty
    b = store.new_bucket()
    out = earlier_output(through(cfg, store, f"{b}/out"))
    proxy.set_rules(*(Rule(k, f, rate=0.08) for k in ("list", "get", "put", "delete") for f in MIX[::3]))
    OutputStore(out.loc).reconcile()
    proxy.set_rules()
    assert_exactly_once(OutputStore(out.loc), texts_of({"y": 2, "x": 3, "z": 2}))
    assert proxy.faults() >= 1, proxy.seen


@pytest.mark.parametrize("object_store", ["s3"], indirect=True)
def test_a_stalled_read_is_cut_by_the_request_timeout_and_tried_again(faulty):
    """S3's request_timeout_s abandons a try that receives nothing. (GCS's client does not expose its per-try
    stall timeout, 120 s: docs/storage.md.)"""
    store, proxy, cfg = faulty
    b = store.new_bucket()
    store.put(f"{b}/in/a.pdf", b"x" * 50_000)
    fs = storage.resolve(store.uri(b), cfg).fs
    proxy.set_rules(Rule("get", "stall", next_n=1, stall_s=60))
    t = time.perf_counter()
    assert storage.read_bytes(fs, store.uri(f"{b}/in/a.pdf")) == b"x" * 50_000
    took = time.perf_counter() - t
    assert cfg.request_timeout_s <= took < 4 * cfg.request_timeout_s, took
    assert proxy.injected[("get", "stall")] == 1
    proxy.set_rules(Rule("get", "stall", rate=1.0, stall_s=60))  # every try stalls: bounded, then an error
    t = time.perf_counter()
    with pytest.raises(OSError):
        storage.read_bytes(fs, store.uri(f"{b}/in/a.pdf"))
    assert time.perf_counter() - t < storage.STORAGE_TRIES * 3 * (cfg.request_timeout_s + 1) + 2


def test_a_checkpoint_copy_under_transient_faults_is_byte_identical(faulty, tiny_checkpoint, tmp_path):
    from pipeline.checkpoint import localize

    store, proxy, cfg = faulty
    b = store.new_bucket()
    store.upload_tree(tiny_checkpoint, f"{b}/models/tiny")
    proxy.set_rules(*(Rule(k, f, rate=0.03) for k in ("list", "get") for f in MIX))
    local = Path(localize(store.uri(f"{b}/models/tiny"), cfg, str(tmp_path / "cache")))
    for f in tiny_checkpoint.rglob("*"):
        if f.is_file():
            assert (local / f.relative_to(tiny_checkpoint)).read_bytes() == f.read_bytes(), f
    assert proxy.faults() >= 1, proxy.seen


@pytest.mark.parametrize("fault", ["slowdown", "error"])
def test_a_store_that_keeps_answering_5xx_is_named_as_answering_not_as_unreachable(faulty, fault):
    """An operation that spent its tries on 503s or 500s says what the store answered (a server that answers is
    reached), and that it is worth running again; not "cannot reach", which sends an operator to the network."""
    store, proxy, cfg = faulty
    b = store.new_bucket()
    store.put(f"{b}/in/a.pdf", b"%PDF-1.7 " * 100)
    fs = storage.resolve(store.uri(b), cfg).fs
    uri = store.uri(f"{b}/in/a.pdf")
    proxy.set_rules(Rule("get", fault, rate=1.0))
    with pytest.raises(OSError) as e:
        storage.read_bytes(fs, uri)
    said = storage.explain(uri, e.value, cfg)
    assert "cannot reach" not in said and "no answer" not in said, said
    name, url = ("S3", cfg.s3_endpoint) if store.scheme == "s3" else ("GCS", cfg.gcs_endpoint)
    # S3 gives the status; google-cloud-cpp gives its own status and the store's last message instead
    answer = f"HTTP {503 if fault == 'slowdown' else 500}" if store.scheme == "s3" else "UNAVAILABLE ('injected by"
    assert said.startswith(f"the {name} endpoint {url} answered {answer}"), said
    assert f"for {uri} on every try: it is reached but failing or throttling; run again later" in said, said
