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
from pathlib import Path

import pyarrow as pa
import pymupdf
import pyarrow.fs as pafs
import pytest

from conftest import ROOT, job_process, sigterm
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
    local cache before use); a rerun skips the failed document (not a PDF: permanent), --retry-failed forces it."""
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

    # A plain rerun takes the document that arrived since, not the failed one: not a PDF is a fact about the file.
    object_store.put(f"{b}/in/late.pdf", (SAMPLES / "letter.pdf").read_bytes())
    again = prepare(cfg)
    assert again.plan.skipped["already done"] == 5
    assert again.plan.skipped["not_pdf (not retried: --retry-failed forces)"] == 1
    assert [(k.rsplit("/", 1)[1], m.attempt) for k, m in again.plan.todo.items()] == [("late.pdf", 1)]
    # --retry-failed forces it (attempt 2), and takes only failed documents.
    only_failed = prepare(job_config(u(f"{b}/models/tiny"), [u(f"{b}/in")], u(f"{b}/out"), storage=object_store.storage,
                                     run={"cache_dir": str(tmp_path / "cache"), "retry_failed": True}))
    assert [(k.rsplit("/", 1)[1], m.attempt) for k, m in only_failed.plan.todo.items()] == [("download-error.pdf", 2)]
    # The failed one is retried (attempt 2) and its row replaces the old one.
    retried = run(only_failed, echo=lambda *_: None)
    assert retried["documents"] == 1 and retried["pages"] == 0 and retried["warmup_pages"] == 0  # an error row is no page
    assert retried["steady_pages_per_s"] == 0 and not retried["steady_phase"]
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
    store = request.getfixturevalue(f"{where}_store") if where != "local" else None
    env, flags = dict(os.environ), []  # after the store's fixture, which puts its credentials in the environment
    if where == "local":
        inp, out, storage = str(tmp_path / "in"), str(tmp_path / "out"), {}
        committed = lambda: len(list((tmp_path / "out" / "documents").glob("*.parquet")))  # noqa: E731
    else:
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


def test_sigterm_midway_exits_143_with_the_output_consistent_and_resumable(tmp_path, tiny_checkpoint):
    """SIGTERM to the driver alone (as a scheduler sends it) once parts are committed: status 143 within the grace,
    the documents committed each once with their pages, no pages file left without its documents file, the Ray it
    started gone, and a new plan that takes exactly the documents not yet committed."""
    import psutil

    from pipeline.config import StorageConfig
    from pipeline.plan import plan_run
    from pipeline.storage import list_documents

    make_pdfs(tmp_path / "in", 12)
    out = tmp_path / "out"
    args = [sys.executable, str(ROOT / "jobs/parse_corpus.py"), "--input", str(tmp_path / "in"), "--output", str(out),
            "--checkpoint", str(tiny_checkpoint), "--backend", BACKEND, "--device", "cpu", "--max-tokens", "32",
            "--batch-size", "2", "--commit-every", "1", "--num-cpus", "2"]
    helpers = {}
    with job_process(args) as proc:
        driver = psutil.Process(proc.pid)
        deadline = time.time() + 200
        while time.time() < deadline and proc.poll() is None and not list((out / "documents").glob("*.parquet")):
            for p in driver.children(recursive=True):
                try:
                    helpers[p.pid] = (p.create_time(), " ".join(p.cmdline())[:120])
                except psutil.Error:
                    pass
            time.sleep(0.1)
        assert proc.poll() is None, "the job ended before SIGTERM: the test did not test anything"
        err, took = sigterm(proc)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped by SIGTERM: the documents finished before it are committed" in err, err[-3000:]
    assert took < 30, f"{took:.1f} s from SIGTERM to exit (grace 20 s)"
    pages = {p.name for p in (out / "pages").glob("*.parquet")}
    committed = {p.name for p in (out / "documents").glob("*.parquet")}
    assert pages == committed, "a pages file without its documents file (or the reverse)"
    store = OutputStore(resolve(str(out), StorageConfig()))
    done = {d["uri"] for d in store.documents().to_pylist()}
    assert 0 < len(done) < 12, f"SIGTERM landed at {len(done)} documents done: nothing was interrupted"
    assert_exactly_once(store, done)
    listed = list_documents(str(tmp_path / "in"), StorageConfig(), ["*.pdf"], [])
    plan = plan_run(listed, store.documents(), retry_failed=False, max_attempts=3)
    assert set(plan.todo) == {f.uri for f in listed} - done
    alive = _still_running(helpers, 30)
    assert helpers and not alive, f"still running 30 s after the job exited on SIGTERM: {alive or 'no helpers seen'}"


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
             "--checkpoint", str(ckpt), "--backend", BACKEND, "--device", "cpu", "--max-tokens", "4",
             "--allow-errors"],  # the samples hold a broken file on purpose: the job succeeds all the same
            env=env, capture_output=True, text=True, timeout=300)
        assert sub.returncode == 0, (sub.stdout + sub.stderr)[-3000:]
        assert "pages/s" in sub.stdout and "succeeded" in sub.stdout
        store = OutputStore(resolve(str(tmp_path / "out"), load_config(None, {"input": {"uris": ["x"]}}).storage))
        assert store.documents().num_rows == 6
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _secret_env(tmp_path):
    """Secret-looking values in the variables AWS and GCS clients read; each is searched for in all the job leaves."""
    import json
    import secrets

    values = {"AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
              "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/" + secrets.token_urlsafe(24),
              "AWS_SESSION_TOKEN": "IQoJb3JpZ2luX2VjE" + secrets.token_urlsafe(48)}
    key = "-----BEGIN PRIVATE KEY-----\nMIIE" + secrets.token_urlsafe(48) + "\n-----END PRIVATE KEY-----\n"
    creds = tmp_path / "gcs-service-account.json"
    creds.write_text(json.dumps({"type": "service_account", "private_key_id": secrets.token_hex(20),
                                 "private_key": key, "client_email": "parser@example.iam.gserviceaccount.com"}))
    needles = [*values.values(), key.splitlines()[1], json.loads(creds.read_text())["private_key_id"]]
    return {**values, "GOOGLE_APPLICATION_CREDENTIALS": str(creds), "AWS_DEFAULT_REGION": "us-east-1"}, needles


def _broken_inputs(folder):
    """One document of each outcome the job must tell apart, made here."""
    from test_rasterize import _slow_page_pdf

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "letter.pdf").write_bytes((SAMPLES / "letter.pdf").read_bytes())
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 100), "A page with text, then a blank one.", fontsize=14)
    doc.new_page()
    doc.save(folder / "with-blank.pdf")
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 100), "Locked", fontsize=14)
    (folder / "locked.pdf").write_bytes(doc.tobytes(encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="u", owner_pw="o"))
    (folder / "cut-off.pdf").write_bytes((SAMPLES / "report.pdf").read_bytes()[:300])
    (folder / "download.pdf").write_bytes(b"<!DOCTYPE html><html><body>Access denied</body></html>")
    (folder / "slow.pdf").write_bytes(_slow_page_pdf(40000))


def _leaked(needles, text: str) -> list[str]:
    return [n[:12] for n in needles if n in text]


@pytest.mark.timeout(600)
def test_outcomes_through_the_job_and_no_secret_in_anything_it_prints_or_writes(s3_server, s3_client, tiny_checkpoint,
                                                                               tmp_path):
    """Through the CLI on S3, with secret-looking credentials in the environment: each broken file gets its kind, a
    blank page its status, a page past its time limit one error row while its document's other pages are read; no
    secret is printed or written (console, Parquet tables, JSON, the run's Ray logs). A rerun with nothing
    retryable left finishes in seconds with Ray unimportable."""
    import pyarrow.parquet as pq

    _broken_inputs(tmp_path / "in")
    s3_client.create_bucket(Bucket="leak")
    for f in (tmp_path / "in").iterdir():
        s3_client.upload_file(str(f), "leak", f"in/{f.name}")
    secret_env, needles = _secret_env(tmp_path)
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # this run's Ray logs, searched too (short: socket paths)
    env = dict(os.environ, **secret_env, RAY_TMPDIR=ray_tmp)
    args = [str(ROOT / "jobs/parse_corpus.py"), "--input", "s3://leak/in", "--output", "s3://leak/out",
            "--s3-endpoint", s3_server, "--checkpoint", str(tiny_checkpoint), "--backend", BACKEND, "--device", "cpu",
            "--max-tokens", "8", "--num-cpus", "2", "--page-timeout", "3", "-v"]
    try:
        first = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
        assert first.returncode == 3, first.stderr[-3000:]  # some documents failed, as they must
        store = OutputStore(resolve("s3://leak/out", load_config(None, {"input": {"uris": ["x"]}, "storage": {
            "s3_endpoint": s3_server}}).storage))
        docs = {d["uri"].rsplit("/", 1)[1]: d for d in store.documents().to_pylist()}
        assert {n: (d["status"], d["error_kind"]) for n, d in docs.items()} == {
            "letter.pdf": ("ok", None), "with-blank.pdf": ("ok", None), "locked.pdf": ("error", "encrypted"),
            "cut-off.pdf": ("error", "truncated"), "download.pdf": ("error", "not_pdf"),
            "slow.pdf": ("error", "timeout")}
        assert (docs["with-blank.pdf"]["pages_ok"], docs["with-blank.pdf"]["pages_blank"]) == (1, 1)
        pages = store.pages().to_pylist()
        slow = sorted((p["page_index"], p["status"]) for p in pages if p["uri"].endswith("slow.pdf"))
        assert slow == [(0, "ok"), (1, "error"), (2, "ok")]
        [blank] = [p for p in pages if p["status"] == "blank"]
        assert blank["text"] == "" and blank["output_tokens"] is None  # not sent to the model
        assert "blank 1" in first.stdout and "encrypted 1" in first.stdout and "truncated 1" in first.stdout

        # Nothing retryable is left with --max-attempts 1 (the timed-out page's document has had its one attempt).
        block_ray = ("import sys, runpy; sys.modules['ray'] = None; sys.argv = sys.argv[1:]; "
                     "runpy.run_path(sys.argv[0], run_name='__main__')")
        t = time.perf_counter()
        again = subprocess.run([sys.executable, "-c", block_ray, *args, "--max-attempts", "1"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr[-3000:]
        assert time.perf_counter() - t < 60 and "0 to process" in again.stdout  # no Ray: seconds, even on a busy machine
        assert "encrypted (not retried" in again.stdout and "failed 1 times" in again.stdout

        written = []
        for o in s3_client.list_objects_v2(Bucket="leak", Prefix="out/")["Contents"]:
            body = s3_client.get_object(Bucket="leak", Key=o["Key"])["Body"].read()
            written.append(body.decode("latin-1"))
            if o["Key"].endswith(".parquet"):  # compressed columns: search the values, not the bytes
                written.append(str(pq.read_table(pa.BufferReader(body)).to_pylist()))
        assert "with-blank.pdf" in "\n".join(written)  # the search reads what was written
        logs = [f.read_text(errors="replace") for f in Path(ray_tmp).rglob("*") if f.is_file() and f.stat().st_size
                < 50_000_000 and f.suffix in (".log", ".out", ".err", ".txt", ".json", "")]
        assert logs, "the run's Ray logs were not where RAY_TMPDIR put them: the test searched nothing"
        for name, text in (("stdout", first.stdout + again.stdout), ("stderr", first.stderr + again.stderr),
                           ("output", "\n".join(written)), ("Ray logs", "\n".join(logs))):
            assert not _leaked(needles, text), f"a secret is in the job's {name}: {_leaked(needles, text)}"
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_killed_driver_leaves_no_ray_process_behind(tmp_path, tiny_checkpoint):
    """kill -9 of the driver alone (not its process group): its local Ray's processes are gone within 30 s."""
    import psutil

    make_pdfs(tmp_path / "in", 16)
    args = [sys.executable, str(ROOT / "jobs/parse_corpus.py"), "--input", str(tmp_path / "in"),
            "--output", str(tmp_path / "out"), "--checkpoint", str(tiny_checkpoint), "--backend", BACKEND,
            "--device", "cpu", "--max-tokens", "32", "--batch-size", "2", "--commit-every", "1", "--num-cpus", "2"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    driver, helpers = psutil.Process(proc.pid), {}
    try:
        deadline = time.time() + 200
        while time.time() < deadline and proc.poll() is None and not list((tmp_path / "out" / "documents").glob("*")):
            for p in driver.children(recursive=True):  # Ray's processes, its workers, their render processes
                try:
                    helpers[p.pid] = (p.create_time(), " ".join(p.cmdline())[:120])
                except psutil.Error:
                    pass
            time.sleep(0.2)
        assert proc.poll() is None, "the job ended before it could be killed: the test did not test anything"
        assert any("raylet" in cmd for _, cmd in helpers.values()), helpers
    finally:
        proc.kill()
        proc.wait()
    alive = _still_running(helpers, 30)
    assert not alive, f"still running 30 s after the driver was killed: {alive}"


def _still_running(helpers: dict, seconds: float) -> dict:
    """The helpers ({pid: (create time, command)}) still running after up to `seconds` (a reused pid is not one)."""
    import psutil

    deadline = time.time() + seconds
    while True:
        alive = {pid: cmd for pid, (started, cmd) in helpers.items() if psutil.pid_exists(pid)
                 and _started(pid) == started and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE}
        if not alive or time.time() >= deadline:
            return alive
        time.sleep(0.5)


def _started(pid):
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
