"""Stops a job's own local Ray when its driver is gone, however the driver ended (a kill -9 included).

Run as a script by pipeline.local_ray, in its own session so a kill of the driver's process group spares it:

    python pipeline/ray_reaper.py <driver pid> <Ray session name>

It reads its standard input, a pipe only the driver holds: end of file means the driver exited or died. Meanwhile
it notes, twice a second, the driver's child processes whose command line names the session (GCS, raylet, the
dashboard, the monitors) and all their descendants (workers, and the render processes they start). At end of file
it ends those still running: SIGTERM, then SIGKILL after a grace period. Processes are matched by pid and start
time, so a reused pid is never hit. Needs only psutil and the standard library.
"""
from __future__ import annotations

import os
import select
import sys
import time

import psutil

POLL_S = 0.5
GRACE_S = 3.0


def session_processes(driver: psutil.Process, session: str) -> dict[int, float]:
    """pid -> start time of the session's processes under the driver."""
    found: dict[int, float] = {}
    try:
        children = driver.children()
    except psutil.Error:
        return found
    for child in children:
        try:
            if child.pid == os.getpid() or session not in " ".join(child.cmdline()):  # its own command names it too
                continue
            for p in [child, *child.children(recursive=True)]:
                found[p.pid] = p.create_time()
        except psutil.Error:
            continue
    return found


def end(tracked: dict[int, float]) -> None:
    alive = []
    for pid, started in tracked.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started:
                p.terminate()
                alive.append(p)
        except psutil.Error:
            continue
    _, still = psutil.wait_procs(alive, timeout=GRACE_S)
    for p in still:
        try:
            p.kill()
        except psutil.Error:
            pass


def main(driver_pid: int, session: str) -> None:
    try:
        driver = psutil.Process(driver_pid)
    except psutil.Error:
        return
    tracked: dict[int, float] = {}
    fd = sys.stdin.fileno()
    while True:
        tracked.update(session_processes(driver, session))
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready and not os.read(fd, 4096):
            break
    time.sleep(POLL_S)  # a driver that exited cleanly has just shut Ray down: let it finish
    end(tracked)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
