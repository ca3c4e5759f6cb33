"""Parse a document archive into Parquet.

    python jobs/parse_corpus.py --input s3://bucket/prefix --output s3://bucket/out [--config configs/x.yaml] [flags]
    ray job submit --working-dir . -- python jobs/parse_corpus.py --input ... --output ...

Run directly it starts a local Ray; inside `ray job submit` (RAY_ADDRESS set) it joins that cluster.
Flags override the YAML config; every problem with the config, checkpoint, input or output is reported
before Ray starts.

Exit status (docs/outcomes.md): 0 every document parsed is ok, or nothing to do (--allow-errors: also when some
failed); 1 an unexpected error; 2 the run could not start; 3 some documents failed; 4 every document failed;
130 Ctrl-C; 143 SIGTERM. After 1, 130 and 143 the output is consistent and the same command resumes.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeline import terminate  # noqa: E402
from pipeline.config import FLAG_KEYS, ConfigError, load_config  # noqa: E402
from pipeline.job import prepare, run  # noqa: E402
from pipeline.local_ray import RayStartError  # noqa: E402
from pipeline.outcomes import EXIT_INTERRUPTED, EXIT_NOT_STARTED, EXIT_OK, exit_status  # noqa: E402
from pipeline.redact import install_log_redaction, redact, redacting_excepthook  # noqa: E402


def _overrides(**flags) -> dict:
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


@click.command(context_settings={"show_default": True})
@click.option("--config", "config_path", type=click.Path(), help="YAML config (see configs/)")
@click.option("--input", multiple=True, help="input URI or path; repeatable")
@click.option("--output", help="output URI or path")
@click.option("--include", multiple=True, help="glob of files to take (default: pdf, png, jpg, jpeg, tif, tiff)")
@click.option("--exclude", multiple=True, help="glob of files to skip")
@click.option("--limit", type=int, help="process at most N new documents")
@click.option("--s3-endpoint", help="S3-compatible endpoint URL")
@click.option("--s3-region")
@click.option("--gcs-endpoint", help="GCS-compatible endpoint URL (an emulator; default: STORAGE_EMULATOR_HOST, else "
              "Google's)")
@click.option("--backend", type=click.Choice(["native", "transformers"]))
@click.option("--checkpoint", help="checkpoint folder or object-storage prefix")
@click.option("--drafter", help="DFlash drafter folder for speculative decoding (native backend), or none")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]))
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]))
@click.option("--max-tokens", type=int, help="output tokens per page")
@click.option("--prompt")
@click.option("--num-beams", type=int, help="beam search of this width (1: greedy)")
@click.option("--loop-stop-tokens", type=int, help="end a page's answer that loops over this many tokens (0: off)")
@click.option("--loop-drop-tokens", type=int,
              help="leave out the repeats of a loop over this many tokens and read on (0: off)")
@click.option("--loop-ban-next", is_flag=True, default=None,
              help="with --loop-drop-tokens: forbid the token that would go on with a loop")
@click.option("--block-lines", type=int,
              help="read pages in blocks of this many text lines (0: off; default: the checkpoint's)")
@click.option("--block-tolerance", type=float,
              help="with --block-lines: 0 reads blocks only; > 0 reads whole pages too and takes the blocks' read "
                   "where the lengths differ by more than this share (default: the checkpoint's)")
@click.option("--block-scales", "--block-scale", "block_scales", type=float, multiple=True,
              help="with blocks: read each block at this size too (repeatable, the first the main read; 1 = as "
                   "drawn) and keep the reads' character vote (default: the checkpoint's)")
@click.option("--max-pages", type=int, help="pages per document")
@click.option("--target-longest-px", type=int, help="longest page side when rendering")
@click.option("--glyph-px", type=float,
              help="draw pages with a text layer so their body text is this many pixels high (0: off; default: the "
                   "checkpoint's reading size)")
@click.option("--glyph-from-ink/--no-glyph-from-ink", default=None,
              help="with a glyph size: draw pages without a text layer (scans) at it too, their text size measured "
                   "from the ink (default: the checkpoint's)")
@click.option("--page-timeout", type=float,
              help="seconds to open a document and to draw each page; a page past it is one error row (default 60)")
@click.option("--doc-timeout", type=float, help="old name of --page-timeout: the limit is per page now")
@click.option("--batch-size", type=int, help="pages per engine batch")
@click.option("--num-engines", type=int, help="engine actors (default: one per GPU)")
@click.option("--retry-failed", is_flag=True, default=None, help="process only documents that failed before")
@click.option("--reparse", is_flag=True, default=None, help="parse again documents that another model parsed into this output")
@click.option("--max-attempts", type=int, help="retry a failing document on reruns up to this many attempts")
@click.option("--ray-address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
@click.option("--num-cpus", type=float, help="CPUs of the local Ray")
@click.option("--commit-every", type=int, help="documents per committed output part")
@click.option("--usd-per-gpu-hour", type=float)
@click.option("--usd-per-cpu-hour", type=float, help="the price of a CPU run: per CPU its actors hold")
@click.option("--allow-errors", is_flag=True, default=None,
              help="exit 0 when documents failed (default: 3 when some failed, 4 when all did)")
@click.option("-v", "--verbose", is_flag=True)
def main(config_path, verbose, **flags):
    """Parse every PDF and image under the inputs into Parquet (pages, documents, stats).

    Exit status: 0 all parsed documents ok (or nothing to do), 1 an unexpected error, 2 the run could not start, 3
    some documents failed, 4 all failed, 130 Ctrl-C, 143 SIGTERM (docs/outcomes.md)."""
    # What this process prints (its lines, log records, a traceback) passes through pipeline.redact first.
    install_log_redaction()
    sys.excepthook = redacting_excepthook
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    terminate.install()  # SIGTERM (a scheduler, `kill`) unwinds like Ctrl-C: finished documents committed, Ray stopped
    try:
        cfg = load_config(config_path, _overrides(**flags))
        terminate.set_grace(cfg.run.term_grace_s)
        prepared = prepare(cfg)
        summary = run(prepared, echo=lambda line: click.echo(redact(line)))
    except (ConfigError, RayStartError) as e:  # a cluster's size is checked once joined: the same one-line answer
        click.echo(f"Error: {redact(str(e))}", err=True)
        sys.exit(EXIT_NOT_STARTED)
    except terminate.Terminated:
        terminate.exit_after_sigterm()
    except KeyboardInterrupt:
        click.echo("stopped by Ctrl-C: the documents finished before it are committed; run the same command again "
                   "to parse the rest", err=True)
        sys.exit(EXIT_INTERRUPTED)
    click.echo(redact(f"output: {cfg.output}  (pages/, documents/, stats/, runs/{summary['run_id']}.json)"))
    planned = len(prepared.plan.todo)
    status = exit_status(planned, summary["documents"], summary["documents_error"], cfg.run.allow_errors)
    if status != EXIT_OK:
        failed = summary["documents_error"] + max(0, planned - summary["documents"])
        click.echo(f"{failed} of {planned} document(s) failed: exit status {status} (docs/outcomes.md; "
                   f"--allow-errors exits 0)", err=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
