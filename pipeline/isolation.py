"""Run the rasterizer in a child process, so a document that crashes or hangs MuPDF costs only itself.

One long-lived child per rasterizer actor (spawned once, not per document); it is killed and replaced only
after a timeout or a crash. PyMuPDF is not thread-safe, so one child renders one document at a time.
"""
from __future__ import annotations

import multiprocessing as mp
import signal
import time
from typing import Iterator

from pipeline.rasterize import DocumentError, RasterOptions, RenderedPage, rasterize


def _child_main(conn, opts: RasterOptions, memory_limit_mb: int) -> None:
    if memory_limit_mb > 0:
        import resource

        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import pymupdf

    pymupdf.TOOLS.mupdf_display_errors(False)  # errors reach us as exceptions; don't spam the actor log
    pymupdf.TOOLS.mupdf_display_warnings(False)
    while True:
        try:
            uri, data = conn.recv()
        except EOFError:
            return
        try:
            for count, total, page in rasterize(data, uri, opts):
                conn.send(("page", count, total, page))
            conn.send(("done",))
        except DocumentError as e:
            conn.send(("error", e.kind, str(e)))
        except MemoryError as e:
            conn.send(("error", "too_large", f"out of memory (limit {memory_limit_mb} MB): {e}"))
        except Exception as e:  # a bug or an unforeseen MuPDF failure still costs only this document
            conn.send(("error", "damaged", f"{type(e).__name__}: {e}"))


class IsolatedRasterizer:
    def __init__(self, opts: RasterOptions, timeout_s: float, memory_limit_mb: int):
        self.opts, self.timeout_s, self.memory_limit_mb = opts, timeout_s, memory_limit_mb
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

    def _kill_child(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        return proc.exitcode

    def rasterize(self, data: bytes, uri: str) -> Iterator[tuple[int, int, RenderedPage]]:
        """Like pipeline.rasterize.rasterize, with a wall-clock limit for the whole document."""
        try:
            self._ensure_child()
            self._conn.send((uri, data))
        except (BrokenPipeError, OSError):  # the child died between documents: one fresh try
            self._kill_child()
            self._ensure_child()
            self._conn.send((uri, data))
        deadline = time.monotonic() + self.timeout_s
        finished = False
        try:
            yield from self._receive(deadline)
            finished = True
        finally:
            if not finished:  # stopped early or failed: the child may still be mid-document, so start clean
                self._kill_child()

    def _receive(self, deadline: float) -> Iterator[tuple[int, int, RenderedPage]]:
        while True:
            if not self._conn.poll(max(0.0, deadline - time.monotonic())):
                self._kill_child()
                raise DocumentError("timeout", f"rendering took longer than {self.timeout_s:g} s; the renderer was killed")
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                code = self._kill_child()
                how = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
                raise DocumentError("crash", f"the renderer process died ({how}) on this document") from None
            if msg[0] == "page":
                yield msg[1], msg[2], msg[3]
            elif msg[0] == "done":
                return
            else:
                raise DocumentError(msg[1], msg[2])

    def close(self) -> None:
        self._kill_child()
