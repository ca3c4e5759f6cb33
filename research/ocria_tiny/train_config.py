"""ocria-tiny's training config: YAML with `--set key=value` overrides, the curriculum's stages and the page
settings each stage draws with (research.ocria_tiny.synthetic.SynthConfig)."""
from __future__ import annotations

from pathlib import Path

import yaml


def load_config(path: Path, overrides: list[str]) -> dict:
    cfg = yaml.safe_load(path.read_text())
    for item in overrides:
        key, _, value = item.partition("=")
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        if leaf not in node:
            raise KeyError(f"--set {key}: no such config key")
        parsed = yaml.safe_load(value)
        if isinstance(node[leaf], float) and isinstance(parsed, str):
            parsed = float(parsed)  # YAML 1.1 reads "1e-3" (no dot) as a string
        node[leaf] = parsed
    check_curriculum(cfg["data"].get("curriculum") or [])
    return cfg


PAGE_SETTINGS = {"font_px", "max_chars", "crop", "strict_chars", "canvas_px", "made_up_words", "path_lists",
                 "two_columns", "glyph_px"}


def stage_mixes(stage: dict) -> list[dict]:
    """A stage's mix pages: one {share, page settings...} or a list of them."""
    mix = stage.get("mix") or []
    return [mix] if isinstance(mix, dict) else list(mix)


def check_curriculum(stages: list[dict]) -> None:
    """A stage's keys are page settings (settings_config), until_page and mix (page settings and a share, or a list
    of them): a misspelt key would otherwise be ignored and the run would train on the pages it meant to change."""
    for i, stage in enumerate(stages):
        mixes = stage_mixes(stage)
        named = [(f"stage {i}", set(stage), PAGE_SETTINGS | {"until_page", "mix"})]
        named += [(f"stage {i}'s mix" + (f" {k}" if len(mixes) > 1 else ""), set(m), PAGE_SETTINGS | {"share"})
                  for k, m in enumerate(mixes)]
        for where, keys, known in named:
            if keys - known:
                raise ValueError(f"data.curriculum {where}: unknown key(s) {sorted(keys - known)}; "
                                 f"known: {sorted(known)}")
        if not {"until_page", "font_px", "max_chars"} <= set(stage):
            raise ValueError(f"data.curriculum stage {i}: needs until_page, font_px and max_chars")
        if any(not {"share", "font_px", "max_chars"} <= set(m) for m in mixes):
            raise ValueError(f"data.curriculum stage {i}'s mix: needs share, font_px and max_chars")
        if sum(m["share"] for m in mixes) > 1:
            raise ValueError(f"data.curriculum stage {i}'s mix: the shares add up to more than 1")


def mixed_in(page_index: int, share: float) -> bool:
    """Whether training page `page_index` is among a fixed pseudo-random `share` of the page indices (a multiplicative
    hash), so data-loader workers and resumed runs agree on a stage's mix pages; the pages of a smaller share are
    among those of a larger one."""
    return (page_index * 2654435761) % 2**32 < share * 2**32


def synth_config(cfg: dict, page_index: int | None = None, mix: bool = False):
    """Page settings of the final (evaluation) distribution, or of training page `page_index` under the curriculum.
    mix=True (the training stream): a stage's `mix: {share, font_px, max_chars, ...}` replaces the stage's settings for
    that share of its pages, e.g. line pages kept in the stream so the line CTC loss goes on teaching glyphs while
    the decoder learns paragraphs; a list of mixes takes their shares in turn. Held-out and check pages (mix=False)
    follow the stage's own settings."""
    d = curriculum_stage(cfg, page_index) if page_index is not None else cfg["data"]
    if mix and page_index is not None:
        edge = 0.0
        for m in stage_mixes(d):
            edge += m["share"]
            if mixed_in(page_index, edge):
                d = m
                break
    return settings_config(cfg, d)


def settings_config(cfg: dict, d: dict):
    """SynthConfig of one set of page settings {font_px, max_chars[, crop, strict_chars, canvas_px, made_up_words,
    path_lists, two_columns, glyph_px]}."""
    from research.ocria_tiny.synthetic import SynthConfig

    # canvas_px: lay the page out (and render it) on a larger canvas, so big glyphs fit long lines without wrapping;
    # with crop the image is the text alone, which the processor's max_pixels still bounds
    canvas = int(d.get("canvas_px") or cfg["image"]["target_longest_px"])
    return SynthConfig(
        target_longest_px=canvas,
        max_pixels=max(cfg["image"]["max_pixels"], canvas * canvas),
        font_px=tuple(d["font_px"]),
        max_chars=tuple(d["max_chars"]),
        crop=bool(d.get("crop", False)),
        strict_chars=bool(d.get("strict_chars", False)),
        made_up_words=float(d.get("made_up_words", 0.0)),
        path_lists=float(d.get("path_lists", 0.0)),
        two_columns=float(d.get("two_columns", SynthConfig.two_columns)),
        glyph_px=tuple(d["glyph_px"]) if d.get("glyph_px") else None,
        # the text lines cost ~2 ms a page: only when the loss that reads them is on (evaluation configs may predate it)
        text_lines=cfg["train"].get("text_line_ctc_weight", 0.0) > 0,
    )


def curriculum_stage(cfg: dict, page_index: int) -> dict:
    """data.curriculum: stages [{until_page, font_px, max_chars[, crop, strict_chars, canvas_px, made_up_words,
    path_lists, two_columns, mix]}, ...] in order; pages past the last stage use data.font_px / data.max_chars. Keyed
    on the page index, so data-loader workers and resumed runs agree."""
    for stage in cfg["data"].get("curriculum") or []:
        if page_index < stage["until_page"]:
            return stage
    return cfg["data"]


