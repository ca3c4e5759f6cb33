"""One engine shared by several callers: a thread owns the Engine and steps it while any request is unfinished;
callers on other threads submit requests and wait on futures. Requests from different callers batch together, so
a caller's new pages join the running batch while an earlier caller's last pages finish (no drain between calls).
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

from engine.llm_engine import Engine, RequestOutput, RequestRejected


class EngineLoop:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._futures: dict[str, Future] = {}
        self._failure: BaseException | None = None
        self._busy_s = 0.0  # time spent stepping, as seen by the loop thread
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def submit(self, request_id: str, **request) -> Future:
        """Queue one request (Engine.add_request arguments); the future gets its RequestOutput. A request the
        engine rejects gets an output with finish_reason "error"; if the engine itself fails, every future still
        waiting gets that exception."""
        fut: Future = Future()
        with self._lock:
            if self._failure is not None:
                fut.set_exception(RuntimeError(f"engine loop stopped: {self._failure!r}"))
                return fut
            self._inbox.put((request_id, request, fut))
        return fut

    @property
    def busy_s(self) -> float:
        return self._busy_s

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        try:
            while True:
                # wait for work only while the engine is idle; otherwise admit what has arrived and step
                for item in self._drain(block=not self.engine.has_unfinished()):
                    if item is None:  # close()
                        return
                    self._admit(*item)
                if self.engine.has_unfinished():
                    t0 = time.perf_counter()
                    outputs = self.engine.step()
                    self._busy_s += time.perf_counter() - t0
                    for out in outputs:
                        self._futures.pop(out.request_id).set_result(out)
        except BaseException as e:  # noqa: BLE001  (a failed engine must not leave callers waiting forever)
            with self._lock:
                self._failure = e
                pending = list(self._futures.values())
                self._futures.clear()
                pending += [item[2] for item in self._drain(block=False) if item is not None]
            for fut in pending:
                fut.set_exception(e)

    def _drain(self, block: bool) -> list:
        items = [self._inbox.get()] if block else []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                return items

    def _admit(self, request_id: str, request: dict, fut: Future) -> None:
        try:
            self.engine.add_request(request_id, **request)
        except Exception as e:  # noqa: BLE001  (a request that cannot be admitted fails alone)
            msg = str(e) if isinstance(e, RequestRejected) else f"{type(e).__name__}: {e}"
            fut.set_result(RequestOutput(request_id, [], [], "", "error", error=msg))
            return
        self._futures[request_id] = fut
