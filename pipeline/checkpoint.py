"""Model checkpoints for the job: copy from object storage into a local cache, check them before Ray starts,
and read the page resolution they expect."""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from pipeline.blocks import BLOCK_SCALES_RULE, BlockReading, valid_block_scales
from pipeline.rasterize import RasterOptions
from pipeline.storage import explain, resolve

if TYPE_CHECKING:  # annotations only: research.ocria_tiny.eval_ocr reads checkpoints here on machines without pydantic (the H200)
    from pipeline.config import JobConfig, StorageConfig


class CheckpointError(Exception):
    pass


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
        files = [f for f in loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=True, allow_not_found=True))
                 if f.type == pafs.FileType.File]
        if not files:
            raise CheckpointError(f"no checkpoint files under {uri} (set model.checkpoint or --checkpoint)")
        tmp = target.with_name(f".{target.name}-{uuid.uuid4().hex[:8]}")
        for f in files:
            dest = tmp / f.path[len(loc.path):].lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            pafs.copy_files(f.path, str(dest), source_filesystem=loc.fs, destination_filesystem=pafs.LocalFileSystem())
    except OSError as e:
        raise CheckpointError(f"cannot copy the checkpoint from {uri}: {explain(uri, e)}") from e
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


def checkpoint_info(path: str) -> dict:
    """What the checkpoint's builder wrote about it in ocria_info.json ({} without one)."""
    info = Path(path) / "ocria_info.json"
    return json.loads(info.read_text()) if info.is_file() else {}


def checkpoint_note(path: str) -> str:
    """What the checkpoint's builder says about it (e.g. that its weights are random), from ocria_info.json."""
    return checkpoint_info(path).get("note", "")


def image_processor(path: str):
    """The checkpoint's engine.processor.ImageProcessor (the engine's reading of the file, not a second parser);
    None without a preprocessor_config.json."""
    from engine.processor import ImageProcessor

    cfg_path = Path(path) / "preprocessor_config.json"
    return ImageProcessor.from_file(cfg_path) if cfg_path.is_file() else None


# A processor that lets at most this many pixels per side through states the model's own page size (ocria-tiny was
# trained at 1,536 px); a larger budget only bounds a generic VLM (Qwen's default, 12.8 M pixels, is 3,584 px).
MODEL_PAGE_PX_MAX = 2048
GENERIC_PAGE_PX = 1288  # olmOCR's page size for page VLMs, and the 4B's


PROMPT_TOKENS = 64  # the chat template and prompt around a page's image tokens (~20 for ocria-tiny), with room


def context_pixels(checkpoint_dir: str, proc, max_tokens: int, longest_px: int) -> int | None:
    """The most pixels a page may have for its image tokens (`proc`, the checkpoint's image processor), the prompt
    and `max_tokens` of answer to fit the engine's default context (None without a config.json). The processor rounds
    each side to whole tokens, which can add up to a token row and column: the longest side's tokens are kept free
    for that."""
    from engine.config import default_max_model_len, load_config

    path = Path(checkpoint_dir)
    if not (path / "config.json").is_file():
        return None
    token_px = proc.patch_size * proc.merge_size
    context = default_max_model_len(load_config(path).text)
    tokens = context - max_tokens - PROMPT_TOKENS - (longest_px // token_px + 1)
    if tokens < 64:
        raise CheckpointError(f"model.max_tokens={max_tokens} leaves no room for a page image in the model's context "
                              f"of {context} tokens: lower model.max_tokens")
    return tokens * token_px * token_px


def glyph_max_pixels(checkpoint_dir: str, proc, max_tokens: int, target: int) -> int:
    """The pixel cap of pages drawn at a glyph size: as many as the processor lets through and the context holds
    beside max_tokens of answer. Such a page may pass the target, up to the processor's longest side."""
    fits = context_pixels(checkpoint_dir, proc, max_tokens, max(math.isqrt(proc.max_pixels), target))
    return min(c for c in (proc.max_pixels, fits) if c)


def raster_options(cfg: JobConfig, checkpoint_dir: str) -> RasterOptions:
    """The page size follows the model: the page size its ocria_info.json names (page_px), else a longest side of
    sqrt(max_pixels) of its processor, the size ocria-tiny was trained at, or 1288 px when the processor allows more
    than MODEL_PAGE_PX_MAX; and no more pixels than leave room for model.max_tokens in the context (a square page at
    1,536 px with 2,048 answer tokens would not fit 4,096); unless configured. With a glyph size (raster.glyph_px, else
    the checkpoint's), pages with a text layer are drawn at it, up to the processor's pixels that fit the context, and
    with raster.glyph_from_ink (else the checkpoint's) pages without one too, their size measured from the ink. Pages
    read in blocks at several sizes (`block_reading`) are drawn at each of them too."""
    proc = image_processor(checkpoint_dir)
    info = checkpoint_info(checkpoint_dir)
    model_px = math.isqrt(proc.max_pixels) if proc else None
    target = cfg.raster.target_longest_px or info.get("page_px") or (
        model_px if model_px and model_px <= MODEL_PAGE_PX_MAX else GENERIC_PAGE_PX)
    glyph_px = cfg.raster.glyph_px if cfg.raster.glyph_px is not None else float(info.get("glyph_px", 0.0))
    from_ink = cfg.raster.glyph_from_ink if cfg.raster.glyph_from_ink is not None else bool(info.get("glyph_from_ink"))
    max_pixels = cfg.raster.max_pixels
    if not max_pixels and glyph_px and proc:
        max_pixels = glyph_max_pixels(checkpoint_dir, proc, cfg.model.max_tokens, target)
    elif not max_pixels:
        fits = context_pixels(checkpoint_dir, proc, cfg.model.max_tokens, target) if proc else None
        max_pixels = min(c for c in (target * target, proc and proc.max_pixels, fits) if c)
    reading = block_reading(cfg, checkpoint_dir)
    return RasterOptions(target_longest_px=target, max_pixels=max_pixels, max_pages=cfg.raster.max_pages_per_doc,
                         extract_text=cfg.raster.extract_text, glyph_px=glyph_px, glyph_from_ink=from_ink,
                         view_zooms=reading.scales[1:] if reading.lines else ())


def block_reading(cfg: JobConfig, checkpoint_dir: str) -> BlockReading:
    """Whether and how pages are read in blocks (model.block_lines, block_tolerance, block_scales), else as the
    checkpoint's ocria_info.json says; the block images' sides are whole vision tokens of its processor."""
    info = checkpoint_info(checkpoint_dir)
    lines = cfg.model.block_lines if cfg.model.block_lines is not None else int(info.get("block_lines", 0))
    tolerance = cfg.model.block_tolerance
    if tolerance is None:
        tolerance = float(info.get("block_tolerance", BlockReading.tolerance))
    scales = cfg.model.block_scales if cfg.model.block_scales is not None else info.get("block_scales", [1.0])
    if not valid_block_scales(scales):
        raise CheckpointError(f"{checkpoint_dir}/ocria_info.json: block_scales must be a list of {BLOCK_SCALES_RULE}; "
                              f"got {scales!r}: mend it or set model.block_scales")
    proc = image_processor(checkpoint_dir) if lines else None
    if lines and proc is None:
        raise CheckpointError(f"model.block_lines={lines} needs the checkpoint's preprocessor_config.json (the size of "
                              f"a vision token), which {checkpoint_dir} lacks: set model.block_lines 0")
    return BlockReading(lines, tolerance, proc.patch_size * proc.merge_size if proc else 1,
                        tuple(float(x) for x in scales))
