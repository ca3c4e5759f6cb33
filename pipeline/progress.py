"""Progress in pages, the unit a user waits for: pages done of pages known (a document's page count is known once
its first row arrives), documents done, and the current pages/s over the last half minute.

On a terminal it is one bar that redraws itself; without one (a log file, CI, `ray job submit`) it is one line every
`every_s` seconds (also while nothing arrives, e.g. engines loading their model) and one at the end, so a log stays
readable.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from typing import Callable


class PageProgress:
    def __init__(self, documents: int, echo: Callable[[str], None], interactive: bool | None = None,
                 every_s: float = 30.0, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.documents, self.echo, self.every_s, self.window_s, self.clock = documents, echo, every_s, window_s, clock
        self.interactive = sys.stderr.isatty() if interactive is None else interactive
        self.pages_done = self.pages_known = self.documents_done = 0
        self._seen: set[str] = set()
        self._started = self._last_line = clock()
        self._samples: deque[tuple[float, int]] = deque([(self._started, 0)])  # (time, pages done), ~1 a second
        self._bar = None
        self._lock, self._stop = threading.Lock(), threading.Event()
        if self.interactive:
            from tqdm import tqdm

            self._bar = tqdm(total=0, desc="pages", unit="page", file=sys.stderr, mininterval=0.5)
        else:
            threading.Thread(target=self._heartbeat, daemon=True).start()

    def row(self, row: dict) -> None:
        """One row off the stream: a page (any status), or a document's error row (no page)."""
        with self._lock:
            if row["uri"] not in self._seen:
                self._seen.add(row["uri"])
                self.pages_known += max(row["page_count"] or 0, 0)
            if row["page_index"] >= 0:
                self.pages_done += 1
            self._tick()

    def document_done(self) -> None:
        with self._lock:
            self.documents_done += 1
            self._tick()

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(self.every_s, 5.0)):
            with self._lock:
                self._tick()

    def pages_per_s(self) -> float:
        """Pages per second since the last sample from before the window (the whole run, until a window has passed):
        a burst after a long wait is not read as a rate of hundreds of pages a second."""
        t0, n0 = self._samples[0]
        return (self.pages_done - n0) / max(self.clock() - t0, 1e-9)

    def line(self) -> str:
        if not self._seen:
            return (f"waiting for the first pages ({self.clock() - self._started:.0f} s: the engines load their model "
                    f"and read a first batch), documents 0/{self.documents}")
        return (f"pages {self.pages_done}/{self.pages_known} known, documents {self.documents_done}/"
                f"{self.documents}, {self.pages_per_s():.2f} pages/s")

    def _tick(self) -> None:
        now = self.clock()
        if now - self._samples[-1][0] >= 1.0:
            self._samples.append((now, self.pages_done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:  # keep one from before the window
            self._samples.popleft()
        if now - self._last_line < (0.5 if self._bar is not None else self.every_s):
            return
        self._last_line = now
        if self._bar is not None:
            self._bar.total, self._bar.n = self.pages_known, self.pages_done
            self._bar.set_postfix_str(f"documents {self.documents_done}/{self.documents}, "
                                      f"{self.pages_per_s():.2f} pages/s")
        else:
            self.echo(self.line())

    def close(self) -> None:
        self._stop.set()
        if self._bar is not None:
            self._bar.total, self._bar.n = self.pages_known, self.pages_done
            self._bar.close()
        else:
            self.echo(self.line())
