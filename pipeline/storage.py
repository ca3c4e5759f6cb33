"""Object storage through pyarrow filesystems: one code path for s3:// (and S3-compatible endpoints), gs:// (and
GCS-compatible endpoints: emulators) and local.

Credentials are never passed here: pyarrow's S3/GCS clients take them from the environment or the standard chains.
"""
from __future__ import annotations

import fnmatch
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

if TYPE_CHECKING:  # annotations only, as in pipeline.checkpoint
    from pipeline.config import StorageConfig


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


def make_filesystem(scheme: str, storage: StorageConfig) -> pafs.FileSystem:
    if scheme == "s3":
        return pafs.S3FileSystem(region=storage.s3_region, anonymous=storage.anonymous,
                                 **endpoint_kwargs(storage.s3_endpoint))
    if scheme == "gs":
        # STORAGE_EMULATOR_HOST is the variable Google's client libraries read for an emulator, which they reach
        # without credentials; pyarrow's client does not read it, so it is passed on here.
        emulator = None if storage.gcs_endpoint else os.environ.get("STORAGE_EMULATOR_HOST")
        return pafs.GcsFileSystem(anonymous=storage.anonymous or bool(emulator),
                                  **endpoint_kwargs(storage.gcs_endpoint or emulator))
    return pafs.LocalFileSystem()


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


def explain(uri: str, e: OSError) -> str:
    """A storage error in words that say what to fix: a denied request names where the credentials came from."""
    scheme = uri.split("://", 1)[0] if "://" in uri else "file"
    if isinstance(e, PermissionError) or any(m in str(e) for m in DENIED_MARKERS):
        source = CREDENTIAL_SOURCES.get(scheme, "this process's user")
        return (f"access denied to {uri}: give the credentials the job found ({source}) the right to use it, or "
                f"set storage.anonymous for a public bucket")
    return str(e)


def missing_bucket(loc: Location) -> str | None:
    """The bucket of an object-store location when it does not exist, else None."""
    if loc.scheme == "file":
        return None
    bucket = loc.path.split("/", 1)[0]
    return bucket if loc.fs.get_file_info(bucket).type == pafs.FileType.NotFound else None


def check_writable(loc: Location) -> None:
    """Raises OSError unless `loc` can be written: its bucket exists and an object can be put and deleted under it,
    so a typo in the bucket or read-only credentials fail before any document is parsed."""
    bucket = missing_bucket(loc)
    if bucket:
        raise FileNotFoundError(f"bucket {bucket!r} does not exist: create it, or fix the output URI")
    probe = loc.join(f".write-check-{uuid.uuid4().hex}")
    write_text(loc.fs, probe, "")
    loc.fs.delete_file(probe)


@dataclass(frozen=True)
class ListedFile:
    uri: str
    size: int
    mtime_ns: int


def list_documents(uri: str, storage: StorageConfig, include: list[str], exclude: list[str]) -> list[ListedFile]:
    """Every file under `uri` (or `uri` itself) whose name matches an include glob and no exclude glob.

    Globs match the path relative to `uri` and the bare file name, so `*.pdf` and `2026/*/*.pdf` both work.
    Raises FileNotFoundError when `uri` does not exist, so a typo is not mistaken for an empty archive."""
    loc = resolve(uri, storage)
    info = loc.fs.get_file_info(loc.path)
    if info.type == pafs.FileType.NotFound:
        bucket = missing_bucket(loc)
        raise FileNotFoundError(f"input not found: {uri}" + (f" (there is no bucket {bucket!r})" if bucket else ""))
    if info.type == pafs.FileType.File:
        infos, base = [info], loc.path.rsplit("/", 1)[0]
    else:
        infos, base = loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=True)), loc.path

    def matches(rel: str, patterns: list[str]) -> bool:
        name = rel.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatch(rel.lower(), p.lower()) or fnmatch.fnmatch(name.lower(), p.lower()) for p in patterns)

    out = []
    for f in infos:
        if f.type != pafs.FileType.File:
            continue
        rel = f.path[len(base) :].lstrip("/")
        if matches(rel, include) and not matches(rel, exclude):
            mtime_ns = f.mtime_ns if f.mtime_ns is not None else 0
            out.append(ListedFile(loc.uri(f.path), f.size or 0, mtime_ns))
    return sorted(out, key=lambda f: f.uri)


def read_bytes(fs: pafs.FileSystem, uri: str) -> bytes:
    path = uri.split("://", 1)[1] if "://" in uri else uri
    with fs.open_input_stream(path) as f:
        return f.read()


def write_parquet_atomic(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Readers see the whole file or nothing: a local file is renamed into place; an S3/GCS object appears
    only when its upload completes."""
    parent = path.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        pq.write_table(table, tmp, filesystem=fs)
        fs.move(tmp, path)
    else:
        pq.write_table(table, path, filesystem=fs)


def delete_file(fs: pafs.FileSystem, path: str) -> None:
    fs.delete_file(path)


def list_parquet(fs: pafs.FileSystem, prefix: str) -> list[str]:
    info = fs.get_file_info(prefix)
    if info.type == pafs.FileType.NotFound:
        return []
    files = fs.get_file_info(pafs.FileSelector(prefix, recursive=False))
    return sorted(f.path for f in files if f.type == pafs.FileType.File and f.path.endswith(".parquet")
                  and not f.base_name.startswith("."))


def write_text(fs: pafs.FileSystem, path: str, text: str) -> None:
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(text.encode())
