"""Model checkpoints for the job: copy from object storage into a local cache, check them before Ray starts, and
read what their builder says about them (ocria_info.json)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from pipeline.redact import redact
from pipeline.storage import explain, resolve, retrying

if TYPE_CHECKING:  # annotations only: the research evaluation reads checkpoints here on machines without pydantic
    from pipeline.config import StorageConfig


class CheckpointError(Exception):
    """A checkpoint that cannot be used, worded for the person running the job (credentials redacted)."""

    def __init__(self, message: str):
        super().__init__(redact(message))


def localize(uri: str, storage: StorageConfig, cache_dir: str) -> str:
    """A local folder holding the checkpoint. Remote prefixes are copied once into `cache_dir` (atomically:
    a half-copied folder is never used)."""
    loc = resolve(uri, storage)
    if loc.scheme == "file":
        if not Path(loc.path).is_dir():
            raise CheckpointError(f"checkpoint folder not found: {loc.path} (set model.checkpoint or --checkpoint)")
        return loc.path
    target = Path(cache_dir).expanduser() / hashlib.sha1(uri.encode()).hexdigest()[:16]
    if (target / ".complete").exists():
        return str(target)
    try:
        listing = retrying(f"list {uri}", loc.fs.get_file_info,
                           pafs.FileSelector(loc.path, recursive=True, allow_not_found=True))
        files = [f for f in listing if f.type == pafs.FileType.File]
        if not files:
            raise CheckpointError(f"no checkpoint files under {uri} (set model.checkpoint or --checkpoint)")
        tmp = target.with_name(f".{target.name}-{uuid.uuid4().hex[:8]}")
        for f in files:
            dest = tmp / f.path[len(loc.path):].lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            retrying(f"copy {loc.uri(f.path)}", pafs.copy_files, f.path, str(dest), source_filesystem=loc.fs,
                     destination_filesystem=pafs.LocalFileSystem())
    except OSError as e:
        raise CheckpointError(f"cannot copy the checkpoint from {uri}: {explain(uri, e, storage)}") from e
    (tmp / ".complete").write_text(uri)
    try:
        os.rename(tmp, target)
    except OSError:  # another process finished the same copy first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def validate_drafter(drafter: str | None, checkpoint_dir: str, backend: str) -> str | None:
    """The drafter folder (absolute) that the engines load, None when speculation is off; CheckpointError when the
    folder is missing or not a DFlash drafter made for this checkpoint (the engine's message names the field)."""
    if drafter in (None, "", "none"):
        return None
    if backend != "native":
        raise CheckpointError(f"model.drafter={drafter!r} needs model.backend native (or set --drafter none)")
    if "://" in drafter:
        raise CheckpointError(f"model.drafter={drafter!r}: a drafter is a local folder present on every node, not an "
                              f"object-storage URI: copy it there (or set --drafter none)")
    path = Path(drafter).expanduser().resolve()
    try:
        from engine.config import load_config
        from engine.models.dflash import load_dflash_config

        load_dflash_config(path, load_config(checkpoint_dir).text)
    except Exception as e:  # noqa: BLE001  (the engine's message names the file and field)
        raise CheckpointError(f"drafter {path} is not usable with {checkpoint_dir}: {e} (set --drafter none to "
                              f"decode without speculation)") from e
    return str(path)


def validate(path: str) -> str:
    """Check config and weight headers without loading tensors; CheckpointError says what to fix. Returns the
    model id the engine will write on each page (name + hash of config, headers and a sample of the weights)."""
    try:
        from engine.checkpoint import inspect_checkpoint
    except ImportError as e:
        raise CheckpointError(f"the engine cannot be imported to check the checkpoint: {e}") from e
    try:
        return inspect_checkpoint(path).model_id
    except Exception as e:  # the engine's own message names the file or tensor
        raise CheckpointError(f"checkpoint {path} is not usable: {e}") from e


def weight_precision(path: str, model_dtype: str) -> str:
    """The decoder weights' formats as the engine will run them: the quantization_config's ("fp8", "nvfp4",
    "fp8+nvfp4"), else the model dtype it loads the weights in."""
    from engine.quant_config import parse_quant_config

    cfg = json.loads((Path(path) / "config.json").read_text())
    qc = cfg.get("quantization_config") or cfg.get("text_config", {}).get("quantization_config")
    return parse_quant_config(qc).label if qc else model_dtype


def checkpoint_info(path: str) -> dict:
    """What the checkpoint's builder wrote about it in ocria_info.json ({} without one)."""
    info = Path(path) / "ocria_info.json"
    return json.loads(info.read_text()) if info.is_file() else {}


def checkpoint_note(path: str) -> str:
    """What the checkpoint's builder says about it (e.g. that its weights are random), from ocria_info.json."""
    return checkpoint_info(path).get("note", "")
