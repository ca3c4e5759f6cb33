"""Run the rasterizer in a child process, so a page that crashes or hangs MuPDF costs only itself.

One long-lived child per rasterizer actor (spawned once, not per document); it is killed and replaced only after a
timeout or a crash. PyMuPDF is not thread-safe, so one child renders one document at a time.

The time limit is per page, never per document, so a long document is not failed for being long: opening the file
and drawing each page each get `page_timeout_s`. A page past it is one error row; the child is killed and a fresh one
goes on from the next page. After `max_lost_pages` such pages (a file that hangs MuPDF on every page) the rest of the
document is not drawn, each remaining page an error row saying why, so one file cannot hold an actor for hours.
"""
from __future__ import annotations

import multiprocessing as mp
import signal
from typing import Iterator

from pipeline.rasterize import (DocumentError, PageFailure, RasterOptions, RenderedPage, close_document, draw_pages,
                                open_document, page_counts)

CHILD_START_S = 120.0  # a spawned renderer imports PyMuPDF: seconds on a loaded machine, never part of a page's time


def _child_main(conn, opts: RasterOptions, memory_limit_mb: int) -> None:
    if memory_limit_mb > 0:
        import resource

        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import pymupdf

    pymupdf.TOOLS.mupdf_display_errors(False)  # errors reach us as exceptions; don't spam the actor log
    pymupdf.TOOLS.mupdf_display_warnings(False)  # still collected: error messages quote them
    conn.send(("ready",))  # start-up (imports) is not part of any page's time
    while True:
        try:
            uri, data, start = conn.recv()
        except EOFError:
            return
        try:
            doc = open_document(data, uri)
            try:
                conn.send(("opened", *page_counts(doc, opts)))
                for _, _, page in draw_pages(doc, opts, start):
                    conn.send(("page", page))
            finally:
                close_document(doc)
            conn.send(("done",))
        except DocumentError as e:
            conn.send(("error", e.kind, str(e)))
        except MemoryError as e:
            conn.send(("error", "too_large", f"out of memory (limit {memory_limit_mb} MB): {e}"))
        except Exception as e:  # a bug or an unforeseen MuPDF failure still costs only this document
            conn.send(("error", "damaged", f"{type(e).__name__}: {e}"))


class _Lost(Exception):
    """The child stopped answering (timeout) or died (crash) while working on a document."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class IsolatedRasterizer:
    def __init__(self, opts: RasterOptions, page_timeout_s: float, memory_limit_mb: int, max_lost_pages: int = 2):
        self.opts, self.timeout_s, self.memory_limit_mb = opts, page_timeout_s, memory_limit_mb
        self.max_lost_pages = max_lost_pages
        self._ctx = mp.get_context("spawn")  # fork is unsafe in a threaded Ray worker
        self._proc = None
        self._conn = None

    def _ensure_child(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_child_main, args=(child, self.opts, self.memory_limit_mb), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if not (parent.poll(CHILD_START_S) and parent.recv() == ("ready",)):
            self._kill_child()
            raise DocumentError("crash", f"the renderer process did not start within {CHILD_START_S:g} s")

    def _kill_child(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        return proc.exitcode

    def _send(self, uri: str, data: bytes, start: int) -> None:
        try:
            self._ensure_child()
            self._conn.send((uri, data, start))
        except (BrokenPipeError, OSError):  # the child died between documents: one fresh try
            self._kill_child()
            self._ensure_child()
            self._conn.send((uri, data, start))

    def rasterize(self, data: bytes, uri: str) -> Iterator[tuple[int, int, RenderedPage | PageFailure]]:
        """Like pipeline.rasterize.rasterize, with a time limit per page (and for opening the file)."""
        start, counts, lost = 0, None, 0
        idle = True  # the child holds no part of this document (it waits for a request, or it is gone)
        try:
            while True:
                self._send(uri, data, start)
                idle = False
                try:
                    for msg in self._receive():
                        if msg[0] == "opened":
                            counts = counts or (msg[1], msg[2])
                        else:
                            start = msg[1].index + 1
                            yield (*counts, msg[1])
                    idle = True
                    return
                except DocumentError:  # the child said why, and waits for the next document
                    idle = True
                    raise
                except _Lost as e:  # the child was killed, or died
                    idle = True
                    if counts is None:  # while opening the file: nothing of it was drawn
                        raise DocumentError(e.kind, f"opening the document: {e}") from None
                    count = counts[0]
                    if start < count:  # else it went after the last page was sent: nothing is missing
                        lost += 1
                        yield (*counts, PageFailure(start, e.kind, f"page {start}: {e}"))
                        start += 1
                    if lost >= self.max_lost_pages:
                        for i in range(start, count):
                            yield (*counts, PageFailure(i, e.kind, f"page {i}: not drawn: {lost} pages of this "
                                                        f"document already timed out or crashed the renderer"))
                        return
                    if start >= count:
                        return
        finally:
            if not idle:  # the consumer stopped mid-document: the child may still be drawing, so start clean
                self._kill_child()

    def _receive(self) -> Iterator[tuple]:
        """The child's messages for one request, each within `timeout_s` of the one before; raises _Lost."""
        while True:
            if not self._conn.poll(self.timeout_s):
                self._kill_child()
                raise _Lost("timeout", f"not drawn within {self.timeout_s:g} s (raster.page_timeout_s); the renderer "
                                       f"was killed")
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                code = self._kill_child()
                how = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
                raise _Lost("crash", f"the renderer process died ({how})") from None
            if msg[0] == "done":
                return
            if msg[0] == "error":
                raise DocumentError(msg[1], msg[2])
            yield msg

    def close(self) -> None:
        self._kill_child()
