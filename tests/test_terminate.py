"""SIGTERM ends the job with status 143 even while its main thread is blocked inside a storage call, where Python
cannot run a signal handler (pipeline/terminate.py). The Ray run stopped by SIGTERM midway is in test_job_ray.py."""
import os
import socket
import sys
import threading
import time

import pytest

from conftest import ROOT, job_process, sigterm

pytestmark = pytest.mark.timeout(120)


def stalling_server():
    """A TCP server on 127.0.0.1 that accepts connections and never answers: a GCS client waits on it for its
    120-second stall timeout per try. Returns (its URL, an event set at the first connection, a stop function)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    connected, held = threading.Event(), []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)
            connected.set()

    threading.Thread(target=serve, daemon=True).start()

    def stop():
        srv.close()
        for c in held:
            c.close()

    return f"http://127.0.0.1:{srv.getsockname()[1]}", connected, stop


def test_sigterm_ends_a_job_blocked_in_a_storage_call_with_143_within_its_grace(tmp_path, tiny_checkpoint):
    url, connected, stop = stalling_server()
    (tmp_path / "job.yaml").write_text("run: {term_grace_s: 3}\n")
    args = [sys.executable, str(ROOT / "jobs/parse_corpus.py"), "--config", str(tmp_path / "job.yaml"),
            "--input", "gs://bucket/in", "--output", str(tmp_path / "out"), "--checkpoint", str(tiny_checkpoint)]
    try:
        with job_process(args, env=dict(os.environ, STORAGE_EMULATOR_HOST=url)) as proc:
            assert connected.wait(90), "the job never reached the storage server: the test did not test anything"
            time.sleep(1)  # inside the call now: the request is sent, no answer will come
            assert proc.poll() is None
            err, took = sigterm(proc)
    finally:
        stop()
    assert proc.returncode == 143, err[-2000:]
    assert "still running 3 s after SIGTERM: stopped now (status 143)" in err, err[-2000:]
    assert took < 20, f"{took:.1f} s after SIGTERM (the stalled call alone holds 120 s)"
    assert not (tmp_path / "out" / "documents").exists()
