"""Parse a document archive into Parquet.

    python jobs/parse_corpus.py --input s3://bucket/prefix --output s3://bucket/out [--config configs/x.yaml] [flags]
    ray job submit --working-dir . -- python jobs/parse_corpus.py --input ... --output ...

Run directly it starts a local Ray; inside `ray job submit` (RAY_ADDRESS set) it joins that cluster.
Flags override the YAML config; every problem with the config, checkpoint, input or output is reported
before Ray starts.
"""
from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeline.cli import job_options  # noqa: E402
from pipeline.cli import overrides as _overrides  # noqa: E402
from pipeline.config import ConfigError, load_config  # noqa: E402
from pipeline.job import prepare, run  # noqa: E402
from pipeline.local_ray import RayStartError  # noqa: E402


@click.command(context_settings={"show_default": True})
@click.option("--config", "config_path", type=click.Path(), help="YAML config (see configs/)")
@job_options()
@click.option("-v", "--verbose", is_flag=True)
def main(config_path, verbose, **flags):
    """Parse every PDF and image under the inputs into Parquet (pages, documents, stats)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # A terminated job (SIGTERM: a scheduler, `kill`) unwinds like Ctrl-C, so its local Ray is shut down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        cfg = load_config(config_path, _overrides(**flags))
        prepared = prepare(cfg)
        summary = run(prepared)
    except (ConfigError, RayStartError) as e:  # a cluster's size is checked once joined: the same one-line answer
        raise click.ClickException(str(e)) from None
    click.echo(f"output: {cfg.output}  (pages/, documents/, stats/, runs/{summary['run_id']}.json)")
    sys.exit(1 if summary["documents"] == 0 and prepared.plan.todo else 0)


if __name__ == "__main__":
    main()
