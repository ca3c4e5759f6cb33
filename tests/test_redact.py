"""pipeline.redact: credentials out of a message (userinfo, signed query strings, keys from the environment and
from a Google key file) and out of every log record, while what is not a credential is left as it was."""
import json
import logging
import os
import secrets

import pytest

from pipeline.redact import MASK, install_log_redaction, redact, secret_values

pytestmark = pytest.mark.timeout(120)


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
