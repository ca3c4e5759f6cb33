"""Credentials stay out of what the job prints, logs and writes, on its error paths too: each path is driven with
secret-looking values (a denied request on the S3 server with freshly made keys, an endpoint with user:password@, a
signed URL as input, a Google key file, keys in the environment) and the test fails if one comes out."""
import json
import logging
import os
import secrets

import pyarrow.parquet as pq
import pytest

from conftest import ROOT
from test_config import run_cli
from pipeline.checkpoint import CheckpointError, localize
from pipeline.config import ConfigError, StorageConfig, load_config
from pipeline.job import prepare
from pipeline.output import DocMeta, OutputStore, document_row
from pipeline.redact import MASK, install_log_redaction, redact, secret_values
from pipeline.schema import PAGE_SCHEMA, empty_row
from pipeline.storage import resolve

pytestmark = pytest.mark.timeout(120)
SAMPLES = ROOT / "samples"


def aws_secrets() -> dict:
    return {"AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
            "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/" + secrets.token_urlsafe(24),
            "AWS_SESSION_TOKEN": "IQoJb3JpZ2luX2VjE" + secrets.token_urlsafe(48)}


def google_key_file(path) -> list[str]:
    """A service-account key file with a secret-looking key; returns what must never be shown of it."""
    key = "-----BEGIN PRIVATE KEY-----\nMIIE" + secrets.token_urlsafe(48) + "\n" + secrets.token_urlsafe(48) + \
          "\n-----END PRIVATE KEY-----\n"
    data = {"type": "service_account", "private_key_id": secrets.token_hex(20), "private_key": key,
            "client_email": "parser@example.iam.gserviceaccount.com"}
    path.write_text(json.dumps(data))
    return [data["private_key_id"], key, *key.splitlines()[1:3]]


def signed_query() -> tuple[str, list[str]]:
    sig, cred, tok = secrets.token_hex(32), "AKIA" + secrets.token_hex(8).upper(), secrets.token_urlsafe(40)
    return (f"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={cred}%2F20261207%2Fus-east-1%2Fs3%2Faws4_request"
            f"&X-Amz-Security-Token={tok}&X-Amz-Signature={sig}&X-Amz-Expires=3600"), [sig, cred, tok]


def leaked(needles, *texts) -> list[str]:
    text = "\n".join(map(str, texts))
    return [n[:10] + "..." for n in needles if n and n in text]


def test_redact_hides_userinfo_signed_queries_and_the_environments_keys(tmp_path, monkeypatch):
    env = aws_secrets()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HF_TOKEN", "hf_" + secrets.token_hex(16))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "sa.json"))
    key_secrets = google_key_file(tmp_path / "sa.json")
    query, signed = signed_query()
    secret = env["AWS_SECRET_ACCESS_KEY"]
    cases = {
        f"http://minio:{secret}@127.0.0.1:9000/bucket": f"http://{MASK}@127.0.0.1:9000/bucket",
        "https://ghp_0123456789abcdef@github.com/x.git": f"https://{MASK}@github.com/x.git",
        f"https://b.s3.amazonaws.com/a.pdf?{query}": None,
        f"gs://b/a.pdf?X-Goog-Signature={signed[0]}&X-Goog-Credential=sa%40p.iam": None,
        f"denied: key {env['AWS_ACCESS_KEY_ID']} token {env['AWS_SESSION_TOKEN']}": f"denied: key {MASK} token {MASK}",
        f"url-encoded {secret.replace('/', '%2F')} in a query": f"url-encoded {MASK} in a query",
        "HF said " + os.environ["HF_TOKEN"]: f"HF said {MASK}",
        f"key line {key_secrets[2]} quoted": f"key line {MASK} quoted",
        f"key id {key_secrets[0]}": f"key id {MASK}",
    }
    needles = [*env.values(), *signed, *key_secrets]
    for given, want in cases.items():
        got = redact(given)
        assert not leaked(needles, got), (given, got)
        if want is not None:
            assert got == want
    assert "X-Amz-Signature=***" in redact(f"?{query}") and "X-Amz-Expires=3600" in redact(f"?{query}")
    # What is not a credential is left as it was: the messages must still say which file and what happened.
    for plain in ("s3://bucket/scans/page@2x.png", "http://127.0.0.1:9000/bucket/key", "mail me at ops@example.com",
                  "cannot list input 'gs://b/in': input not found", "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
                  str(tmp_path / "sa.json")):
        assert redact(plain) == plain
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")  # too short to be told from a word: left alone
    assert "testing" not in secret_values() and redact("testing 1 2 3") == "testing 1 2 3"


def test_log_records_and_their_tracebacks_are_redacted(monkeypatch, caplog):
    env = aws_secrets()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    install_log_redaction()
    log = logging.getLogger("ocria.test.redact")
    with caplog.at_level(logging.INFO, logger="ocria.test.redact"):
        log.info("endpoint %s key %s", "http://u:pw-" + env["AWS_SECRET_ACCESS_KEY"] + "@h:1", env["AWS_ACCESS_KEY_ID"])
        try:
            raise OSError(f"denied for {env['AWS_SESSION_TOKEN']}")
        except OSError:
            log.exception("storage failed")
    text = caplog.text + "".join(r.exc_text or "" for r in caplog.records)
    assert "storage failed" in text and "OSError: denied for ***" in text and "endpoint http://***@h:1" in text
    assert not leaked(env.values(), text)


def _job(store, inputs, output, checkpoint, tmp_path, **storage):
    return load_config(None, {"input": {"uris": inputs}, "output": output, "storage": {**store.storage, **storage},
                              "model": {"checkpoint": checkpoint, "device": "cpu"},
                              "run": {"cache_dir": str(tmp_path / "cache")}})


def test_denied_access_on_s3_with_secret_looking_keys_leaks_nothing(s3_store, s3_server, tiny_checkpoint, tmp_path,
                                                                   caplog):
    """moto with its IAM check on and the job's keys those of a new user without a policy (real AKIA... keys with a
    40-character secret): the input, the output, the checkpoint copy and a document read are each denied; the
    messages, the error row written to Parquet and the log hold neither key."""

    from pipeline.rasterize import RasterOptions
    from pipeline.stages import RasterizeStage

    b = s3_store.new_bucket()
    s3_store.put(f"{b}/in/a.pdf", (SAMPLES / "letter.pdf").read_bytes())
    s3_store.upload_tree(tiny_checkpoint, f"{b}/models/tiny")
    install_log_redaction()
    st = StorageConfig(**s3_store.storage)
    messages = []
    with caplog.at_level(logging.DEBUG), s3_store.deny(s3_store.uri(f"{b}/in")) as denied:
        needles = [os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]]
        assert needles[0].startswith("AKIA") and len(needles[1]) >= 30  # the keys the denied requests were signed with
        for inputs, output in (([denied], str(tmp_path / "out")), ([str(SAMPLES)], s3_store.uri(f"{b}/out"))):
            with pytest.raises(ConfigError) as e:
                prepare(_job(s3_store, inputs, output, str(tiny_checkpoint), tmp_path))
            messages.append(str(e.value))
        with pytest.raises(CheckpointError) as e:
            localize(s3_store.uri(f"{b}/models/tiny"), st, str(tmp_path / "cache"))
        messages.append(str(e.value))
        rows = list(RasterizeStage(st, RasterOptions(), 30, 0)._document_rows(f"{denied}/a.pdf"))
    assert [(r["status"], r["error_kind"]) for r in rows] == [("error", "unreadable")]
    page = empty_row(PAGE_SCHEMA, run_id="r", **{k: v for k, v in rows[0].items() if k in PAGE_SCHEMA.names})
    OutputStore(resolve(str(tmp_path / "rows"), st)).commit("r", [page], [document_row("r", [page], DocMeta(1, 1, 1),
                                                                                       500)])
    written = [pq.read_table(p).to_pylist() for p in (tmp_path / "rows").rglob("*.parquet")]
    assert all("access denied" in m or "ACCESS_DENIED" in m for m in messages), messages
    assert "cannot read the file" in str(written)  # the search reads the rows that were written
    # the test's own S3 server and client log the keys as they make them (moto, boto3): not the job's log
    job_log = [r.getMessage() + (r.exc_text or "") for r in caplog.records
               if not r.name.startswith(("moto", "werkzeug", "botocore", "boto3", "urllib3"))]
    assert not leaked(needles, *messages, written, *job_log)


def test_an_endpoint_with_credentials_is_refused_without_printing_them(tmp_path, tiny_checkpoint):
    """--s3-endpoint / --gcs-endpoint with user:password@: refused before Ray in one line that shows neither."""
    env = aws_secrets()
    for flag in ("--s3-endpoint", "--gcs-endpoint"):
        endpoint = f"http://{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}@127.0.0.1:9"
        proc, ray_imported = run_cli("--input", str(SAMPLES), "--output", str(tmp_path / "out"), "--checkpoint",
                                     str(tiny_checkpoint), flag, endpoint)
        assert proc.returncode == 2 and not ray_imported, proc.stderr
        assert "carries credentials" in proc.stderr and "http://***@127.0.0.1:9" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 2, proc.stderr  # the config error's heading and its line
        assert not leaked(env.values(), proc.stdout, proc.stderr)
    with pytest.raises(ConfigError, match="carries credentials") as e:  # without a scheme too (host:port means http)
        load_config(None, {"input": {"uris": ["x"]}, "storage": {"s3_endpoint": "k:" + env["AWS_SESSION_TOKEN"]
                                                                                + "@minio:9000"}})
    assert not leaked(env.values(), e.value)


def test_a_signed_url_as_input_is_refused_without_its_signature(s3_store, tiny_checkpoint, tmp_path):
    """A presigned https URL (not a URI the job lists) and an s3:// URI with a signed query string that matches no
    object: each refused before Ray, naming the input with its signature, credential and token shown as ***."""
    query, needles = signed_query()
    b = s3_store.new_bucket()
    https = f"https://{b}.s3.amazonaws.com/in/a.pdf?{query}"
    proc, ray_imported = run_cli("--input", https, "--output", str(tmp_path / "out"), "--checkpoint",
                                 str(tiny_checkpoint))
    assert proc.returncode == 2 and not ray_imported, proc.stderr
    assert "unsupported URI scheme" in proc.stderr and "X-Amz-Signature=***" in proc.stderr, proc.stderr
    assert not leaked(needles, proc.stdout, proc.stderr)
    s3 = s3_store.uri(f"{b}/in/a.pdf?{query}")
    with pytest.raises(ConfigError, match="input not found") as e:
        prepare(_job(s3_store, [s3], str(tmp_path / "out"), str(tiny_checkpoint), tmp_path))
    assert f"{b}/in/a.pdf?" in str(e.value) and not leaked(needles, e.value)


def test_a_broken_google_key_file_is_named_without_its_key(gcs_store, tiny_checkpoint, tmp_path, monkeypatch):
    """GOOGLE_APPLICATION_CREDENTIALS naming a key file whose private key does not parse, against the GCS server
    without storage.anonymous: one line saying the credentials are not usable and why, with no part of the key."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "sa.json"))
    needles = google_key_file(tmp_path / "sa.json")
    b = gcs_store.new_bucket()
    cfg = _job(gcs_store, [gcs_store.uri(f"{b}/in")], str(tmp_path / "out"), str(tiny_checkpoint), tmp_path,
               anonymous=False)
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    msg = str(e.value)
    assert "no usable GCS credentials" in msg and "could not parse PEM" in msg and "\n" not in msg, msg
    assert not leaked(needles, msg)
