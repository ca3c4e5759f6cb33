"""The stats table: throughput, busy shares, cost per million pages, errors by kind, flat (metric, value) rows."""
import math

import pytest

from pipeline.output import DocMeta, document_row
from pipeline.schema import PAGE_SCHEMA, empty_row
from pipeline.stats import RunStats, format_table


def page(uri, i, n, tokens, engine_s=0.5, raster_s=0.02):
    return empty_row(PAGE_SCHEMA, uri=uri, sha256="s", page_index=i, page_count=n, total_pages=n, status="ok",
                     prompt_tokens=100, output_tokens=tokens, raster_s=raster_s, parse_s=1.0, ttft_s=0.1,
                     engine_s=engine_s)


def test_summary_numbers():
    stats = RunStats("r", engine_actors=2, gpus=2, usd_per_gpu_hour=3.6, raster_actors=4)
    for uri, n in (("a", 3), ("b", 1)):
        rows = [page(uri, i, n, tokens=50) for i in range(n)]
        stats.add_document(document_row("r", rows, DocMeta(1, 1, 1), 500), rows)
    err = [empty_row(PAGE_SCHEMA, uri="c", page_index=-1, page_count=0, total_pages=0, status="error",
                     error_kind="encrypted", error="needs a password")]
    stats.add_document(document_row("r", err, DocMeta(1, 1, 1), 500), err)
    stats.wall_s, stats.first_result_s = 11.0, 1.0
    s = stats.summary()
    assert (s["documents"], s["documents_ok"], s["documents_error"], s["pages"]) == (3, 2, 1, 4)
    assert math.isclose(s["pages_per_s"], 4 / 11) and math.isclose(s["pages_per_s_per_engine"], 2 / 11)
    assert math.isclose(s["output_tokens_per_s"], 200 / 11)
    assert math.isclose(s["engine_busy_fraction"], 4 * 0.5 / 11 / 2)  # 2 engine-seconds over 2 engines x 11 s
    assert math.isclose(s["raster_busy_fraction"], 4 * 0.02 / 11 / 4)
    usd = 11 / 3600 * 2 * 3.6
    assert math.isclose(s["usd"], usd) and math.isclose(s["usd_per_million_pages"], usd / 4 * 1e6)
    assert s["errors_by_kind"] == {"encrypted": 1}
    table = stats.table()
    metrics = dict(zip(table.column("metric").to_pylist(), table.column("value").to_pylist()))
    assert metrics["pages"] == 4 and metrics["errors_by_kind.encrypted"] == 1 and "ttft_s.p50" in metrics
    text = format_table(s)
    assert "pages/s" in text and "encrypted 1" in text and "per million pages" in text


def test_a_cpu_run_is_priced_by_its_cpus_not_at_the_gpu_rate():
    stats = RunStats("r", engine_actors=1, gpus=0, usd_per_gpu_hour=2.69, cpus=2.5, usd_per_cpu_hour=0.04)
    rows = [page("a", 0, 1, tokens=10)]
    stats.add_document(document_row("r", rows, DocMeta(1, 1, 1), 500), rows)
    stats.wall_s = 3600.0
    s = stats.summary()
    assert math.isclose(s["usd"], 2.5 * 0.04) and s["cost_basis"] == "cpu-hours (CPU run)"
    assert math.isclose(s["usd_per_million_pages"], 0.1 * 1e6)
    [cost] = [line for line in format_table(s).splitlines() if line.startswith("cost")]
    assert "2.5 CPU x $0.04/h" in cost and "2.69" not in cost and "GPU" not in cost


def test_a_run_with_nothing_to_do_prints_and_writes_no_nan():
    """No documents came back (nothing was left to parse): the table shows '-' where there is nothing to measure, the
    JSON is valid JSON (NaN is not), and the stats table has only finite numbers."""
    import json

    s = RunStats("r", engine_actors=1, gpus=0, usd_per_gpu_hour=2.69, usd_per_cpu_hour=0.045)
    text, summary = format_table(s.summary()), s.summary()
    assert "nan" not in text.lower() and "no pages to price" in text
    assert "p50        -" in text and summary["usd"] == 0 and summary["usd_per_million_pages"] is None
    json.loads(s.to_json(), parse_constant=lambda c: pytest.fail(f"{c} in the run's JSON"))
    assert all(math.isfinite(v) for v in s.table().column("value").to_pylist())


def test_steady_rate_counts_only_pages_after_the_warm_up():
    stats = RunStats("r", engine_actors=2, gpus=2, usd_per_gpu_hour=1.0)
    for uri in "abcd":
        rows = [page(uri, i, 16, tokens=10) for i in range(16)]
        stats.add_document(document_row("r", rows, DocMeta(1, 1, 1), 500), rows)
    stats.wall_s, stats.first_result_s = 30.0, 8.0
    assert math.isclose(stats.summary()["steady_pages_per_s"], 64 / 22)  # no warm-up mark: after the first result
    stats.warmup_s, stats.warmup_pages = 10.0, 32
    s = stats.summary()
    assert math.isclose(s["steady_pages_per_s"], 32 / 20) and s["warmup_pages"] == 32
    assert "after warm-up (10.0 s)" in format_table(s)
    stats.warmup_pages = 64  # every page came back during the warm-up: no steady phase to report a rate for
    s = stats.summary()
    assert not s["steady_phase"] and s["steady_pages_per_s"] == 0
    [rate_line] = [line for line in format_table(s).splitlines() if line.startswith("pages/s")]
    assert rate_line.endswith("after warm-up: run too short for a steady phase (warm-up 10.0 of 30.0 s)")


def test_the_table_names_what_runs_at_lower_precision():
    """Weights as the checkpoint stores them (the shipped FP8 and NVFP4-mix checkpoints, and bf16 / fp32 ones named
    by the dtype the engine runs them in), the KV cache and the GDN state: lossy choices change a run's output."""
    from conftest import ROOT
    from pipeline.checkpoint import weight_precision

    models = ROOT / "models"
    assert weight_precision(str(models / "ocria-tiny"), "float32") == "float32"
    assert weight_precision(str(models / "ocria-tiny-fp8"), "bfloat16") == "fp8"
    assert weight_precision(str(models / "ocria-tiny-nvfp4"), "bfloat16") == "fp8+nvfp4"
    stats = RunStats("r", engine_actors=1, gpus=1, usd_per_gpu_hour=2.69)
    stats.extra["precision"] = dict(weights="fp8", kv_cache="fp8", gdn_state="bfloat16")
    [line] = [ln for ln in format_table(stats.summary()).splitlines() if ln.startswith("precision")]
    assert line.split()[1:] == ["weights", "fp8", "KV", "cache", "fp8", "GDN", "state", "bfloat16"]
    assert not [ln for ln in format_table(RunStats("r", engine_actors=1, gpus=1, usd_per_gpu_hour=2.69).summary()).splitlines() if ln.startswith("precision")]


def test_engine_restarts_in_the_table_and_unknown_printed_as_a_dash():
    stats = RunStats("r", engine_actors=2, gpus=0, usd_per_gpu_hour=0.0)
    stats.engine_restarts = 3
    table = stats.table()
    assert dict(zip(table.column("metric").to_pylist(), table.column("value").to_pylist()))["engine_restarts"] == 3
    assert any(line.startswith("engine restarts") and line.split()[2] == "3"
               for line in format_table(stats.summary()).splitlines())
    stats.engine_restarts = None  # Ray's actor table could not be read: unknown, not 0
    assert "engine_restarts" not in stats.table().column("metric").to_pylist()
    assert any(line.startswith("engine restarts") and line.split()[2] == "-"
               for line in format_table(stats.summary()).splitlines())
