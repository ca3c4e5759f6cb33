"""Quantization recipes (pydantic, from YAML or a built-in name), calibration images and the run itself
(quantize_checkpoint_job) behind jobs/quantize.py.

A recipe maps the decoder's projections to bf16 / fp8 / nvfp4; the vision tower, embeddings, lm_head, norms, GDN
conv1d and the GDN gates' inputs are never quantized. Rules are regexes searched in the HF module name
(e.g. "model.language_model.layers.3.mlp.down_proj"); the first that matches decides, else `default`.

    default: nvfp4
    rules:
      - {pattern: 'in_proj_[ab]$', precision: bf16}
      - {pattern: 'mlp\\.down_proj$', precision: fp8}
    fp8_activations: dynamic     # or none (weight-only FP8)
    awq: true                    # activation-aware scales searched on the calibration pages
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.quantize import BUILTIN_RECIPES

SAMPLES = Path(__file__).resolve().parents[1] / "samples"  # the calibration pages when none are given

Precision = Literal["bf16", "fp8", "nvfp4"]


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pattern: str
    precision: Precision


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "custom"
    default: Precision = "fp8"
    rules: list[Rule] = Field(default_factory=list)
    fp8_activations: Literal["dynamic", "none"] = "dynamic"
    awq: bool = True
    calib_max_blocks: int = Field(48, ge=1, description="block images the calibration reads at most")

    def rule_pairs(self) -> list[tuple[str, str]]:
        return [(r.pattern, r.precision) for r in self.rules]


BUILTIN = {name: Recipe(name=name, default=default, rules=[Rule(pattern=p, precision=q) for p, q in rules],
                        fp8_activations="dynamic" if act_fp8 else "none")
           for name, (rules, default, act_fp8) in BUILTIN_RECIPES.items()}


class RecipeError(ValueError):
    pass


def load_recipe(spec: str) -> Recipe:
    """A built-in recipe's name (fp8, nvfp4) or a YAML file's path."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    path = Path(spec)
    if not path.is_file():
        raise RecipeError(f"--recipe {spec!r}: neither a built-in recipe ({', '.join(BUILTIN)}) nor a YAML file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise RecipeError(f"recipe {path}: expected a mapping of recipe keys, got {type(data).__name__}")
        data.setdefault("name", path.stem)
        return Recipe(**data)
    except (ValidationError, yaml.YAMLError) as e:
        raise RecipeError(f"recipe {path}: {e}") from e


def calibration_images(files: list[Path], checkpoint: str, max_blocks: int, max_lines: int = 8) -> list[np.ndarray]:
    """The block images the model reads on these documents (PDFs or page images), drawn as the job draws them for
    this checkpoint (its glyph size and page size, from ocria_info.json / its processor) and cut into blocks of at
    most `max_lines` text lines, evenly chosen up to `max_blocks`."""
    from pipeline.blocks import page_blocks
    from pipeline.checkpoint import checkpoint_info
    from pipeline.page_reading import image_processor
    from pipeline.rasterize import FILETYPES, DocumentError, RasterOptions, RenderedPage, rasterize

    info = checkpoint_info(checkpoint)
    proc = image_processor(checkpoint)
    if proc is None:
        raise RecipeError(f"{checkpoint}: no preprocessor_config.json (calibration reads page images)")
    page_px = int(info.get("page_px", 1288))
    opts = RasterOptions(target_longest_px=page_px, max_pixels=min(proc.max_pixels, page_px * page_px * 4),
                         glyph_px=float(info.get("glyph_px", 0.0)), glyph_from_ink=bool(info.get("glyph_from_ink")),
                         extract_text=False, max_pages=4)
    token_px = proc.patch_size * proc.merge_size
    blocks: list[np.ndarray] = []
    for f in files:
        if f.suffix.lower() not in FILETYPES:
            continue
        try:
            pages = [page for _, _, page in rasterize(f.read_bytes(), str(f), opts)]
        except DocumentError:  # a file that does not open calibrates nothing; the others still do
            continue
        for page in pages:
            if isinstance(page, RenderedPage) and not page.blank:
                blocks += page_blocks(page.image, max_lines, token_px)[1]
    if not blocks:
        raise RecipeError(f"no text blocks found in the calibration files {[str(f) for f in files][:5]}")
    keep = np.linspace(0, len(blocks) - 1, min(max_blocks, len(blocks))).round().astype(int)
    return [blocks[i] for i in sorted(set(keep.tolist()))]


def calibration_files(calib: Path | None, default: Path) -> list[Path]:
    """Every page file under `calib` (a folder or one file), else under `default` (the repository's samples/)."""
    from pipeline.rasterize import FILETYPES

    root = calib or default
    if root.is_file():
        return [root]
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in FILETYPES
                   and "broken" not in p.parts)
    if not files:
        raise RecipeError(f"--calib {root}: no PDF or page images found")
    return files


def quantize_checkpoint_job(checkpoint: Path, recipe_spec: str, out: Path, calib: Path | None = None,
                            no_awq: bool = False) -> int:
    """Quantize `checkpoint` into `out` by a recipe (built-in name or YAML), calibrated on `calib` (default
    samples/) unless plain round-to-nearest; writes out/quantization_report.json. Returns the exit status: 0, or 2
    with one line on stderr for a mistake the user can fix (bad recipe, quantized input, non-empty out)."""
    from engine.checkpoint import CheckpointError, inspect_checkpoint
    from engine.quantize import collect_calibration, plan_precisions, quantize_checkpoint

    try:
        recipe = load_recipe(recipe_spec)
        cfg = inspect_checkpoint(checkpoint).config
        if cfg.quant is not None:
            raise CheckpointError(f"{checkpoint} is quantized already: start from the bf16 checkpoint")
        plan = plan_precisions(cfg, recipe.rule_pairs(), recipe.default)
        files = calibration_files(calib, SAMPLES) if recipe.awq and not no_awq else []
    except (RecipeError, CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if out.exists() and any(out.iterdir()):
        print(f"error: --out {out} exists and is not empty", file=sys.stderr)
        return 2
    t0 = time.time()
    cal = None
    if files:
        try:
            images = calibration_images(files, str(checkpoint), recipe.calib_max_blocks)
        except RecipeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        cal = collect_calibration(checkpoint, images)
        print(f"calibration: {len(images)} block images from {len(files)} files, {cal.tokens} tokens, "
              f"{time.time() - t0:.0f} s", file=sys.stderr)
    note = (f"jobs/quantize.py --recipe {recipe_spec}: {recipe.model_dump_json()}"
            + (f"; calibrated on {len(files)} files" if cal else "; round-to-nearest"))
    report = quantize_checkpoint(checkpoint, out, plan, act_fp8=recipe.fp8_activations == "dynamic",
                                 calibration=cal, recipe_note=note)
    report.update(recipe=recipe.model_dump(), seconds=round(time.time() - t0, 1),
                  calibration_files=[str(f) for f in files], model_id=inspect_checkpoint(out).model_id)
    (out / "quantization_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("modules", "bytes", "model_id", "seconds")}, indent=1))
    return 0
