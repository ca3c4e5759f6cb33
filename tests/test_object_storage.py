"""s3:// and gs:// against real servers on 127.0.0.1 (moto, gcp-storage-emulator), without Ray: listing with
include/exclude over nested prefixes, reading documents, and the mistakes that must stop a job before Ray starts
(a missing bucket, a missing prefix, denied access) with a message that says what to fix."""
import pytest

from conftest import ROOT
from pipeline.checkpoint import CheckpointError, localize
from pipeline.config import ConfigError, StorageConfig, load_config
from pipeline.job import prepare
from pipeline.storage import list_documents, read_bytes, resolve

SAMPLES = ROOT / "samples"


def nested_tree(store, bucket):
    """Three levels of prefixes, upper- and lower-case suffixes, files the default globs must skip, and a sibling
    prefix that shares the listed prefix's first letters."""
    for key in ("in/a.pdf", "in/B.PDF", "in/2026/01/c.pdf", "in/2026/01/scan.png", "in/2026/tmp/d.pdf",
                "in/2026/02/notes.txt", "in/deep/er/still/e.jpg", "inbox/not-me.pdf"):
        store.put(f"{bucket}/{key}", key.encode())


def names(listed, bucket, scheme):
    return [f.uri.removeprefix(f"{scheme}://{bucket}/") for f in listed]


def test_listing_with_include_exclude_over_nested_prefixes(object_store):
    b = object_store.new_bucket()
    nested_tree(object_store, b)
    st = StorageConfig(**object_store.storage)
    uri = object_store.uri(f"{b}/in")
    default = load_config(None, {"input": {"uris": [uri]}}).input
    assert names(list_documents(uri, st, default.include, default.exclude), b, object_store.scheme) == [
        "in/2026/01/c.pdf", "in/2026/01/scan.png", "in/2026/tmp/d.pdf", "in/B.PDF", "in/a.pdf",
        "in/deep/er/still/e.jpg"]
    assert names(list_documents(uri, st, ["*.pdf"], ["*/tmp/*"]), b, object_store.scheme) == [
        "in/2026/01/c.pdf", "in/B.PDF", "in/a.pdf"]
    assert names(list_documents(uri, st, ["2026/*/*.pdf"], []), b, object_store.scheme) == [
        "in/2026/01/c.pdf", "in/2026/tmp/d.pdf"]
    assert names(list_documents(object_store.uri(f"{b}/in/2026/01/"), st, ["*"], ["*.png"]), b,
                 object_store.scheme) == ["in/2026/01/c.pdf"]
    [one] = list_documents(object_store.uri(f"{b}/in/a.pdf"), st, ["*.pdf"], [])  # a single object as input
    assert one.size == len(b"in/a.pdf") and one.mtime_ns > 0


def test_documents_read_from_the_bucket_are_the_uploaded_bytes(object_store):
    b = object_store.new_bucket()
    object_store.upload_tree(SAMPLES, f"{b}/in")
    st = StorageConfig(**object_store.storage)
    listed = list_documents(object_store.uri(f"{b}/in"), st, ["*"], [])
    assert len(listed) == sum(1 for f in SAMPLES.rglob("*") if f.is_file())
    loc = resolve(object_store.uri(b), st)
    for f in listed:
        local = SAMPLES / f.uri.split("/in/", 1)[1]
        assert f.size == local.stat().st_size and read_bytes(loc.fs, f.uri) == local.read_bytes()


def test_gcs_endpoint_from_storage_emulator_host(gcs_server, gcs_store, monkeypatch):
    """STORAGE_EMULATOR_HOST, the variable Google's clients read, points gs:// at the emulator with no config."""
    b = gcs_store.new_bucket()
    nested_tree(gcs_store, b)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.removeprefix("http://"))  # the form without a scheme too
    listed = list_documents(f"gs://{b}/in/2026", StorageConfig(), ["*.pdf"], [])
    assert names(listed, b, "gs") == ["in/2026/01/c.pdf", "in/2026/tmp/d.pdf"]


def job(store, inputs, output, checkpoint, tmp_path):
    return load_config(None, {"input": {"uris": inputs}, "output": output, "storage": store.storage,
                              "model": {"checkpoint": checkpoint, "device": "cpu"},
                              "run": {"cache_dir": str(tmp_path / "cache")}})


def prepare_fails(cfg) -> str:
    import ray

    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    assert not ray.is_initialized()
    return str(e.value)


def test_missing_bucket_or_prefix_fails_before_ray_naming_it(object_store, tiny_checkpoint, tmp_path):
    b = object_store.new_bucket()
    object_store.put(f"{b}/in/a.pdf", (SAMPLES / "letter.pdf").read_bytes())
    u = object_store.uri
    ok_in, ok_out, ckpt = u(f"{b}/in"), u(f"{b}/out"), str(tiny_checkpoint)
    msg = prepare_fails(job(object_store, [u(f"no-{b}/in")], ok_out, ckpt, tmp_path))
    assert f"cannot list input '{u(f'no-{b}/in')}': input not found" in msg and f"no bucket 'no-{b}'" in msg
    msg = prepare_fails(job(object_store, [u(f"{b}/typo")], ok_out, ckpt, tmp_path))
    assert f"input not found: {u(f'{b}/typo')}" in msg and "no bucket" not in msg
    msg = prepare_fails(job(object_store, [ok_in], u(f"no-{b}/out"), ckpt, tmp_path))
    assert f"--output '{u(f'no-{b}/out')}' cannot be written: bucket 'no-{b}' does not exist: create it" in msg
    msg = prepare_fails(job(object_store, [ok_in], ok_out, u(f"{b}/models/none"), tmp_path))
    assert f"no checkpoint files under {u(f'{b}/models/none')}" in msg
    assert object_store.keys(b) == ["in/a.pdf"]  # nothing was written by the failed attempts


def test_denied_access_fails_before_ray_naming_the_credentials(object_store, tiny_checkpoint, tmp_path):
    b = object_store.new_bucket()
    object_store.put(f"{b}/in/a.pdf", (SAMPLES / "letter.pdf").read_bytes())
    for f in tiny_checkpoint.iterdir():
        object_store.put(f"{b}/models/tiny/{f.name}", f.read_bytes())
    u = object_store.uri
    ckpt = str(tiny_checkpoint)
    creds = {"s3": "AWS_ACCESS_KEY_ID", "gs": "GOOGLE_APPLICATION_CREDENTIALS"}[object_store.scheme]
    with object_store.deny(u(f"{b}/in")) as denied:
        msg = prepare_fails(job(object_store, [denied], str(tmp_path / "out"), ckpt, tmp_path))
    assert f"cannot list input '{denied}': access denied to {denied}: give the credentials" in msg and creds in msg
    with object_store.deny(u(f"{b}/out")) as denied:
        msg = prepare_fails(job(object_store, [str(SAMPLES)], denied, ckpt, tmp_path))
    assert f"--output '{denied}' cannot be written: access denied to {denied}" in msg and creds in msg
    with object_store.deny(u(f"{b}/models/tiny")) as denied:
        with pytest.raises(CheckpointError, match=f"cannot copy the checkpoint from {denied}: access denied"):
            localize(denied, StorageConfig(**object_store.storage), str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_checkpoint_copied_from_the_bucket_is_byte_identical(object_store, tiny_checkpoint, tmp_path):
    b = object_store.new_bucket()
    object_store.upload_tree(tiny_checkpoint, f"{b}/models/tiny")
    st = StorageConfig(**object_store.storage)
    local = localize(object_store.uri(f"{b}/models/tiny/"), st, str(tmp_path / "cache"))
    for f in tiny_checkpoint.rglob("*"):
        if f.is_file():
            assert (tmp_path / "cache" / local.rsplit("/", 1)[1] / f.relative_to(tiny_checkpoint)).read_bytes() == \
                f.read_bytes(), f
    assert localize(object_store.uri(f"{b}/models/tiny/"), st, str(tmp_path / "cache")) == local  # copied once




def closed_port() -> int:
    """A port on 127.0.0.1 with nothing listening (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_object_store_client_is_built_with_bounded_time():
    """The limits pyarrow's clients are built with: the config's, never the clients' own defaults (15 min on GCS)."""
    from datetime import timedelta

    st = StorageConfig(connect_timeout_s=4, request_timeout_s=9, retry_time_limit_s=17)
    s3 = resolve("s3://b/k", st).fs.__reduce__()[1][0]
    gcs = resolve("gs://b/k", st).fs.__reduce__()[1][0]
    assert (s3["connect_timeout"], s3["request_timeout"], gcs["retry_time_limit"]) == (4, 9, timedelta(seconds=17))
    default = StorageConfig()
    assert default.retry_time_limit_s < 60 and 3 * (default.connect_timeout_s + default.request_timeout_s) < 60


@pytest.mark.slow  # the job's command line against a closed port: up to its retry limit
@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["s3-output", "gcs-input"])
def test_an_unreachable_endpoint_fails_in_one_line_naming_it(where, tiny_checkpoint, tmp_path):
    """Nothing listens at the endpoint: the command stops before Ray, at the default limits, well under a minute,
    in one line that names the endpoint, says it cannot be reached and which setting points elsewhere."""
    import time

    from test_config import run_cli

    endpoint = f"http://127.0.0.1:{closed_port()}"
    args, says = {
        "s3-output": (["--input", str(SAMPLES), "--output", "s3://bucket/out", "--s3-endpoint", endpoint],
                      f"--output 's3://bucket/out' cannot be written: cannot reach the S3 endpoint {endpoint} for "
                      f"s3://bucket/out: nothing answers at its address and port (connection refused); check "
                      f"--s3-endpoint (storage.s3_endpoint)"),
        "gcs-input": (["--input", "gs://bucket/in", "--output", str(tmp_path / "out")],
                      f"cannot list input 'gs://bucket/in': cannot reach the GCS endpoint {endpoint} for gs://bucket/in"
                      f": nothing answers at its address and port (connection refused); check STORAGE_EMULATOR_HOST"),
    }[where]
    t = time.perf_counter()
    proc, ray_imported = run_cli(*args, "--checkpoint", str(tiny_checkpoint), timeout=90,
                                 env={"STORAGE_EMULATOR_HOST": endpoint})  # an emulator: reached without credentials
    took = time.perf_counter() - t
    assert proc.returncode == 2 and not ray_imported, proc.stderr  # the run could not start
    assert proc.stderr.strip().splitlines() == [f"Error: {says}, that the server is up, and that this machine can "
                                                f"reach it"], proc.stderr
    assert took < 60, f"{took:.0f} s"


def test_unreachable_or_missing_on_every_path_is_said_plainly(gcs_store, tiny_checkpoint, tmp_path):
    """The other paths, in-process: an S3 input and a GCS output at a closed port (GCS at a 2-second limit, which it
    keeps), and a missing bucket on the GCS server, which answers at once."""
    import time

    endpoint = f"http://127.0.0.1:{closed_port()}"
    ckpt = str(tiny_checkpoint)
    s3 = {"s3_endpoint": endpoint}
    cfg = load_config(None, {"input": {"uris": ["s3://bucket/in"]}, "output": str(tmp_path / "out"), "storage": s3,
                             "model": {"checkpoint": ckpt, "device": "cpu"}})
    assert f"cannot reach the S3 endpoint {endpoint} for s3://bucket/in: nothing answers" in prepare_fails(cfg)
    gcs = {"gcs_endpoint": endpoint, "anonymous": True, "retry_time_limit_s": 2}
    cfg = load_config(None, {"input": {"uris": [str(SAMPLES)]}, "output": "gs://bucket/out", "storage": gcs,
                             "model": {"checkpoint": ckpt, "device": "cpu"}})
    t = time.perf_counter()
    msg = prepare_fails(cfg)
    assert f"cannot reach the GCS endpoint {endpoint} for gs://bucket/out" in msg and time.perf_counter() - t < 15
    cfg = load_config(None, {"input": {"uris": ["gs://no-such-bucket/in"]}, "output": str(tmp_path / "out"),
                             "storage": gcs_store.storage, "model": {"checkpoint": ckpt, "device": "cpu"}})
    t = time.perf_counter()
    assert "input not found: gs://no-such-bucket/in (there is no bucket 'no-such-bucket')" in prepare_fails(cfg)
    assert time.perf_counter() - t < 10
