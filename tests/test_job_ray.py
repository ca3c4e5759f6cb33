"""The whole job on a real local Ray (fractional CPUs, hard timeouts): S3 through a real HTTP server,
resume and retry, a killed engine actor, a job killed midway."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import pymupdf
import pyarrow.fs as pafs
import pytest

from conftest import ROOT
from pipeline.config import load_config
from pipeline.job import prepare, run
from pipeline.output import OutputStore
from pipeline.storage import resolve

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]  # each a whole job: > 30 s
SAMPLES = ROOT / "samples"
BACKEND = os.environ.get("OCRIA_TEST_BACKEND", "native")


def job_config(tmp_ckpt, inputs, output, **over):
    base = {"input": {"uris": inputs}, "output": output,
            "model": {"backend": BACKEND, "checkpoint": str(tmp_ckpt), "device": "cpu", "max_tokens": 8},
            "parse": {"batch_size": 4}, "run": {"num_cpus": 2, "commit_every_docs": 2}}
    for key, value in over.items():
        base.setdefault(key, {}).update(value) if isinstance(value, dict) else base.__setitem__(key, value)
    return load_config(None, base)


def assert_exactly_once(store: OutputStore, expected_uris: set[str]):
    docs, pages = store.documents(), store.pages()
    counts = Counter(docs.column("uri").to_pylist())
    assert set(counts) == expected_uris and max(counts.values()) == 1, counts
    by_doc = Counter(pages.column("uri").to_pylist())
    for d in docs.to_pylist():
        assert by_doc[d["uri"]] == max(d["pages"], 1), d  # its pages, or its one error row
    keys = list(zip(pages.column("uri").to_pylist(), pages.column("page_index").to_pylist()))
    assert len(keys) == len(set(keys))
    return docs, pages


def make_pdfs(folder, n, pages=2):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        doc = pymupdf.open()
        for p in range(pages):
            doc.new_page().insert_text((72, 100), f"Document {i}, page {p}: invoice {1000 + i * 7 + p}", fontsize=14)
        doc.save(folder / f"doc{i:02d}.pdf")


def test_sample_corpus_through_object_store_then_resume(object_store, tiny_checkpoint, tmp_path):
    """Input, output and the checkpoint all in one bucket of each object store (the checkpoint is copied into a
    local cache before use); a rerun retries the failed document, and --retry-failed takes only failed ones."""
    b = object_store.new_bucket("archive")
    object_store.upload_tree(SAMPLES, f"{b}/in")
    object_store.upload_tree(tiny_checkpoint, f"{b}/models/tiny")
    u = object_store.uri
    cfg = job_config(u(f"{b}/models/tiny"), [u(f"{b}/in")], u(f"{b}/out"),
                     storage=object_store.storage, run={"cache_dir": str(tmp_path / "cache")})
    assert not (tmp_path / "cache").exists()
    summary = run(prepare(cfg), echo=lambda *_: None)
    assert (summary["documents"], summary["documents_ok"], summary["documents_error"]) == (6, 5, 1)
    assert summary["pages"] == 7 and summary["errors_by_kind"] == {"not_pdf": 1}
    store = OutputStore(resolve(u(f"{b}/out"), cfg.storage))
    uris = {u(f"{b}/in/{f.relative_to(SAMPLES)}") for f in SAMPLES.rglob("*") if f.is_file()}
    docs, pages = assert_exactly_once(store, uris)
    ok = [p for p in pages.to_pylist() if p["status"] == "ok"]
    assert all(p["output_tokens"] > 0 and p["backend"] == BACKEND and p["model_id"] for p in ok)
    err = [p for p in pages.to_pylist() if p["page_index"] == -1]
    assert len(err) == 1 and "not a PDF" in err[0]["error"]
    keys = object_store.keys(f"{b}/out")
    assert any(k.startswith("stats/") for k in keys) and any(k.startswith("runs/") for k in keys)
    assert {k.split("/")[0] for k in keys} == {"pages", "documents", "stats", "runs"}, keys  # no temporaries left
    assert not any(b"testing" in object_store.fs.open_input_stream(f"{b}/out/{k}").read()
                   for k in keys if k.endswith(".json")), "credentials must never reach the output"

    # A plain rerun takes the failed document again and one that arrived since; --retry-failed only the first.
    object_store.put(f"{b}/in/late.pdf", (SAMPLES / "letter.pdf").read_bytes())
    again = prepare(cfg)
    assert again.plan.skipped["already done"] == 5
    assert sorted((k.rsplit("/", 1)[1], m.attempt) for k, m in again.plan.todo.items()) == [
        ("download-error.pdf", 2), ("late.pdf", 1)]
    only_failed = prepare(job_config(u(f"{b}/models/tiny"), [u(f"{b}/in")], u(f"{b}/out"), storage=object_store.storage,
                                     run={"cache_dir": str(tmp_path / "cache"), "retry_failed": True}))
    assert [(k.rsplit("/", 1)[1], m.attempt) for k, m in only_failed.plan.todo.items()] == [("download-error.pdf", 2)]
    # The failed one is retried (attempt 2) and its row replaces the old one.
    retried = run(only_failed, echo=lambda *_: None)
    assert retried["documents"] == 1 and retried["pages"] == 0 and retried["warmup_pages"] == 0  # an error row is no page
    assert retried["steady_pages_per_s"] == 0
    docs, _ = assert_exactly_once(store, uris)
    [cached] = list((tmp_path / "cache").iterdir())
    assert (cached / "model.safetensors").read_bytes() == (tiny_checkpoint / "model.safetensors").read_bytes()
    assert {d["uri"].rsplit("/", 1)[1]: d["attempt"] for d in docs.to_pylist()}["download-error.pdf"] == 2


def _parse_actor_pids():
    """Engine actors of the Ray this test process started (descendants of it), not of any other Ray on the host."""
    import psutil

    me = os.getpid()
    out = subprocess.run(["pgrep", "-f", "ParseStage"], capture_output=True, text=True).stdout.split()
    pids = []
    for pid in map(int, out):
        try:
            if pid != me and any(p.pid == me for p in psutil.Process(pid).parents()):
                pids.append(pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def test_killed_engine_actor_is_replaced_and_its_work_redone(tmp_path, tiny_checkpoint):
    make_pdfs(tmp_path / "in", 12)
    cfg = job_config(tiny_checkpoint, [str(tmp_path / "in")], str(tmp_path / "out"),
                     model={"max_tokens": 24}, parse={"batch_size": 2}, run={"commit_every_docs": 1})
    store = OutputStore(resolve(str(tmp_path / "out"), cfg.storage))
    killed = []

    def killer():  # kill the engine actor's process once it has produced some output
        deadline = time.time() + 200
        while time.time() < deadline and not killed:
            if store.loc.fs.get_file_info(store.documents_dir).type != pafs.FileType.NotFound:
                for pid in _parse_actor_pids():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.05)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    summary = run(prepare(cfg), echo=lambda *_: None)
    t.join(1)
    assert killed, "the engine actor was never killed: the test did not test anything"
    assert summary["documents_ok"] == 12 and summary["pages"] == 24
    assert_exactly_once(store, {f"file://{tmp_path}/in/doc{i:02d}.pdf" for i in range(12)})


@pytest.mark.parametrize("where", ["local", "s3", "gcs"])
def test_job_killed_midway_then_resumed_gives_every_document_once(where, request, tmp_path, tiny_checkpoint):
    """The driver and its Ray killed mid-stream; a rerun gives every document exactly once. On GCS the endpoint
    comes from STORAGE_EMULATOR_HOST, as a user of an emulator would set it, in the killed run and the resume."""
    make_pdfs(tmp_path / "in", 16)
    env, flags = dict(os.environ), []
    if where == "local":
        inp, out, storage = str(tmp_path / "in"), str(tmp_path / "out"), {}
        committed = lambda: len(list((tmp_path / "out" / "documents").glob("*.parquet")))  # noqa: E731
    else:
        store = request.getfixturevalue(f"{where}_store")
        b = store.new_bucket()
        store.upload_tree(tmp_path / "in", f"{b}/in")
        inp, out = store.uri(f"{b}/in"), store.uri(f"{b}/out")
        if where == "gcs":
            env["STORAGE_EMULATOR_HOST"], storage = store.storage["gcs_endpoint"], {}
        else:
            flags, storage = ["--s3-endpoint", store.storage["s3_endpoint"]], store.storage
        committed = lambda: sum(k.endswith(".parquet") for k in store.keys(f"{b}/out/documents"))  # noqa: E731
    args = [sys.executable, str(ROOT / "jobs/parse_corpus.py"), "--input", inp, "--output", out, *flags,
            "--checkpoint", str(tiny_checkpoint), "--backend", BACKEND, "--device", "cpu", "--max-tokens", "32",
            "--batch-size", "2", "--commit-every", "1", "--num-cpus", "2"]
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 200
    while time.time() < deadline and committed() < 2 and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray it started, mid-write if unlucky
    proc.wait()
    subprocess.run(["pkill", "-9", "-f", str(tmp_path)], check=False)
    done_before = committed()
    assert 0 < done_before < 16, f"kill landed at {done_before} committed parts: nothing was interrupted"
    with pytest.MonkeyPatch.context() as mp:
        for k in set(env) - set(os.environ):
            mp.setenv(k, env[k])
        cfg = job_config(tiny_checkpoint, [inp], out, storage=storage)
        prep = prepare(cfg)
        assert len(prep.plan.todo) == 16 - prep.plan.skipped["already done"] and prep.plan.todo
        run(prep, echo=lambda *_: None)
        assert_exactly_once(OutputStore(resolve(out, cfg.storage)), {f"{inp}/doc{i:02d}.pdf" for i in range(16)}
                            if where != "local" else {f"file://{tmp_path}/in/doc{i:02d}.pdf" for i in range(16)})


@pytest.mark.timeout(400)
def test_ray_job_submit_against_a_started_cluster(tmp_path, tiny_checkpoint):
    """`ray start --head` + `ray job submit --working-dir .`, as users run it (token auth off for a local cluster)."""
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="")
    env.pop("RAY_ADDRESS")
    port = "8275"
    temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    start = subprocess.run([ray_bin, "start", "--head", "--num-cpus", "2", "--disable-usage-stats",
                            "--dashboard-port", port, "--include-dashboard=true", "--temp-dir", temp_dir],
                           env=env, capture_output=True, text=True, timeout=120)
    assert start.returncode == 0, start.stderr[-2000:]
    try:
        ckpt = tmp_path / "ckpt"
        shutil.copytree(tiny_checkpoint, ckpt)
        sub = subprocess.run(
            [ray_bin, "job", "submit", "--address", f"http://127.0.0.1:{port}", "--working-dir", str(ROOT),
             "--runtime-env-json", '{"excludes": [".venv", "out", ".git", "models", ".synth", ".whl"]}', "--",
             sys.executable, "jobs/parse_corpus.py", "--input", str(SAMPLES), "--output", str(tmp_path / "out"),
             "--checkpoint", str(ckpt), "--backend", BACKEND, "--device", "cpu", "--max-tokens", "4"],
            env=env, capture_output=True, text=True, timeout=300)
        assert sub.returncode == 0, (sub.stdout + sub.stderr)[-3000:]
        assert "pages/s" in sub.stdout and "succeeded" in sub.stdout
        store = OutputStore(resolve(str(tmp_path / "out"), load_config(None, {"input": {"uris": ["x"]}}).storage))
        assert store.documents().num_rows == 6
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)
