"""Benchmark rerun of the whole parse job: the real job (jobs/parse_corpus.py's code path) on a corpus, then a report.

    python jobs/benchmark_job.py --config configs/gpu.yaml --checkpoint CKPT --out report/ [--baseline report_old/]
        [--results bench/results] [--input URI ...] [--pages N] [--engine-option gdn_state_dtype=bfloat16] [job flags]

Without --input it generates a page-shaped corpus under <out>/corpus (1,000 report-like pages per GPU found; on a
machine without one, 24 short pages). The job writes its tables to <out>/output; the report goes beside them:
<out>/report.json (pages/s over time, engine busy share, per-stage time, page latency, tokens/s, $ per million pages,
steady and overall) and <out>/report.png. --baseline compares with an earlier report (per metric: old, new, ratio);
--results rewrites this setup's row of <results>/<gpu>_job_throughput.json. Every job flag works as in
jobs/parse_corpus.py except --output. The steady window is defined in pipeline/report.py (STEADY_WINDOW).
"""
from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeline.cli import OneLineErrors, engine_options, job_options, overrides  # noqa: E402
from pipeline.config import ConfigError  # noqa: E402
from pipeline.local_ray import RayStartError  # noqa: E402
from pipeline.report import plan_benchmark, run_benchmark  # noqa: E402


@click.command(cls=OneLineErrors, context_settings={"show_default": True})
@click.option("--config", "config_path", type=click.Path(), help="YAML config (see configs/)")
@click.option("--out", required=True, help="folder for the report (report.json, report.png), output/ and corpus/")
@click.option("--baseline", help="an earlier report (its folder or report.json) to compare with")
@click.option("--results", help="folder of the headline file <gpu>_job_throughput.json (e.g. bench/results)")
@click.option("--pages", type=int, help="pages of the generated corpus [default: 1000 per GPU, 24 on CPU]")
@click.option("--pages-per-doc", type=int, default=8, help="pages per generated PDF")
@click.option("--paragraphs", type=int, help="paragraphs of ~70 words per generated page [default: 7, 1 on CPU]")
@click.option("--engine-option", "engine_option", multiple=True, metavar="KEY=VALUE",
              help="a model.options entry for this run (repeatable), e.g. gdn_state_dtype=bfloat16")
@click.option("--overwrite", is_flag=True, help="replace the report, output and corpus already in --out")
@job_options(skip=("--output",))
@click.option("-v", "--verbose", is_flag=True)
def main(config_path, out, baseline, results, pages, pages_per_doc, paragraphs, engine_option, overwrite, verbose,
         **flags):
    """Run the parse job on a corpus and report its throughput, busy share, latency and cost."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # unwind so the local Ray is shut down
    try:
        over = overrides(**flags)
        if engine_option:
            over.setdefault("model", {})["options"] = engine_options(engine_option)
        bench = plan_benchmark(config_path, over, out, baseline=baseline, results=results, pages=pages,
                               pages_per_doc=pages_per_doc, paragraphs=paragraphs, overwrite=overwrite,
                               command=" ".join(["python", *sys.argv]))
        report = run_benchmark(bench, echo=click.echo)
    except (ConfigError, RayStartError) as e:
        raise click.ClickException(str(e)) from None
    sys.exit(0 if report["metrics"]["pages_ok"] else 1)


if __name__ == "__main__":
    main()
