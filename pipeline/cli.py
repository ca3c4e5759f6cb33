"""The parse job's command-line flags, shared by jobs/parse_corpus.py and jobs/benchmark_job.py so that a benchmark
takes exactly the job's flags (each a config key, pipeline.config.FLAG_KEYS) and turns them into the same overrides."""
from __future__ import annotations

import click
import yaml

from pipeline.config import FLAG_KEYS, ConfigError

JOB_OPTIONS = [
    click.option("--input", multiple=True, help="input URI or path; repeatable"),
    click.option("--output", help="output URI or path"),
    click.option("--include", multiple=True, help="glob of files to take (default: pdf, png, jpg, jpeg, tif, tiff)"),
    click.option("--exclude", multiple=True, help="glob of files to skip"),
    click.option("--limit", type=int, help="process at most N new documents"),
    click.option("--s3-endpoint", help="S3-compatible endpoint URL"),
    click.option("--s3-region"),
    click.option("--gcs-endpoint", help="GCS-compatible endpoint URL (an emulator; default: STORAGE_EMULATOR_HOST, else "
                 "Google's)"),
    click.option("--backend", type=click.Choice(["native", "transformers"])),
    click.option("--checkpoint", help="checkpoint folder or object-storage prefix"),
    click.option("--drafter", help="DFlash drafter folder for speculative decoding (native backend), or none"),
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda"])),
    click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"])),
    click.option("--max-tokens", type=int, help="output tokens per page"),
    click.option("--prompt"),
    click.option("--num-beams", type=int, help="beam search of this width (1: greedy)"),
    click.option("--loop-stop-tokens", type=int, help="end a page's answer that loops over this many tokens (0: off)"),
    click.option("--loop-drop-tokens", type=int,
                  help="leave out the repeats of a loop over this many tokens and read on (0: off)"),
    click.option("--loop-ban-next", is_flag=True, default=None,
                  help="with --loop-drop-tokens: forbid the token that would go on with a loop"),
    click.option("--block-lines", type=int,
                  help="read pages in blocks of this many text lines (0: off; default: the checkpoint's)"),
    click.option("--block-tolerance", type=float,
                  help="with --block-lines: 0 reads blocks only; > 0 reads whole pages too and takes the blocks' read "
                       "where the lengths differ by more than this share (default: the checkpoint's)"),
    click.option("--block-scales", "--block-scale", "block_scales", type=float, multiple=True,
                  help="with blocks: read each block at this size too (repeatable, the first the main read; 1 = as "
                       "drawn) and keep the reads' character vote (default: the checkpoint's)"),
    click.option("--max-pages", type=int, help="pages per document"),
    click.option("--target-longest-px", type=int, help="longest page side when rendering"),
    click.option("--glyph-px", type=float,
                  help="draw pages with a text layer so their body text is this many pixels high (0: off; default: the "
                       "checkpoint's reading size)"),
    click.option("--glyph-from-ink/--no-glyph-from-ink", default=None,
                  help="with a glyph size: draw pages without a text layer (scans) at it too, their text size measured "
                       "from the ink (default: the checkpoint's)"),
    click.option("--page-timeout", type=float,
                  help="seconds to open a document and to draw each page; a page past it is one error row "
                       "(default 60)"),
    click.option("--doc-timeout", type=float, help="old name of --page-timeout: the limit is per page now"),
    click.option("--batch-size", type=int, help="pages per engine batch"),
    click.option("--num-engines", type=int, help="engine actors (default: one per GPU)"),
    click.option("--retry-failed", is_flag=True, default=None, help="process only documents that failed before"),
    click.option("--reparse", is_flag=True, default=None,
                  help="parse again documents that another model parsed into this output"),
    click.option("--max-attempts", type=int, help="retry a failing document on reruns up to this many attempts"),
    click.option("--ray-address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)"),
    click.option("--num-cpus", type=float, help="CPUs of the local Ray"),
    click.option("--commit-every", type=int, help="documents per committed output part"),
    click.option("--usd-per-gpu-hour", type=float),
    click.option("--usd-per-cpu-hour", type=float, help="the price of a CPU run: per CPU its actors hold"),
    click.option("--allow-errors", is_flag=True, default=None,
                 help="exit 0 when documents failed (default: 3 when some failed, 4 when all did)"),
]


def job_options(skip: tuple[str, ...] = ()):
    """Decorates a click command with the job's flags, less those named in `skip` (e.g. "--output")."""
    def decorate(fn):
        for option in reversed(JOB_OPTIONS):  # click lists a command's options in the reverse of their decoration
            if not _names(option) & set(skip):
                fn = option(fn)
        return fn
    return decorate


def _names(option) -> set[str]:
    """The flags a click.option decorator declares (read by decorating a throwaway function)."""
    def probe():
        pass
    return set(option(probe).__click_params__[0].opts)


def overrides(**flags) -> dict:
    """CLI flags -> nested config overrides (only the flags given: an option left out is None, its flags too)."""
    out: dict = {}
    for name, value in flags.items():
        if value is None or value == ():
            continue
        node = out
        *parents, leaf = FLAG_KEYS[name]
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = list(value) if isinstance(value, tuple) else value
    return out


def engine_options(pairs: tuple[str, ...]) -> dict:
    """--engine-option KEY=VALUE pairs -> model.options, each value read as YAML (true, 256, bfloat16)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--engine-option {pair!r}: give KEY=VALUE, e.g. gdn_state_dtype=bfloat16")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


class OneLineErrors(click.Command):
    """A usage error (an unknown flag, a bad value) in one line that names it, not click's usage block."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            raise click.ClickException(f"{e.format_message()} (--help lists the flags)") from None
