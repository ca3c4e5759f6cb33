"""Shared fixtures: environment for offline runs, a tiny real-format checkpoint, real S3- and GCS-compatible servers."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton: kernels run on CPU here
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # no IMDS probing for credentials
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import contextlib  # noqa: E402
import importlib.util  # noqa: E402
import sys  # noqa: E402
import uuid  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
sys.path.insert(0, str(ROOT))


# Runs a job's entry point (argv[1]) as `python <script>` would, then says on stderr whether Ray was ever imported: a
# check that fails "before Ray starts" must not even have loaded it (python -c RAY_PROBE SCRIPT ARGS...).
RAY_PROBE = """import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    sys.stderr.write("\\nray imported: %s\\n" % ("ray" in sys.modules))
"""


def pytest_collection_modifyitems(config, items):
    """A test that starts Ray or runs longer than ~30 s is a whole-system run: `make test-system`, CI's second
    step, runs them; `make test` the rest."""
    for item in items:
        if item.get_closest_marker("ray") or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.system)


def require(present: bool, what: str) -> None:
    """Skip a test whose input is not on this machine, with the reason printed (make test runs pytest -rs); under CI
    (CI=true, where ../shared is checked out) fail instead, so a missing corpus cannot pass as skipped tests."""
    if present:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is missing, and CI=true: CI must provide it (check out ../shared next to this one)")
    pytest.skip(f"{what} is not on this machine")


@contextlib.contextmanager
def job_process(args, **popen):
    """The job as a subprocess in its own session (text stdout / stderr piped); killed with its group on the way out
    if a test left it running."""
    import signal
    import subprocess

    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def sigterm(proc, timeout: float = 60) -> tuple[str, float]:
    """SIGTERM to the job's driver alone (as a scheduler sends it); waits for it to exit: (its stderr, seconds taken)."""
    import signal
    import time

    t = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=timeout)
    return err, time.perf_counter() - t


def stop_ray_node(proc, temp: str, also=()) -> None:
    """A `ray start --block` started in its own session (`proc`) with its own `temp` dir: its process group, then
    every process whose command line names `temp` (and `also`), terminated, then killed after 15 s. Never `ray
    stop`, which stops every Ray on the machine."""
    import signal
    import subprocess

    import psutil

    procs = [p for p in psutil.process_iter(["cmdline"]) if temp in " ".join(p.info["cmdline"] or [])] + list(also)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=15)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def load_bench(name: str):
    """bench/<name>.py as a module (the bench folder is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def text_ckpt(tmp_path_factory, tiny_tokenizer):
    """A tiny random text-only checkpoint (qwen3_5_text, tied head) for the engine tests."""
    from engine.testing import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("txt"), vision=False, tie=True, tokenizer=tiny_tokenizer, seed=1)


@pytest.fixture(scope="session")
def vl_ckpt(tmp_path_factory, tiny_tokenizer):
    """A tiny random VL checkpoint (qwen3_5, untied head) for the engine tests."""
    from engine.testing import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("vl"), vision=True, tie=False, tokenizer=tiny_tokenizer, seed=2)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The BPE tokenizer engine.testing.build_checkpoint trains by default, trained once for tests that build several
    checkpoints."""
    from engine import hf_format
    from engine.testing import tokenizer_texts

    return hf_format.train_tokenizer(tokenizer_texts(), 600)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """The tiny random-weight Qwen3.5 VL checkpoint, built once per session in the real HF format."""
    from engine.testing import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-random", seed=0)


@pytest.fixture(scope="session")
def s3_server():
    """moto in server mode on 127.0.0.1: the job reaches it over HTTP through the same code path as real S3.
    Credentials go through the environment, as in production, so Ray workers started afterwards inherit them."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    yield f"http://{host}:{port}"
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def s3_client(s3_server):
    import boto3

    return boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")


@pytest.fixture(scope="session")
def gcs_server():
    """gcp-storage-emulator (pure Python, in memory) on 127.0.0.1: the job reaches it over HTTP through pyarrow's
    GcsFileSystem, the client it uses for real GCS, pointed at it by storage.gcs_endpoint or STORAGE_EMULATOR_HOST.
    The emulator checks no credentials, so buckets named denied-* answer every request with the 403 that GCS gives a
    caller without permission: the one response here that does not come from the emulator's own handlers."""
    import json
    import re
    import threading
    from functools import partial
    from http.server import HTTPServer

    from gcp_storage_emulator.server import RequestHandler
    from gcp_storage_emulator.storage import Storage

    class Handler(RequestHandler):
        def _denied(self) -> bool:
            if not re.search(r"/b/denied-[-.\w]*(/|\?|$)", self.path):
                return False
            body = json.dumps({"error": {"code": 403, "message": "caller does not have storage.objects access",
                                         "errors": [{"reason": "forbidden"}]}}).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return True

        def do_GET(self):
            self._denied() or super().do_GET()

        def do_POST(self):
            self._denied() or super().do_POST()

        def do_PUT(self):
            self._denied() or super().do_PUT()

        def do_DELETE(self):
            self._denied() or super().do_DELETE()

    httpd = HTTPServer(("127.0.0.1", 0), partial(Handler, Storage(use_memory_fs=True)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


@dataclass
class ObjectStore:
    """An object store under test: its URI scheme, the job's `storage` config for it, and a filesystem with the
    right to create buckets (test setup and inspection only; the job builds its own through pipeline.storage)."""

    scheme: str
    storage: dict
    fs: object
    deny: object  # contextmanager(uri) -> the same URI, to which access is denied inside the block

    def new_bucket(self, prefix: str = "b") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.fs.create_dir(name)
        return name

    def uri(self, path: str) -> str:
        return f"{self.scheme}://{path}"

    def upload_tree(self, folder: Path, dest: str) -> None:
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                self.put(f"{dest}/{f.relative_to(folder)}", f.read_bytes())

    def put(self, path: str, data: bytes) -> None:
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def keys(self, prefix: str) -> list[str]:
        import pyarrow.fs as pafs

        sel = pafs.FileSelector(prefix, recursive=True, allow_not_found=True)
        return sorted(f.path[len(prefix):].lstrip("/") for f in self.fs.get_file_info(sel)
                      if f.type == pafs.FileType.File)


@contextlib.contextmanager
def _s3_denied(endpoint: str, uri: str):
    """moto checks credentials once its auth is on: the job's keys become those of an IAM user with no policy."""
    import urllib.request

    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1")
    user = f"nobody-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    saved = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID=key["AccessKeyId"], AWS_SECRET_ACCESS_KEY=key["SecretAccessKey"])

    def auth(count: str):
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(),
                                                      headers={"Content-Type": "text/plain"}))

    auth("0")
    try:
        yield uri
    finally:
        auth("inf")
        os.environ.update(saved)


@pytest.fixture
def s3_store(s3_server) -> ObjectStore:
    import pyarrow.fs as pafs

    from pipeline.storage import endpoint_kwargs

    fs = pafs.S3FileSystem(region="us-east-1", allow_bucket_creation=True, **endpoint_kwargs(s3_server))
    return ObjectStore("s3", {"s3_endpoint": s3_server}, fs, lambda uri: _s3_denied(s3_server, uri))


@pytest.fixture
def gcs_store(gcs_server) -> ObjectStore:
    import pyarrow.fs as pafs

    from pipeline.storage import endpoint_kwargs

    @contextlib.contextmanager
    def deny(uri):  # the same path in a bucket that answers 403
        scheme, path = uri.split("://", 1)
        yield f"{scheme}://denied-{path}"

    fs = pafs.GcsFileSystem(anonymous=True, project_id="test", **endpoint_kwargs(gcs_server))
    return ObjectStore("gs", {"gcs_endpoint": gcs_server, "anonymous": True}, fs, deny)


@pytest.fixture(params=["s3", "gcs"])
def object_store(request) -> ObjectStore:
    """Each object store the job supports, on its server on 127.0.0.1."""
    return request.getfixturevalue(f"{request.param}_store")
