"""How the job draws and reads pages for a checkpoint: the page size and pixel cap (from its processor, its context
and ocria_info.json, unless configured) and whether pages are read in blocks, at which sizes."""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.blocks import BLOCK_SCALES_RULE, BlockReading, valid_block_scales
from pipeline.checkpoint import CheckpointError, checkpoint_info
from pipeline.rasterize import RasterOptions

if TYPE_CHECKING:  # annotations only: the research evaluation reads page sizes here on machines without pydantic
    from pipeline.config import JobConfig


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
                         block_scales=reading.block_scales if reading.lines else (1.0,))


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
