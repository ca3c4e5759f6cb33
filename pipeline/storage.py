"""Object storage through pyarrow filesystems: one code path for s3:// (and S3-compatible endpoints), gs:// (and
GCS-compatible endpoints: emulators) and local.

Credentials are never passed here: pyarrow's S3/GCS clients take them from the environment or the standard chains.

Every object-store call is bounded in time: S3 by a connect timeout, a read timeout (seconds without a byte) and a
fixed number of tries; GCS by a total retry time per call (google-cloud-cpp's own default is 15 minutes, during which
the process prints nothing and, inside the C++ call, does not see SIGTERM). An endpoint that cannot be reached then
fails in seconds with `explain`'s one line naming it.
"""
from __future__ import annotations

import fnmatch
import logging
import os
import random
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.redact import redact

if TYPE_CHECKING:  # annotations only, as in pipeline.checkpoint
    from pipeline.config import StorageConfig

log = logging.getLogger("ocria.storage")


@dataclass(frozen=True)
class Location:
    """A resolved URI: the filesystem, the path inside it, and the canonical URI prefix for that filesystem."""

    fs: pafs.FileSystem
    path: str  # bucket/key for object stores, absolute path for local
    scheme: str  # "s3", "gs" or "file"

    def uri(self, path: str | None = None) -> str:
        p = self.path if path is None else path
        return f"file://{p}" if self.scheme == "file" else f"{self.scheme}://{p}"

    def join(self, *parts: str) -> str:
        return "/".join([self.path.rstrip("/"), *parts])


def endpoint_kwargs(url: str | None) -> dict:
    """An endpoint URL as pyarrow's S3/GCS clients take it: host[:port] and scheme (http unless it says https)."""
    if not url:
        return {}
    return {"scheme": "https" if url.startswith("https://") else "http",
            "endpoint_override": url.split("://", 1)[-1].rstrip("/")}


S3_MAX_ATTEMPTS = 3  # tries of one S3 request (the AWS SDK's standard retry strategy: backoff with jitter)


def _emulator(storage: StorageConfig) -> str | None:
    """STORAGE_EMULATOR_HOST, the variable Google's client libraries read for an emulator (which they reach without
    credentials), unless storage.gcs_endpoint is set; pyarrow's client does not read it, so it is passed on here."""
    return None if storage.gcs_endpoint else os.environ.get("STORAGE_EMULATOR_HOST") or None


def make_filesystem(scheme: str, storage: StorageConfig) -> pafs.FileSystem:
    if scheme == "s3":
        return pafs.S3FileSystem(region=storage.s3_region, anonymous=storage.anonymous,
                                 connect_timeout=storage.connect_timeout_s, request_timeout=storage.request_timeout_s,
                                 retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=S3_MAX_ATTEMPTS),
                                 **endpoint_kwargs(storage.s3_endpoint))
    if scheme == "gs":
        emulator = _emulator(storage)
        return pafs.GcsFileSystem(anonymous=storage.anonymous or bool(emulator),
                                  retry_time_limit=timedelta(seconds=max(1, round(storage.retry_time_limit_s))),
                                  **endpoint_kwargs(storage.gcs_endpoint or emulator))
    return pafs.LocalFileSystem()


def endpoint_of(scheme: str, storage: StorageConfig) -> tuple[str, str]:
    """Where requests for `scheme` go (the URL, redacted) and how a person points them elsewhere."""
    if scheme == "s3":
        url = storage.s3_endpoint or f"https://s3.{storage.s3_region}.amazonaws.com"
        return redact(url), "--s3-endpoint (storage.s3_endpoint)"
    emulator = _emulator(storage)
    url = storage.gcs_endpoint or emulator or "https://storage.googleapis.com"
    if emulator and "://" not in url:
        url = f"http://{url}"
    return redact(url), ("STORAGE_EMULATOR_HOST" if emulator else "--gcs-endpoint (storage.gcs_endpoint)")


def resolve(uri: str, storage: StorageConfig) -> Location:
    if uri.startswith("s3://"):
        return Location(make_filesystem("s3", storage), uri[5:].rstrip("/"), "s3")
    if uri.startswith(("gs://", "gcs://")):
        return Location(make_filesystem("gs", storage), uri.split("://", 1)[1].rstrip("/"), "gs")
    if "://" in uri and not uri.startswith("file://"):
        raise ValueError(f"unsupported URI scheme in {uri!r}: use s3://, gs://, file:// or a local path")
    local = uri[7:] if uri.startswith("file://") else uri
    return Location(pafs.LocalFileSystem(), str(Path(local).expanduser().resolve()), "file")


# Where pyarrow's clients look for credentials, named in the error a denied request gets.
CREDENTIAL_SOURCES = {"s3": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the rest of the AWS chain",
                      "gs": "GOOGLE_APPLICATION_CREDENTIALS or gcloud's application-default credentials"}
CREDENTIAL_SOURCES["gcs"] = CREDENTIAL_SOURCES["gs"]  # resolve() takes gcs:// too
DENIED_MARKERS = ("ACCESS_DENIED", "AccessDenied", "PERMISSION_DENIED", "UNAUTHENTICATED", "InvalidAccessKeyId",
                  "SignatureDoesNotMatch")


# What the S3 SDK (curlCode: N) and google-cloud-cpp (CURL error [N]) say when no answer came back, in words.
CURL_CAUSES = {6: "its host name does not resolve", 7: "nothing answers at its address and port (connection refused)",
               28: "it did not answer in time", 35: "the TLS handshake failed",
               52: "it closed the connection without answering", 56: "the connection was reset",
               60: "its TLS certificate is not trusted"}
_CURL_CODE = re.compile(r"curlCode: (\d+)|CURL error \[(\d+)\]")
UNREACHABLE_MARKERS = ("NETWORK_CONNECTION", "Could not connect", "Could not resolve", "Timeout was reached",
                       "DEADLINE_EXCEEDED")
# google-cloud-cpp's retry loop ends the same way whether its tries got no answer (a curl code then says why) or got
# 5xx answers (its last message is the store's): only the first is unreachable.
GCS_RETRIES_SPENT = "UNAVAILABLE: Retry policy exhausted"
_GCS_LAST = re.compile(r"with a last message of (.*?)(?: error_info=|$)", re.S)
_HTTP_STATUS = re.compile(r"HTTP status (\d{3})")
NO_GCS_TOKEN = "Could not create a OAuth2 access token"
_GCS_UNDERLYING = re.compile(r"The underlying error message was: (.*?)(?: error_info=|$)", re.S)


def unreachable_cause(e: BaseException) -> str | None:
    """Why a storage request got no answer (in words), or None when it got one (an HTTP error is an answer)."""
    text = str(e)
    m = _CURL_CODE.search(text)
    if not any(mk in text for mk in UNREACHABLE_MARKERS) and not (GCS_RETRIES_SPENT in text and m):
        return None
    code = int(m.group(1) or m.group(2)) if m else None
    return CURL_CAUSES.get(code, f"network error (curl code {code})" if code else "no answer")


def explain(uri: str, e: OSError, storage: StorageConfig | None = None) -> str:
    """A storage error in words that say what to fix, redacted: a denied request names where the credentials came
    from, an endpoint that does not answer is named (with `storage`) with the setting that points elsewhere."""
    scheme = uri.split("://", 1)[0] if "://" in uri else "file"
    scheme = "gs" if scheme == "gcs" else scheme
    text = str(e)
    if isinstance(e, PermissionError) or any(m in text for m in DENIED_MARKERS):
        source = CREDENTIAL_SOURCES.get(scheme, "this process's user")
        return redact(f"access denied to {uri}: give the credentials the job found ({source}) the right to use it, "
                      f"or set storage.anonymous for a public bucket")
    if scheme == "gs" and NO_GCS_TOKEN in text:
        why = _GCS_UNDERLYING.search(text)
        return redact(f"no usable GCS credentials for {uri} ({why.group(1).strip() if why else 'no access token'}): "
                      f"pyarrow's GCS client found none it could use in {CREDENTIAL_SOURCES['gs']} (or, on GCP, the "
                      f"metadata server): fix them, or set storage.anonymous for a public bucket or an emulator")
    name = {"s3": "S3", "gs": "GCS"}.get(scheme)
    url, knob = endpoint_of(scheme, storage) if name and storage is not None else (None, None)
    cause = unreachable_cause(e)
    if cause and url:
        return redact(f"cannot reach the {name} endpoint {url} for {uri}: {cause}; check {knob}, that the server is "
                      f"up, and that this machine can reach it")
    if cause:
        return redact(f"cannot reach the object store for {uri}: {cause}")
    answer = error_answer(text)
    if answer and name and transient(e):
        where = f"the {name} endpoint {url}" if url else "the object store"
        return redact(f"{where} answered {answer} for {uri} on every try: it is reached but failing or throttling; "
                      f"run again later (a document that failed this way is retried by the next run)")
    return redact(text)


def error_answer(text: str) -> str | None:
    """The error a store answered with, in short (S3: its HTTP status; GCS: the status and the store's last message),
    or None when the text names none."""
    m = _HTTP_STATUS.search(text)
    if m and m.group(1)[0] in "45":
        return f"HTTP {m.group(1)}"
    m = _GCS_LAST.search(text) if GCS_RETRIES_SPENT in text else None
    return f"UNAVAILABLE ({m.group(1).strip()!r})" if m else None


# One storage operation (a read, an upload, a listing, a delete) is tried again as a whole when it fails with an error
# that may pass: the clients retry one request (S3: 3 tries; GCS: for retry_time_limit_s), but not an operation of
# several requests (a multipart or resumable upload, a read's HEAD then GETs), and a burst of throttling outlasts 3
# tries. Bounded: STORAGE_TRIES tries, and none started after STORAGE_RETRY_WINDOW_S, so the time limits above still
# bound an operation.
STORAGE_TRIES = 4
STORAGE_BACKOFF_S = 0.5  # first wait; doubled each try, capped, with full jitter
STORAGE_BACKOFF_CAP_S = 4.0
STORAGE_RETRY_WINDOW_S = 30.0
RETRIES: Counter = Counter()  # operation verb -> tries again in this process (read by tests and bench/storage_faults.py)
_NO_ANSWER_CURL = {6, 7, 35, 60}  # no store at the endpoint (resolve, refused, TLS): trying again does not help


def transient(e: BaseException) -> bool:
    """Whether a storage error may pass if the operation is tried again: throttling, a 5xx, a reset or cut-off answer,
    a timeout. Not: a missing object, a denied request, credentials that cannot be used, an endpoint with no store."""
    if not isinstance(e, OSError) or isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    text = str(e)
    if any(m in text for m in DENIED_MARKERS) or NO_GCS_TOKEN in text:
        return False
    m = _CURL_CODE.search(text)
    if m and int(m.group(1) or m.group(2)) in _NO_ANSWER_CURL:
        return False
    return "Could not resolve" not in text and "Could not connect" not in text


def retrying(what: str, call, *args, tries: int | None = None, **kwargs):
    """call(*args, **kwargs), tried again with exponential backoff and full jitter while it fails with a transient
    error, at most `tries` (STORAGE_TRIES) times and not after STORAGE_RETRY_WINDOW_S; the last error is raised."""
    tries = STORAGE_TRIES if tries is None else tries
    start = time.monotonic()
    for attempt in range(1, tries + 1):
        try:
            return call(*args, **kwargs)
        except OSError as e:
            if attempt == tries or not transient(e) or time.monotonic() - start > STORAGE_RETRY_WINDOW_S:
                raise
            wait = random.uniform(0, min(STORAGE_BACKOFF_CAP_S, STORAGE_BACKOFF_S * 2 ** (attempt - 1)))
            RETRIES[what.split(" ", 1)[0]] += 1
            log.warning("%s failed (try %d of %d), trying again in %.1f s: %s", what, attempt, tries, wait,
                        redact(str(e).splitlines()[0] if str(e) else type(e).__name__))
            time.sleep(wait)


def missing_bucket(loc: Location) -> str | None:
    """The bucket of an object-store location when it does not exist, else None."""
    if loc.scheme == "file":
        return None
    bucket = loc.path.split("/", 1)[0]
    return bucket if loc.fs.get_file_info(bucket).type == pafs.FileType.NotFound else None


def check_writable(loc: Location) -> None:
    """Raises OSError unless `loc` can be written: its bucket exists and an object can be put and deleted under it,
    so a typo in the bucket or read-only credentials fail before any document is parsed."""
    bucket = retrying(f"stat the bucket of {loc.uri()}", missing_bucket, loc)
    if bucket:
        raise FileNotFoundError(f"bucket {bucket!r} does not exist: create it, or fix the output URI")
    probe = loc.join(f".write-check-{uuid.uuid4().hex}")
    write_text(loc.fs, probe, "")
    delete_file(loc.fs, probe)


@dataclass(frozen=True)
class ListedFile:
    uri: str
    size: int
    mtime_ns: int


# A listing as the planner takes it: one row per file, sorted by URI.
LISTING_SCHEMA = pa.schema([("uri", pa.string()), ("size_bytes", pa.int64()), ("mtime_ns", pa.int64())])
LISTING_CHUNK = 1 << 16  # files turned into Arrow columns at a time


def _glob_matcher(patterns: list[str]):
    """One regex for all of `patterns`, lower-cased, as fnmatch matches each of them (one match per name, not one
    per pattern: an archive's listing is a million names)."""
    if not patterns:
        return lambda s: False
    return re.compile("|".join(f"(?:{fnmatch.translate(p.lower())})" for p in patterns)).match


def list_table(uri: str, storage: StorageConfig, include: list[str], exclude: list[str]) -> pa.Table:
    """Every file under `uri` (or `uri` itself) whose name matches an include glob and no exclude glob, as a table
    (LISTING_SCHEMA) sorted by URI: a million files are three Arrow columns, not a million Python objects.

    Globs match the path relative to `uri` and the bare file name, so `*.pdf` and `2026/*/*.pdf` both work.
    Raises FileNotFoundError when `uri` does not exist, so a typo is not mistaken for an empty archive."""
    loc = resolve(uri, storage)
    info = retrying(f"stat {uri}", loc.fs.get_file_info, loc.path)
    # GcsFileSystem reports a prefix whose listing failed (its retries spent) as NotFound: a listing that may raise
    # confirms it, so a throttled store is not taken for a typo.
    if info.type == pafs.FileType.NotFound and not retrying(
            f"list {uri}", loc.fs.get_file_info, pafs.FileSelector(loc.path, recursive=True, allow_not_found=True)):
        bucket = retrying(f"stat the bucket of {uri}", missing_bucket, loc)
        raise FileNotFoundError(f"input not found: {uri}" + (f" (there is no bucket {bucket!r})" if bucket else ""))
    if info.type == pafs.FileType.File:
        infos, base = [info], loc.path.rsplit("/", 1)[0]
    else:
        infos, base = retrying(f"list {uri}", loc.fs.get_file_info, pafs.FileSelector(loc.path, recursive=True)), loc.path
    included, excluded = _glob_matcher(include), _glob_matcher(exclude)

    def matches(rel: str, match) -> bool:
        lower = rel.lower()
        return bool(match(lower) or match(lower.rsplit("/", 1)[-1]))

    prefix = loc.uri("")
    chunks = []
    for start in range(0, len(infos), LISTING_CHUNK):
        uris, sizes, mtimes = [], [], []
        for f in infos[start : start + LISTING_CHUNK]:
            if f.type != pafs.FileType.File:
                continue
            rel = f.path[len(base) :].lstrip("/")
            if matches(rel, included) and not matches(rel, excluded):
                uris.append(prefix + f.path)
                sizes.append(f.size or 0)
                mtimes.append(f.mtime_ns if f.mtime_ns is not None else 0)
        chunks.append(pa.record_batch([pa.array(uris, pa.string()), pa.array(sizes, pa.int64()),
                                       pa.array(mtimes, pa.int64())], schema=LISTING_SCHEMA))
    del infos
    table = pa.Table.from_batches(chunks, LISTING_SCHEMA)
    return table.take(pc.sort_indices(table["uri"])).combine_chunks() if table.num_rows else table


def list_documents(uri: str, storage: StorageConfig, include: list[str], exclude: list[str]) -> list[ListedFile]:
    """list_table's files as objects, for a listing small enough to hold as them."""
    return listed_files(list_table(uri, storage, include, exclude))


def listed_files(table: pa.Table) -> list[ListedFile]:
    return [ListedFile(u, s, m) for u, s, m in zip(table["uri"].to_pylist(), table["size_bytes"].to_pylist(),
                                                    table["mtime_ns"].to_pylist())]


def listing_table(listed: list[ListedFile]) -> pa.Table:
    return pa.table([pa.array([f.uri for f in listed], pa.string()), pa.array([f.size for f in listed], pa.int64()),
                     pa.array([f.mtime_ns for f in listed], pa.int64())], schema=LISTING_SCHEMA)


def read_bytes(fs: pafs.FileSystem, uri: str) -> bytes:
    path = uri.split("://", 1)[1] if "://" in uri else uri

    def read():
        with fs.open_input_stream(path) as f:
            return f.read()

    return retrying(f"read {uri}", read)


def write_parquet_atomic(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Readers see the whole file or nothing: a local file is renamed into place; an S3/GCS object appears
    only when its upload completes."""
    parent = path.rsplit("/", 1)[0]
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        pq.write_table(table, tmp, filesystem=fs)
        fs.move(tmp, path)
        return

    def write():  # a whole upload again: a multipart or resumable upload cut short leaves no object behind
        fs.create_dir(parent, recursive=True)
        pq.write_table(table, path, filesystem=fs)

    retrying(f"write {path}", write)


def delete_file(fs: pafs.FileSystem, path: str) -> None:
    tried = []

    def delete():
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            if not tried:
                raise
            # an earlier try was cut off after the store deleted it (a reset answer): done
        finally:
            tried.append(1)

    retrying(f"delete {path}", delete)


def list_parquet(fs: pafs.FileSystem, prefix: str) -> list[str]:
    files = retrying(f"list {prefix}", fs.get_file_info, pafs.FileSelector(prefix, recursive=False,
                                                                           allow_not_found=True))
    return sorted(f.path for f in files if f.type == pafs.FileType.File and f.path.endswith(".parquet")
                  and not f.base_name.startswith("."))


def read_parquet(fs: pafs.FileSystem, path: str, **kwargs) -> pa.Table:
    """A Parquet file read whole first: pyarrow reports a read cut off inside its Parquet reader as ArrowInvalid,
    the error of a damaged file, which must not be retried; read here it is the OSError it is."""
    return pq.read_table(pa.BufferReader(read_bytes(fs, path)), **kwargs)


def write_text(fs: pafs.FileSystem, path: str, text: str) -> None:
    def write():
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as f:
            f.write(text.encode())

    retrying(f"write {path}", write)
