"""Credentials out of every message, log line and error row the job writes.

One function, `redact`, applied wherever the job formats an error or a log line: the exceptions a person reads
(ConfigError, CheckpointError, RayStartError, DocumentError) redact their own message, OutputStore.commit redacts the
`error` column of every row, the command line redacts what it prints, and `install_log_redaction` makes every log
record of the process (Ray's and pyarrow's included) pass through it.

What it hides:
- the userinfo of a URI (`http://user:pass@host`, `https://token@host`): `scheme://***@host`;
- the values of signed-URL and token query parameters (`X-Amz-Signature`, `X-Amz-Credential`,
  `X-Amz-Security-Token`, `X-Goog-Signature`, `X-Goog-Credential`, `Signature`, `AWSAccessKeyId`, `GoogleAccessId`,
  `sig`, `token`, `access_token`, `key`): `X-Amz-Signature=***`;
- the values of credential variables in this process's environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
  AWS_SESSION_TOKEN, Google's token variables, and any variable whose name ends in _SECRET, _TOKEN, _PASSWORD,
  _API_KEY, _ACCESS_KEY, _SECRET_KEY, _PRIVATE_KEY or _ACCESS_KEY_ID), as given or URL-encoded, wherever they appear;
- the secrets of the key file GOOGLE_APPLICATION_CREDENTIALS names (private key, its id, client secret, refresh
  token), each line of a PEM key on its own, since a message may quote one line of it.

The variables are read when `redact` runs, not at import: a Ray worker redacts with its own environment, and a test
that sets credentials after import is covered.
"""
from __future__ import annotations

import json
import logging
import os
import re
import traceback
from urllib.parse import quote

MASK = "***"
MIN_SECRET_LEN = 8  # shorter values (moto's "testing", "false") would blank ordinary words out of every message

SECRET_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                    "GOOGLE_API_KEY", "GOOGLE_OAUTH_ACCESS_TOKEN", "CLOUDSDK_AUTH_ACCESS_TOKEN")
_SECRET_NAME = re.compile(r"(^|_)(SECRET|TOKEN|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|SECRET_KEY|PRIVATE_KEY|"
                          r"ACCESS_KEY_ID)$")
CREDENTIAL_FILE_VARIABLES = ("GOOGLE_APPLICATION_CREDENTIALS",)  # a path (not secret): the file's fields are
CREDENTIAL_FILE_FIELDS = ("private_key", "private_key_id", "client_secret", "refresh_token", "access_token")
_KEY_FILE_MAX_BYTES = 1 << 20

# scheme://user:password@ or scheme://token@ ; a password may hold '/' (an unencoded AWS secret) but no space,
# quote or '@', so the match ends at the first '@'
_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^\s/@:'\"<>]+:[^\s@'\"<>]*|[^\s/@:'\"<>]+)@")
_SIGNED_PARAM = re.compile(
    r"([?&;](?:X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|X-Goog-Signature|X-Goog-Credential|Signature|"
    r"AWSAccessKeyId|GoogleAccessId|sig|token|access_token|key)=)[^&\s'\"#<>]*", re.IGNORECASE)

_key_file_cache: dict[tuple, list[str]] = {}


def _key_file_secrets(path: str) -> list[str]:
    """The secret fields of a Google credentials JSON file (cached by path, size and mtime)."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    cache_key = (path, st.st_size, st.st_mtime_ns)
    if cache_key not in _key_file_cache:
        found: list[str] = []
        if st.st_size <= _KEY_FILE_MAX_BYTES:
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError):
                data = None
            if isinstance(data, dict):
                for name in CREDENTIAL_FILE_FIELDS:
                    value = data.get(name)
                    if isinstance(value, str):
                        found.append(value)
                        found += [line.strip() for line in value.splitlines() if len(line.strip()) >= 16
                                  and not line.startswith("-----")]
        _key_file_cache.clear()
        _key_file_cache[cache_key] = found
    return _key_file_cache[cache_key]


def secret_values(environ=None) -> list[str]:
    """The credential values this process holds (see the module docstring), longest first."""
    env = os.environ if environ is None else environ
    values = set()
    for name, value in env.items():
        if name in CREDENTIAL_FILE_VARIABLES:
            values.update(_key_file_secrets(value))
        elif name in SECRET_VARIABLES or _SECRET_NAME.search(name):
            values.add(value)
    out = set()
    for v in values:
        v = v.strip()
        if len(v) >= MIN_SECRET_LEN:
            out.add(v)
            out.add(quote(v, safe=""))
    return sorted(out, key=len, reverse=True)


def redact(text: object) -> str:
    """`text` (anything: its str()) with every credential it holds replaced by ***."""
    s = text if isinstance(text, str) else str(text)
    if not s:
        return s
    s = _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", s)
    s = _SIGNED_PARAM.sub(lambda m: f"{m.group(1)}{MASK}", s)
    for value in secret_values():
        if value in s:
            s = s.replace(value, MASK)
    return s


def redacted_message(e: BaseException) -> str:
    """An exception's message, redacted (its type name when it has none)."""
    return redact(str(e)) or type(e).__name__


_installed = False


def install_log_redaction() -> None:
    """Every log record made in this process from now on carries a redacted message and traceback, whichever
    logger and handler it goes to (a record factory, not a handler filter: Ray's loggers have their own handlers).
    Idempotent."""
    global _installed
    if _installed:
        return
    make = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = make(*args, **kwargs)
        try:
            record.msg, record.args = redact(record.getMessage()), ()
        except Exception:  # noqa: BLE001  (a record whose arguments do not format: logging reports it as it would)
            return record
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
        return record

    logging.setLogRecordFactory(factory)
    _installed = True


def redacting_excepthook(kind, value, tb) -> None:
    """sys.excepthook for a command line: an uncaught exception's traceback, redacted, on stderr."""
    import sys

    sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))
