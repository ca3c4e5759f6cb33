"""How the job ends on SIGTERM (a scheduler's stop, `kill`, `ray job stop`): exit status 143, the output consistent.

The handler raises `Terminated` (a SystemExit with code 143) in the main thread, which unwinds like Ctrl-C: the
whole documents received so far are committed (pipeline.job's flush), then Ray is shut down.

Python runs a signal handler only between bytecodes of the main thread, so a main thread blocked inside a C++ call (a
storage request in pyarrow, a wait in Ray) would not see the signal until the call returns. The signal therefore also
wakes a watchdog thread (through signal.set_wakeup_fd), which ends the process with os._exit(143) if it is still alive
`grace_s` later. The commit protocol makes that safe at any point: a part cut short is a pages file without its
documents file, which the next run's reconcile removes, and a local Ray's reaper stops it once the driver is gone.

ray.init installs SIGTERM handlers of its own (exit 15, or 1 after stopping a local Ray's processes);
`ray_keeps_our_handler` keeps the job's in place around it.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

EXIT_SIGTERM = 128 + signal.SIGTERM  # 143, what a shell reports for a process ended by SIGTERM
DEFAULT_GRACE_S = 20.0  # under the 30 s that Kubernetes and Slurm wait by default before SIGKILL


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM."""

    def __init__(self):
        super().__init__(EXIT_SIGTERM)


_state = {"installed": False, "grace_s": DEFAULT_GRACE_S, "received": False, "wakeup": None}


def _handler(signum, frame) -> None:
    if _state["received"]:
        return  # a second SIGTERM must not interrupt the unwinding the first one started
    _state["received"] = True
    raise Terminated()


def _watchdog(sock: socket.socket) -> None:
    while True:
        try:
            data = sock.recv(64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data:
            threading.Event().wait(_state["grace_s"])
            os.write(2, f"\nstill running {_state['grace_s']:g} s after SIGTERM: stopped now (status "
                        f"{EXIT_SIGTERM}); run again to resume\n".encode())
            os._exit(EXIT_SIGTERM)


def install(grace_s: float = DEFAULT_GRACE_S) -> None:
    """SIGTERM ends this process with status 143 (main thread only): unwinding first, os._exit after `grace_s`."""
    _state["grace_s"] = grace_s
    signal.signal(signal.SIGTERM, _handler)
    if _state["wakeup"] is None:
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        if previous != -1:  # someone else (an event loop) reads the wakeup fd: leave it theirs, no watchdog
            signal.set_wakeup_fd(previous)
            reader.close()
            writer.close()
        else:
            _state["wakeup"] = (reader, writer)
            threading.Thread(target=_watchdog, args=(reader,), name="sigterm-watchdog", daemon=True).start()
    _state["installed"] = True


def set_grace(grace_s: float) -> None:
    _state["grace_s"] = grace_s


@contextmanager
def ray_keeps_our_handler(ray) -> Iterator[None]:
    """Around ray.init: Ray's own SIGTERM handlers are not installed (its private hook is made a no-op for the
    call), and the job's is put back afterwards in case Ray installed one another way."""
    if not _state["installed"] or threading.current_thread() is not threading.main_thread():
        yield
        return
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    original = getattr(utils, "set_sigterm_handler", None)
    if original is not None:
        utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        if original is not None:
            utils.set_sigterm_handler = original
        signal.signal(signal.SIGTERM, _handler)


def stopped_message() -> str:
    return ("stopped by SIGTERM: the documents finished before it are committed and the output is consistent; run "
            "the same command again to parse the rest")


def exit_after_sigterm() -> None:
    """For the command line: the one line a person reads, then status 143."""
    sys.stderr.write(stopped_message() + "\n")
    sys.exit(EXIT_SIGTERM)
