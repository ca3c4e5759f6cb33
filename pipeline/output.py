"""The output layout and its commit protocol: each input document appears exactly once, whatever was interrupted.

    <output>/pages/part-<run_id>-<seq>.parquet       page rows (or one error row) of whole documents
    <output>/documents/part-<run_id>-<seq>.parquet   one row per document: the commit record of its pages part
    <output>/stats/<run_id>.parquet, runs/<run_id>.json   run statistics

A part is committed when its documents file exists; the pages file is written first. `reconcile` (run at the
start and end of every job) deletes pages parts whose documents part never landed (a crash between the two
writes) and, when a document (by URI) was committed more than once (a retry, or a changed file), keeps the
newest commit and rewrites the older parts without it. Each rewrite is atomic and idempotent, so a crash
during reconcile is repaired by the next one.

Every write and delete goes through pipeline.storage's write_parquet_atomic and delete_file, the points at which
tests/test_commit_crash.py stops the process to check each of the claims above.
"""
from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from pipeline.outcomes import is_retryable
from pipeline.redact import redact
from pipeline.schema import DOCUMENT_SCHEMA, PAGE_SCHEMA, empty_row
from pipeline.storage import Location, delete_file, list_parquet, read_parquet, retrying, write_parquet_atomic


PARTS_PER_SCAN = 256  # parts read at once and held (OutputStore._scan)
READ_THREADS = 16  # their reads in flight: object stores answer each after a round trip


@dataclass(frozen=True, slots=True)  # one per planned document: a million of them on a first run of an archive
class DocMeta:
    size_bytes: int
    mtime_ns: int
    attempt: int


@dataclass
class ReconcileReport:
    orphan_parts_removed: int = 0
    superseded_documents: int = 0
    parts_rewritten: int = 0
    # reconcile(columns): those columns of the committed rows as the output now holds them, from reconcile's own scan
    documents: pa.Table | None = field(default=None, repr=False)


class DocumentAssembler:
    """Gathers page rows, which arrive in any order and possibly twice (a retried task), into whole documents."""

    def __init__(self):
        self._pending: dict[str, dict[int, dict]] = defaultdict(dict)
        self._closed: set[str] = set()

    def add(self, row: dict) -> list[dict] | None:
        """Returns the document's rows once it is complete, else None."""
        uri = row["uri"]
        if uri in self._closed:
            return None  # a late page of a document that already failed, or a duplicate from a retried task
        if row["page_index"] < 0:  # a document-level failure replaces whatever pages arrived
            self._pending.pop(uri, None)
            self._closed.add(uri)
            return [row]
        pages = self._pending[uri]
        pages[row["page_index"]] = row
        if len(pages) < row["page_count"]:
            return None
        self._closed.add(uri)
        return [pages[i] for i in sorted(self._pending.pop(uri))]

    def incomplete(self) -> list[tuple[str, int, int]]:
        """(uri, pages received, pages expected) of documents the stream never finished."""
        return [(u, len(p), next(iter(p.values()))["page_count"]) for u, p in self._pending.items() if p]


def document_row(run_id: str, rows: list[dict], meta: DocMeta, max_pages: int) -> dict:
    first = rows[0]
    failed = first["page_index"] < 0
    statuses = [r["status"] for r in rows] if not failed else []
    # a retryable page error first: its kind decides whether a later run tries the document again
    page_errors = sorted((r for r in rows if r["status"] == "error"), key=lambda r: not is_retryable(r["error_kind"])
                         ) if not failed else []
    status = "error" if failed or page_errors else "ok"
    err = first if failed else (page_errors[0] if page_errors else None)
    return empty_row(
        DOCUMENT_SCHEMA, run_id=run_id, uri=first["uri"], sha256=first["sha256"], size_bytes=meta.size_bytes,
        mtime_ns=meta.mtime_ns, status=status, error_kind=err["error_kind"] if err else None,
        error=(err["error"] if failed else f"{len(page_errors)} page(s) failed; first: {err['error']}") if err else None,
        total_pages=first["total_pages"] or 0, pages=0 if failed else len(rows),
        pages_ok=statuses.count("ok"), pages_blank=statuses.count("blank"), pages_fallback=statuses.count("fallback"),
        pages_error=len(page_errors),
        truncated=bool((first["total_pages"] or 0) > max_pages),
        prompt_tokens=sum(r["prompt_tokens"] or 0 for r in rows), output_tokens=sum(r["output_tokens"] or 0 for r in rows),
        attempt=meta.attempt, raster_s=sum(r["raster_s"] or 0.0 for r in rows),
        parse_s=sum(r["parse_s"] or 0.0 for r in rows), committed_at=datetime.now(timezone.utc),
    )


def _redact_errors(rows: list[dict]) -> list[dict]:
    """Rows with their `error` redacted: it quotes storage errors, URIs and MuPDF as they were, from any worker."""
    return [dict(r, error=redact(r["error"])) if r.get("error") else r for r in rows]


@dataclass
class OutputStore:
    loc: Location
    _seq: int = field(default=0, init=False)

    @property
    def pages_dir(self) -> str:
        return self.loc.join("pages")

    @property
    def documents_dir(self) -> str:
        return self.loc.join("documents")

    def _part(self, directory: str, name: str) -> str:
        return f"{directory}/{name}"

    def commit(self, run_id: str, page_rows: list[dict], doc_rows: list[dict]) -> str:
        """Writes one part: pages first, then the documents file that makes it visible. Returns the part name."""
        self._seq += 1
        name = f"part-{run_id}-{self._seq:06d}.parquet"
        page_rows, doc_rows = _redact_errors(page_rows), _redact_errors(doc_rows)
        write_parquet_atomic(self.loc.fs, self._part(self.pages_dir, name), pa.Table.from_pylist(page_rows, schema=PAGE_SCHEMA))
        write_parquet_atomic(self.loc.fs, self._part(self.documents_dir, name), pa.Table.from_pylist(doc_rows, schema=DOCUMENT_SCHEMA))
        return name

    def _read(self, path: str, schema: pa.Schema) -> pa.Table:
        return read_parquet(self.loc.fs, path, schema=schema)

    def _scan(self, paths: list[str], schema: pa.Schema, columns: list[str] | None = None,
              where: pc.Expression | None = None) -> Iterator[tuple[int, pa.RecordBatch]]:
        """(index in `paths`, batch) of the parts' rows, in the order of `paths`.

        An archive's output holds tens of thousands of small parts, each an open and a footer read: one at a time the
        15 k parts of a 1 M-document output take minutes, so PARTS_PER_SCAN of them are read at once on READ_THREADS
        threads. Each is read whole and retried as storage.read_parquet does (a read cut off inside pyarrow's Parquet
        reader would be ArrowInvalid, a damaged file's error, and never retried), and at most PARTS_PER_SCAN are held
        at a time. A part without a column of `schema` (an older version's) reads it as nulls, as _read does."""
        kwargs = dict(schema=schema, columns=columns, filters=where)
        with ThreadPoolExecutor(READ_THREADS) as pool:
            for first in range(0, len(paths), PARTS_PER_SCAN):
                group = paths[first : first + PARTS_PER_SCAN]
                tables = pool.map(lambda path: read_parquet(self.loc.fs, path, **kwargs), group)
                for i, table in enumerate(tables):
                    for batch in table.to_batches():
                        yield first + i, batch

    def _read_parts(self, paths: list[str], schema: pa.Schema, columns: list[str] | None = None) -> pa.Table:
        """The parts' rows in the order of `paths`."""
        out = pa.schema([schema.field(c) for c in columns]) if columns else schema
        return pa.Table.from_batches([b for _, b in self._scan(paths, schema, columns)], out)

    def documents(self, columns: list[str] | None = None) -> pa.Table:
        """All committed document rows (after reconcile: one per URI); `columns` reads only those."""
        return self._read_parts(list_parquet(self.loc.fs, self.documents_dir), DOCUMENT_SCHEMA, columns)

    def _committed_page_parts(self) -> list[str]:
        """Pages files whose documents file exists (a part is committed once its documents file is written)."""
        committed = {p.rsplit("/", 1)[1] for p in list_parquet(self.loc.fs, self.documents_dir)}
        return [p for p in list_parquet(self.loc.fs, self.pages_dir) if p.rsplit("/", 1)[1] in committed]

    def pages(self) -> pa.Table:
        """Committed page rows: only parts whose documents file exists."""
        return self._read_parts(self._committed_page_parts(), PAGE_SCHEMA)

    def page_model_table(self) -> pa.Table:
        """The distinct (uri, model_id) of committed page rows that name a model (two columns read, not the text).

        Deduplicated as it streams, a million rows at a time: a document's pages sit in one part, so the table held
        is about one row per document, not one per page."""
        out = pa.schema([("uri", pa.string()), ("model_id", pa.string())])
        parts = self._committed_page_parts()
        if not parts:
            return out.empty_table()
        named = pc.field("model_id").is_valid() & (pc.field("model_id") != "")

        def distinct(batches: list[pa.RecordBatch]) -> pa.Table:
            return pa.Table.from_batches(batches, out).group_by(["uri", "model_id"]).aggregate([])

        done, batches, rows = [], [], 0
        for _, batch in self._scan(parts, PAGE_SCHEMA, ["uri", "model_id"], named):
            batches.append(batch)
            rows += batch.num_rows
            if rows >= 1 << 20:
                done.append(distinct(batches))
                batches, rows = [], 0
        done.append(distinct(batches))
        return distinct([b for t in done for b in t.to_batches()]) if len(done) > 1 else done[0]

    def page_models(self) -> dict[str, set[str]]:
        """uri -> the model ids of its committed page rows."""
        models: dict[str, set[str]] = {}
        t = self.page_model_table()
        for uri, model in zip(t.column("uri").to_pylist(), t.column("model_id").to_pylist()):
            models.setdefault(uri, set()).add(model)
        return models

    def reconcile(self, columns: list[str] | None = None) -> ReconcileReport:
        """Repairs the output (see the module's docstring). With `columns`, report.documents holds those columns of
        every committed row once repaired, in documents()' order: the scan that found the superseded rows read
        them, so a planner need not read every part again."""
        report = ReconcileReport()
        fs = self.loc.fs
        doc_parts = {p.rsplit("/", 1)[1]: p for p in list_parquet(fs, self.documents_dir)}
        for path in list_parquet(fs, self.pages_dir):
            if path.rsplit("/", 1)[1] not in doc_parts:
                delete_file(fs, path)
                report.orphan_parts_removed += 1
        # Part names sort by run start time, then sequence: the last part holding a URI is its newest commit. The URIs
        # of every part are read in one scan and compared in Arrow: a million documents are a million rows, not
        # Python strings.
        names = sorted(doc_parts)
        read = ["uri"] + [c for c in columns or [] if c != "uri"]
        batches, part = [], []
        for i, batch in self._scan([doc_parts[n] for n in names], DOCUMENT_SCHEMA, read):
            batches.append(batch)
            part.append(pa.repeat(pa.scalar(i, pa.int32()), batch.num_rows))
        held = pa.Table.from_batches(batches, pa.schema([DOCUMENT_SCHEMA.field(c) for c in read]))
        held = held.append_column("part", pa.chunked_array(part, pa.int32()))
        held = held.append_column("row", pa.array(range(held.num_rows), pa.int64()))
        held = held.join(held.group_by("uri").aggregate([("part", "max")]), "uri")
        newest = pc.equal(held["part"], held["part_max"])
        if columns is not None:  # what the rewrites below leave: each URI's rows in its newest part
            report.documents = held.filter(newest).sort_by("row").select(columns)
        stale = held.filter(pc.invert(newest)).group_by(["part", "uri"]).aggregate([])
        stale_by_part: dict[str, list[str]] = {}
        for i, uri in zip(stale["part"].to_pylist(), stale["uri"].to_pylist()):
            stale_by_part.setdefault(names[i], []).append(uri)
        for name in sorted(stale_by_part):
            stale = sorted(stale_by_part[name])
            report.superseded_documents += len(stale)
            report.parts_rewritten += 1
            keep = lambda t: t.filter(pc.invert(pc.is_in(t.column("uri"), value_set=pa.array(stale, pa.string()))))
            pages_path, docs_path = self._part(self.pages_dir, name), doc_parts[name]
            pages_exist = retrying(f"stat {pages_path}", fs.get_file_info, pages_path).type != pafs.FileType.NotFound  # gone if a delete was cut short
            pages = keep(self._read(pages_path, PAGE_SCHEMA)) if pages_exist else PAGE_SCHEMA.empty_table()
            docs = keep(self._read(docs_path, DOCUMENT_SCHEMA))
            if docs.num_rows == 0:
                # documents first: cut short here, the pages file is an orphan the next reconcile deletes, and no
                # documents file points at a missing pages file (pages_exist: outputs of older versions may have one)
                delete_file(fs, docs_path)
                if pages_exist:
                    delete_file(fs, pages_path)
            else:
                write_parquet_atomic(fs, pages_path, pages)
                write_parquet_atomic(fs, docs_path, docs)
        return report
