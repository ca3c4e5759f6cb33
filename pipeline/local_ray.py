"""Joining Ray: an existing cluster (RAY_ADDRESS, `ray job submit`), or a local Ray that belongs to this job.

A local Ray is started with one retry (a busy machine can miss Ray's start-up window), its start-up notices that
are no use to a user quieted, and a reaper process (pipeline/ray_reaper.py) that stops it when the driver is gone,
however the driver ended.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipeline import terminate
from pipeline.redact import redact

log = logging.getLogger("ocria.ray")

# Ray's notice that token authentication is on (by default since 2.60) on every local start (authentication stays on),
# and Ray Data's that its progress bars are off (the job reports progress in pages itself)
RAY_NOTICE_LOGGERS = ("ray._private.authentication.authentication_token_setup", "ray.data._internal.progress")
START_PAUSE_S = 5.0  # between the two attempts: let a busy machine settle


class RayStartError(Exception):
    """The local Ray did not start, worded for the person running the job (one line, credentials redacted)."""

    def __init__(self, message: str):
        super().__init__(redact(message))


@contextmanager
def ray_session(address: str | None, num_cpus: float) -> Iterator[object]:
    """The `ray` module, connected for the job, and shut down (with a local Ray stopped) when the block ends."""
    import ray

    for name in RAY_NOTICE_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    if address:  # an existing cluster, e.g. inside `ray job submit`: not ours to stop
        with terminate.ray_keeps_our_handler(ray):
            ray.init(address=address, log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()
        return
    start_local(ray, num_cpus)
    reaper = _start_reaper(ray)
    try:
        yield ray
    finally:
        ray.shutdown()
        if reaper is not None:
            reaper.stdin.close()  # the reaper ends whatever of this Ray is left, then exits
            try:
                reaper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log.warning("the Ray reaper (pid %d) is still stopping processes", reaper.pid)


def start_local(ray, num_cpus: float, attempts: int = 2) -> None:
    """ray.init for a local Ray, tried `attempts` times; the second with Ray's GCS connection window doubled."""
    for attempt in range(1, attempts + 1):
        try:
            with terminate.ray_keeps_our_handler(ray):
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
            return
        except Exception as e:  # Ray raises plain Exception / RuntimeError for a start-up timeout
            ray.shutdown()
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            if attempt == attempts:
                raise RayStartError(
                    f"the local Ray did not start ({attempts} tries; last: {first_line}): the machine may be busy "
                    f"or short of memory; run again when it is quieter, lower --num-cpus, or join a running "
                    f"cluster with --ray-address") from None
            log.warning("the local Ray did not start (%s); trying once more with more time", first_line)
            _lengthen_start_window()
            time.sleep(START_PAUSE_S)


def _lengthen_start_window() -> None:
    """Ray reads its GCS connection retries from this module constant at each start (no public setting)."""
    try:
        from ray._private import ray_constants
    except ImportError:
        return
    if isinstance(getattr(ray_constants, "NUM_REDIS_GET_RETRIES", None), int):
        ray_constants.NUM_REDIS_GET_RETRIES *= 2


def _start_reaper(ray) -> subprocess.Popen | None:
    import os

    try:
        session = Path(ray._private.worker._global_node.get_session_dir_path()).name
    except AttributeError:  # Ray moved its node object: run without a reaper rather than fail the job
        log.warning("cannot name this Ray's session: its processes are stopped on a clean exit only")
        return None
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name("ray_reaper.py")), str(os.getpid()), session],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
