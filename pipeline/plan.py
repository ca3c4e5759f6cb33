"""Which listed documents this run processes, given what the output already holds (resume and backfill)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from pipeline.outcomes import is_retryable
from pipeline.output import DocMeta
from pipeline.storage import ListedFile


@dataclass
class Plan:
    todo: dict[str, DocMeta] = field(default_factory=dict)  # uri -> what the document row will record
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    other_model: dict[str, list[str]] = field(default_factory=dict)  # done uri -> the other models that parsed it

    def summary(self) -> str:
        parts = [f"{len(self.todo)} to process"] + [f"{n} {reason}" for reason, n in sorted(self.skipped.items())]
        return ", ".join(parts)


def plan_run(listed: list[ListedFile], committed: pa.Table, retry_failed: bool, max_attempts: int,
             limit: int | None = None, model_id: str | None = None, page_models: dict[str, set[str]] | None = None,
             reparse: bool = False) -> Plan:
    """A committed, unchanged (same size and mtime) document is skipped; a failed one is retried until it has
    failed `max_attempts` times, unless its failure is a fact about the file (pipeline.outcomes: encrypted, not a PDF,
    ...), which is recorded once; `retry_failed` processes failed documents only, whatever their kind and attempts. A done
    document whose pages another model wrote (`page_models`: uri -> model ids) is parsed again with `reparse`, and
    listed in `other_model` otherwise."""
    last = {r["uri"]: r for r in committed.select(["uri", "status", "error_kind", "size_bytes", "mtime_ns", "attempt"]).to_pylist()}
    plan = Plan()
    for f in listed:
        prev = last.get(f.uri)
        changed = prev is not None and (prev["size_bytes"], prev["mtime_ns"]) != (f.size, f.mtime_ns)
        if prev is None or changed:
            if retry_failed:
                plan.skipped["not failed before (--retry-failed)"] += 1
                continue
            attempt = 1
        elif prev["status"] == "ok":
            others = (page_models or {}).get(f.uri, set()) - {model_id}
            if model_id is None or not others:
                plan.skipped["already done"] += 1
                continue
            if not reparse:
                plan.other_model[f.uri] = sorted(others)
                plan.skipped["parsed by another model"] += 1
                continue
            attempt = 1
        elif retry_failed:
            attempt = prev["attempt"] + 1
        elif not is_retryable(prev["error_kind"]):
            plan.skipped[f"{prev['error_kind']} (not retried: --retry-failed forces)"] += 1
            continue
        elif prev["attempt"] < max_attempts:
            attempt = prev["attempt"] + 1
        else:
            plan.skipped[f"failed {prev['attempt']} times (use --retry-failed)"] += 1
            continue
        if limit is not None and len(plan.todo) >= limit:
            plan.skipped["over --limit"] += 1
            continue
        plan.todo[f.uri] = DocMeta(f.size, f.mtime_ns, attempt)
    return plan
