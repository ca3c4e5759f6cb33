"""The Ray Data stage callables: documents -> page rows (CPU actors) -> parsed page rows (one engine per actor).

Each returns Arrow tables with an explicit schema (pipeline/schema.py) and never raises for a bad document:
failures become rows, so `max_errored_blocks` is never needed and nothing is dropped silently.
"""
from __future__ import annotations

import hashlib
import threading
import time
from typing import Iterator

import numpy as np
import pyarrow as pa

from engine.interface import SpecStats
from pipeline.blocks import BlockReading, merge_block_results, prefer_blocks, read_blocks, voted_result
from pipeline.checkpoint import localize
from pipeline.config import StorageConfig
from pipeline.isolation import IsolatedRasterizer
from pipeline.rasterize import DocumentError, PageFailure, RasterOptions, RenderedPage, filetype_for
from pipeline.redact import install_log_redaction
from pipeline.schema import PAGE_SCHEMA, RASTER_SCHEMA, empty_row
from pipeline.storage import explain, read_bytes, resolve


def _error_row(uri: str, sha256: str | None, kind: str, message: str) -> dict:
    return empty_row(RASTER_SCHEMA, uri=uri, sha256=sha256, page_index=-1, page_count=0, total_pages=0,
                     status="error", error_kind=kind, error=message, raster_s=0.0)


def blank_note(page: RenderedPage) -> str | None:
    """A blank page drawn while MuPDF warned (a JBIG2 image or a content stream that did not decode) is not plainly
    blank: its row's `error` says so, with MuPDF's words. None for a plain blank page and for a page with ink."""
    if not (page.blank and page.warnings):
        return None
    return (f"drawn blank, but MuPDF reported problems while drawing it, so content may have failed to draw: "
            f"{page.warnings}")


def _raster_row(uri: str, sha256: str, count: int, total: int, page: RenderedPage | PageFailure) -> dict:
    """A drawn page's row (status ok, or blank: the model skips it), or a page that failed its error row."""
    if isinstance(page, PageFailure):
        return empty_row(RASTER_SCHEMA, uri=uri, sha256=sha256, page_index=page.index, page_count=count,
                         total_pages=total, status="error", error_kind=page.kind, error=page.message, raster_s=0.0)
    h, w, _ = page.image.shape
    return empty_row(
        RASTER_SCHEMA, uri=uri, sha256=sha256, page_index=page.index, page_count=count, total_pages=total,
        status="blank" if page.blank else "ok", error=blank_note(page),
        image=None if page.blank else page.image.tobytes(), image_height=h,
        image_width=w, text_layer=page.text_layer, raster_s=page.render_s,
        views=[] if page.blank else [{"image": v.tobytes(), "height": v.shape[0], "width": v.shape[1]}
                                     for v in page.views],
    )


class RasterizeStage:
    """One document per call (batch_size=1); yields page rows in small tables so big documents stream."""

    def __init__(self, storage: StorageConfig, opts: RasterOptions, page_timeout_s: float, memory_limit_mb: int,
                 max_lost_pages: int = 2, rows_per_table: int = 8):
        install_log_redaction()  # an actor is its own process: its log records are redacted there
        self.storage = storage
        self._filesystems: dict[str, object] = {}  # scheme -> filesystem, built once per actor
        self.renderer = IsolatedRasterizer(opts, page_timeout_s, memory_limit_mb, max_lost_pages)
        self.rows_per_table = rows_per_table

    def __call__(self, batch: pa.Table) -> Iterator[pa.Table]:
        for uri in batch.column("uri").to_pylist():
            rows: list[dict] = []
            for row in self._document_rows(uri):
                rows.append(row)
                if len(rows) >= self.rows_per_table:
                    yield pa.Table.from_pylist(rows, schema=RASTER_SCHEMA)
                    rows = []
            if rows:
                yield pa.Table.from_pylist(rows, schema=RASTER_SCHEMA)

    def _document_rows(self, uri: str) -> Iterator[dict]:
        sha256 = None
        try:
            filetype_for(uri)
            try:
                data = read_bytes(self._filesystem(uri), uri)
            except (OSError, FileNotFoundError) as e:
                raise DocumentError("unreadable", f"cannot read the file: {explain(uri, e, self.storage)}") from e
            sha256 = hashlib.sha256(data).hexdigest()
            for count, total, page in self.renderer.rasterize(data, uri):
                yield _raster_row(uri, sha256, count, total, page)
        except DocumentError as e:
            # Pages already yielded for this document are discarded downstream when this row arrives.
            yield _error_row(uri, sha256, e.kind, str(e))

    def _filesystem(self, uri: str):
        scheme = uri.split("://", 1)[0] if "://" in uri else "file"
        if scheme not in self._filesystems:
            self._filesystems[scheme] = resolve(uri, self.storage).fs
        return self._filesystems[scheme]

    def __del__(self):
        self.renderer.close()


def _page_id(row: dict) -> str:
    """A page's request id: its document's sha256 and its page index."""
    return f"{row['sha256']}:{row['page_index']}"


class ParseStage:
    """Holds one engine (loaded once per actor) and parses batches of page rows."""

    def __init__(self, run_id: str, backend_name: str, checkpoint: str, storage: StorageConfig, cache_dir: str,
                 device: str, dtype: str, sampling: dict, prompt: str, fallback_to_text_layer: bool,
                 options: dict | None = None, block_reading: BlockReading = BlockReading()):
        from engine.backends import load_backend
        from engine.interface import SamplingParams

        install_log_redaction()  # an actor is its own process: its log records are redacted there
        self.run_id, self.prompt, self.fallback = run_id, prompt, fallback_to_text_layer
        self.blocks = block_reading
        self.sampling = SamplingParams(**sampling)
        checkpoint_dir = localize(checkpoint, storage, cache_dir)  # this node's copy (the driver's may be elsewhere)
        self.backend = load_backend(backend_name, checkpoint_dir, device=device, dtype=dtype, **(options or {}))
        self._lock = threading.Lock()
        self._busy_claimed = 0.0

    def __call__(self, batch: pa.Table) -> pa.Table:
        from engine.interface import PageRequest

        started = time.time()
        rows = batch.to_pylist()
        todo = [i for i, r in enumerate(rows) if r["status"] == "ok"]
        images = {i: np.frombuffer(rows[i]["image"], np.uint8).reshape(rows[i]["image_height"], rows[i]["image_width"], 3)
                  for i in todo}
        by_blocks = self._read_in_blocks(rows, images) if self.blocks.lines else {}
        # Blocks only (tolerance 0): a page is read whole only where the cut found no blocks or a block failed
        whole = [i for i in todo if not (self.blocks.only and i in by_blocks)]
        requests = [PageRequest(_page_id(rows[i]), images[i], self.prompt, self.sampling) for i in whole]
        results = dict(zip(whole, self.backend.parse(requests))) if requests else {}
        share = self._engine_time() / max(len(todo), 1)  # each page's part of the engine time
        out = [self._page_row(r) for r in rows]
        ended = time.time()
        for i in todo:
            row, res, blocks = out[i], results.get(i), by_blocks.get(i)
            read = res or blocks
            row.update(prompt_tokens=read.prompt_tokens, output_tokens=read.output_tokens,
                       finish_reason=read.finish_reason, loop_dropped_tokens=read.loop_dropped_tokens,
                       ttft_s=read.ttft_s, decode_s=read.decode_s, parse_s=read.total_s or share, engine_s=share,
                       parse_started_unix=started, parse_ended_unix=ended,
                       **SpecStats.total(r.spec for r in (res, blocks) if r is not None).columns())
            if res is None:  # read in blocks only
                row.update(status="ok", text=blocks.text, read_by="blocks")
            elif res.finish_reason != "error":
                row.update(status="ok", text=res.text, read_by="page")
                if blocks is not None:
                    row.update(prompt_tokens=res.prompt_tokens + blocks.prompt_tokens,
                               output_tokens=res.output_tokens + blocks.output_tokens)
                    if prefer_blocks(res.text, blocks.text, self.blocks.tolerance):
                        row.update(text=blocks.text, read_by="blocks")
            elif self.fallback and (row["text_layer"] or "").strip():
                row.update(status="fallback", text=row["text_layer"], error_kind="engine", error=res.error)
            else:
                row.update(status="error", error_kind="engine", error=res.error or "engine failed")
        return pa.Table.from_pylist(out, schema=PAGE_SCHEMA)

    def _read_in_blocks(self, rows: list[dict], images: dict) -> dict:
        """Each page read in blocks of a few lines (pipeline.blocks): row index -> one PageResult for the page, its
        text the blocks' answers joined (pipeline.blocks.merge_block_results). A page with a failed block, or without
        ink dark enough to cut, has none: it is read whole."""
        from engine.interface import PageRequest

        read = list(images)
        views = [[np.frombuffer(v["image"], np.uint8).reshape(v["height"], v["width"], 3)
                  for v in rows[i]["views"] or ()] for i in read]  # the pages drawn at the other block scales

        def parse(items):
            return self.backend.parse([PageRequest(f"{_page_id(rows[read[p]])}:block{k}", crop, self.prompt,
                                                   self.sampling) for p, k, crop in items])

        out = {}
        for i, (blocks, got, spent) in zip(read, read_blocks([images[i] for i in read], self.blocks.lines,
                                                             self.blocks.token_px, parse, lambda r: r.text,
                                                             self.blocks.block_scales, voted_result, views)):
            if blocks and all(r.finish_reason != "error" for r in got):  # no blocks: no ink to measure it by
                out[i] = merge_block_results(_page_id(rows[i]), blocks, got, spent)
        return out

    def _engine_time(self) -> float:
        """Engine seconds since the previous call took its share. Calls may overlap (parse.concurrent_batches), so
        each claims the engine time accrued since the last claim: the shares add up to the engine's busy time."""
        with self._lock:
            busy = self.backend.busy_s
            delta, self._busy_claimed = busy - self._busy_claimed, busy
        return delta

    def _page_row(self, r: dict) -> dict:
        return empty_row(
            PAGE_SCHEMA, run_id=self.run_id, uri=r["uri"], sha256=r["sha256"], page_index=r["page_index"],
            page_count=r["page_count"], total_pages=r["total_pages"], image_height=r["image_height"], image_width=r["image_width"],
            status=r["status"], error_kind=r["error_kind"], error=r["error"], text_layer=r["text_layer"],
            text="" if r["status"] == "blank" else None,
            backend=self.backend.backend_id, model_id=self.backend.model_id, raster_s=r["raster_s"],
        )
