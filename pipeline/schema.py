"""Explicit Arrow schemas for every stage, so no block ever infers a type from its own rows (schema drift)."""
from __future__ import annotations

import pyarrow as pa

# Listing -> rasterizer: one row per document to process.
DOC_TASK_SCHEMA = pa.schema([
    ("uri", pa.string()),
    ("size_bytes", pa.int64()),
    ("mtime_ns", pa.int64()),
    ("attempt", pa.int32()),
])

# Rasterizer -> parser: one row per rendered page, or one row (page_index -1) for a document that failed.
RASTER_SCHEMA = pa.schema([
    ("uri", pa.string()),
    ("sha256", pa.string()),
    ("page_index", pa.int32()),
    ("page_count", pa.int32()),  # pages this document emits (after max_pages_per_doc)
    ("total_pages", pa.int32()),  # pages in the file
    ("status", pa.string()),  # ok | blank (no image: not read) | error (one page's, or the document's at index -1)
    ("error_kind", pa.string()),
    ("error", pa.string()),
    ("image", pa.large_binary()),  # raw H x W x 3 uint8
    ("image_height", pa.int32()),
    ("image_width", pa.int32()),
    ("text_layer", pa.string()),
    ("raster_s", pa.float64()),
    # the page drawn again at other sizes (RasterOptions.block_scales after the first), each as `image` is
    ("views", pa.list_(pa.struct([("image", pa.large_binary()), ("height", pa.int32()), ("width", pa.int32())]))),
])

# Parser -> output: the pages table (no image bytes).
PAGE_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("uri", pa.string()),
    ("sha256", pa.string()),
    ("page_index", pa.int32()),  # -1 on a document's error row
    ("page_count", pa.int32()),  # pages of this document in this table
    ("total_pages", pa.int32()),  # pages in the file (more than page_count when max_pages_per_doc cut it)
    ("image_height", pa.int32()),
    ("image_width", pa.int32()),
    # ok | blank (nothing drawn on the page: not read) | fallback (text layer used after an engine failure) | error
    # (pipeline/outcomes.py, docs/outcomes.md)
    ("status", pa.string()),
    ("error_kind", pa.string()),
    ("error", pa.string()),
    ("text", pa.string()),
    ("text_layer", pa.string()),
    ("prompt_tokens", pa.int32()),
    ("output_tokens", pa.int32()),
    ("finish_reason", pa.string()),
    ("loop_dropped_tokens", pa.int32()),  # output tokens left out of `text` as a loop's repeats (model.loop_drop_tokens)
    ("read_by", pa.string()),  # page | blocks: whose read `text` is (model.block_lines: a page read in blocks too)
    # speculative decoding (model.drafter), over every read of the page: verify steps, drafts proposed and accepted,
    # both by position in the block, and tau, the mean tokens a verify step gave (null without a drafter)
    ("spec_steps", pa.int32()),
    ("spec_drafted", pa.int32()),
    ("spec_accepted", pa.int32()),
    ("spec_drafted_by_pos", pa.list_(pa.int32())),
    ("spec_accepted_by_pos", pa.list_(pa.int32())),
    ("spec_tau", pa.float64()),
    ("backend", pa.string()),
    ("model_id", pa.string()),
    ("raster_s", pa.float64()),
    ("ttft_s", pa.float64()),
    ("decode_s", pa.float64()),
    ("parse_s", pa.float64()),
    ("engine_s", pa.float64()),  # this page's share of the engine's busy time (shares sum to it)
    # wall clock (unix s) when the engine call holding this page began and returned (the pages of one call share
    # them): pages/s over time and the steady window of a benchmark report (pipeline/report.py)
    ("parse_started_unix", pa.float64()),
    ("parse_ended_unix", pa.float64()),
])

DOCUMENT_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("uri", pa.string()),
    ("sha256", pa.string()),
    ("size_bytes", pa.int64()),
    ("mtime_ns", pa.int64()),
    ("status", pa.string()),  # ok | error (the document's error row, or a page in error: its kind, a retryable first)
    ("error_kind", pa.string()),
    ("error", pa.string()),
    ("total_pages", pa.int32()),
    ("pages", pa.int32()),  # rows in the pages table (0 for a failed document, which has one error row)
    ("pages_ok", pa.int32()),
    ("pages_fallback", pa.int32()),
    ("pages_blank", pa.int32()),
    ("pages_error", pa.int32()),
    ("truncated", pa.bool_()),  # total_pages > max_pages_per_doc
    ("prompt_tokens", pa.int64()),
    ("output_tokens", pa.int64()),
    ("attempt", pa.int32()),
    ("raster_s", pa.float64()),
    ("parse_s", pa.float64()),
    ("committed_at", pa.timestamp("us", tz="UTC")),
])

STATS_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("metric", pa.string()),
    ("value", pa.float64()),
])


def empty_row(schema: pa.Schema, **values) -> dict:
    row = {name: None for name in schema.names}
    unknown = set(values) - set(row)
    if unknown:
        raise KeyError(f"not in schema: {sorted(unknown)}")
    row.update(values)
    return row
