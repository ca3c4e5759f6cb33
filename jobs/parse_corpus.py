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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeline.preflight import require_job_packages  # noqa: E402 (standard library only)

require_job_packages("jobs/parse_corpus.py")  # a cluster's Python without the job's packages: one line, status 2

import click  # noqa: E402

from pipeline import terminate  # noqa: E402
from pipeline.cli import job_options  # noqa: E402
from pipeline.cli import overrides  # noqa: E402
from pipeline.config import ConfigError, load_config  # noqa: E402
from pipeline.job import prepare, run  # noqa: E402
from pipeline.local_ray import RayStartError  # noqa: E402
from pipeline.outcomes import EXIT_INTERRUPTED, EXIT_NOT_STARTED, EXIT_OK, exit_status  # noqa: E402
from pipeline.redact import install_log_redaction, redact, redacting_excepthook  # noqa: E402


@click.command(context_settings={"show_default": True})
@click.option("--config", "config_path", type=click.Path(), help="YAML config (see configs/)")
@job_options()
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
        cfg = load_config(config_path, overrides(**flags))
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
