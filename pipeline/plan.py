"""Which listed documents this run processes, given what the output already holds (resume and backfill).

An archive's rerun lists a million documents of which most are done: the listing and the committed documents are
joined in Arrow, and only the documents that are not plainly done (new, changed, failed, parsed by another model)
reach Python, a slice at a time."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.outcomes import is_retryable
from pipeline.output import DocMeta
from pipeline.storage import LISTING_SCHEMA, ListedFile, listing_table

SLICE = 1 << 16  # rows turned into Python objects at a time
PLAN_COLUMNS = ["uri", "status", "error_kind", "size_bytes", "mtime_ns", "attempt"]  # of the documents table


@dataclass
class Plan:
    todo: dict[str, DocMeta] = field(default_factory=dict)  # uri -> what the document row will record
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    other_model: dict[str, list[str]] = field(default_factory=dict)  # done uri -> the other models that parsed it

    def summary(self) -> str:
        parts = [f"{len(self.todo)} to process"] + [f"{n} {reason}" for reason, n in sorted(self.skipped.items())]
        return ", ".join(parts)


def unique_listing(listed: pa.Table) -> pa.Table:
    """One row per URI of listings concatenated (inputs that overlap): a URI keeps its first place and its last
    listing, as a dict filled in listing order does."""
    if listed.num_rows == 0 or pc.count_distinct(listed["uri"]).as_py() == listed.num_rows:
        return listed
    ranked = listed.append_column("_i", pa.array(range(listed.num_rows), pa.int64()))
    spans = ranked.group_by("uri", use_threads=False).aggregate([("_i", "min"), ("_i", "max")]).sort_by("_i_min")
    return listed.take(spans["_i_max"])


def _other_models(page_models: dict[str, set[str]] | pa.Table | None, model_id: str) -> dict[str, list[str]]:
    """uri -> the models other than `model_id` that wrote its pages, for the URIs that have any."""
    if page_models is None:
        return {}
    if isinstance(page_models, dict):
        return {u: sorted(ms - {model_id}) for u, ms in page_models.items() if ms - {model_id}}
    named = pc.and_(pc.is_valid(page_models["model_id"]), pc.not_equal(page_models["model_id"], ""))
    theirs = page_models.filter(pc.and_(named, pc.not_equal(page_models["model_id"], model_id)))
    out: dict[str, set[str]] = {}
    for uri, model in zip(theirs["uri"].to_pylist(), theirs["model_id"].to_pylist()):
        out.setdefault(uri, set()).add(model)
    return {u: sorted(ms) for u, ms in out.items()}


def plan_run(listed: list[ListedFile] | pa.Table, committed: pa.Table, retry_failed: bool, max_attempts: int,
             limit: int | None = None, model_id: str | None = None,
             page_models: dict[str, set[str]] | pa.Table | None = None, reparse: bool = False) -> Plan:
    """A committed, unchanged (same size and mtime) document is skipped; a failed one is retried until it has
    failed `max_attempts` times, unless its failure is a fact about the file (pipeline.outcomes: encrypted, not a PDF,
    ...), which is recorded once; `retry_failed` processes failed documents only, whatever their kind and attempts. A done
    document whose pages another model wrote (`page_models`: uri -> model ids, or a table of (uri, model_id) rows) is
    parsed again with `reparse`, and listed in `other_model` otherwise.

    `listed` is a listing table (pipeline.storage.LISTING_SCHEMA) or ListedFile objects; `committed` holds at least
    the documents table's uri, status, error_kind, size_bytes, mtime_ns and attempt; where it holds a URI twice, its
    last row counts."""
    listed = listing_table(listed) if not isinstance(listed, pa.Table) else listed.select(LISTING_SCHEMA.names)
    others = _other_models(page_models, model_id) if model_id is not None else {}
    prev = committed.select(PLAN_COLUMNS)
    prev = prev.rename_columns(["uri", "status", "error_kind", "prev_size", "prev_mtime", "attempt"])
    if prev.num_rows and pc.count_distinct(prev["uri"]).as_py() < prev.num_rows:
        rows = prev.append_column("_j", pa.array(range(prev.num_rows), pa.int64()))
        prev = prev.take(rows.group_by("uri", use_threads=False).aggregate([("_j", "max")])["_j_max"])
    prev = prev.append_column("_seen", pa.repeat(pa.scalar(True), prev.num_rows))
    rows = listed.append_column("_i", pa.array(range(listed.num_rows), pa.int64()))
    rows = rows.join(prev, "uri", join_type="left outer")
    # plainly done: committed ok with the same size and mtime, its pages by no other model (a null compares unequal,
    # as None does in Python)
    same = pc.and_(pc.equal(rows["prev_size"], rows["size_bytes"]), pc.equal(rows["prev_mtime"], rows["mtime_ns"]))
    done = pc.fill_null(pc.and_(same, pc.equal(rows["status"], "ok")), False)
    if others:
        done = pc.and_(done, pc.invert(pc.is_in(rows["uri"], value_set=pa.array(list(others), pa.string()))))
    plan = Plan()
    n_done = pc.sum(done).as_py() or 0
    if n_done:
        plan.skipped["already done"] += n_done
    rest = rows.filter(pc.invert(done)).sort_by("_i")
    for start in range(0, rest.num_rows, SLICE):
        for r in rest.slice(start, SLICE).to_pylist():
            _plan_one(plan, r, retry_failed, max_attempts, limit, model_id, others, reparse)
    return plan


def _plan_one(plan: Plan, r: dict, retry_failed: bool, max_attempts: int, limit: int | None, model_id: str | None,
              others: dict[str, list[str]], reparse: bool) -> None:
    """One listed document (`r`: its listing and, `_seen`, its committed row) that is not plainly done."""
    uri = r["uri"]
    seen = bool(r["_seen"])
    changed = seen and (r["prev_size"], r["prev_mtime"]) != (r["size_bytes"], r["mtime_ns"])
    if not seen or changed:
        if retry_failed:
            plan.skipped["not failed before (--retry-failed)"] += 1
            return
        attempt = 1
    elif r["status"] == "ok":
        theirs = others.get(uri) if model_id is not None else None
        if not theirs:
            plan.skipped["already done"] += 1
            return
        if not reparse:
            plan.other_model[uri] = theirs
            plan.skipped["parsed by another model"] += 1
            return
        attempt = 1
    elif retry_failed:
        attempt = r["attempt"] + 1
    elif not is_retryable(r["error_kind"]):
        plan.skipped[f"{r['error_kind']} (not retried: --retry-failed forces)"] += 1
        return
    elif r["attempt"] < max_attempts:
        attempt = r["attempt"] + 1
    else:
        plan.skipped[f"failed {r['attempt']} times (use --retry-failed)"] += 1
        return
    if limit is not None and len(plan.todo) >= limit:
        plan.skipped["over --limit"] += 1
        return
    plan.todo[uri] = DocMeta(r["size_bytes"], r["mtime_ns"], attempt)
