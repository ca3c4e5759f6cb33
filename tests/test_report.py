"""Benchmark reruns (jobs/benchmark_job.py, pipeline/report.py): the report from a real job run on CPU (a local Ray,
PyMuPDF on a generated corpus, the tiny checkpoint), the steady window and busy share on page rows whose times are
known, the comparison with a baseline, the headline file, the plot, and bad flags refused before Ray starts."""
import copy
import json
import math
import os
import re
import subprocess
import sys

import pytest

from conftest import RAY_PROBE, ROOT
from pipeline.config import ConfigError
from pipeline.report import (STEADY_WINDOW, build_report, compare, format_comparison, git_commit, gpu_key,
                             load_job_output, load_report, plot, require_matplotlib, write_headline)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _summary(**over) -> dict:
    s = {"run_id": "r1", "engine_actors": 1, "gpus": 1, "raster_actors": 2, "stream_started_unix": 1000.0,
         "wall_s": 20.0, "warmup_s": 10.0, "first_result_s": 10.0, "documents": 6, "pages": 24, "pages_ok": 24,
         "pages_per_s": 1.2, "engine_busy_fraction": 0.6, "raster_busy_fraction": 0.1, "output_tokens": 240,
         "prompt_tokens": 2400, "output_tokens_per_s": 12.0, "usd_per_gpu_hour": 2.69, "usd_per_million_pages": 622.7,
         "cost_basis": "gpu-hours", "ttft_s": {"p50": 0.1, "p90": 0.2, "p99": 0.3}}
    s.update(over)
    return s


# engine calls of 4 pages each, two at a time on one engine: (start, end) seconds after streaming started; each
# call's engine time is half its length (two share the engine), split over its pages
CALLS = [(2, 10), (2, 12), (10, 14), (12, 16), (14, 18), (16, 19)]


def _pages(calls=CALLS, t0=1000.0) -> list[dict]:
    rows = []
    for c, (s, e) in enumerate(calls):
        for i in range(4):
            rows.append({"run_id": "r1", "uri": f"doc{c}.pdf", "page_index": i, "status": "ok", "output_tokens": 10,
                         "raster_s": 0.01 * (i + 1), "engine_s": (e - s) / 2 / 4, "parse_s": (e - s) * (i + 1) / 4,
                         "parse_started_unix": t0 + s, "parse_ended_unix": t0 + e})
    return rows


def test_steady_window_rates_and_busy_share_from_known_page_times():
    rep = build_report(_summary(), _pages(), {"gpus": 1})
    w, m = rep["steady_window"], rep["metrics"]
    # from the warm-up mark (10 s) to the last call's start (16 s); calls ending at 12, 14 and 16 s are inside
    assert (w["start_s"], w["end_s"], w["seconds"], w["pages"]) == (10.0, 16.0, 6.0, 12)
    assert w["definition"] == STEADY_WINDOW
    assert m["pages_per_s_steady"] == pytest.approx(2.0) and m["output_tokens_per_s_steady"] == pytest.approx(20.0)
    # engine seconds in [10, 16]: 1 (2 of call 2's 10 s) + 2 + 2 + 1 (2 of call 5's 4 s) = 6 of 6
    assert m["gpu_busy_steady"] == pytest.approx(1.0)
    assert m["usd_per_million_pages"] == pytest.approx(2.69 / 3600 / 2.0 * 1e6)
    assert rep["phases"]["drain_s"] == pytest.approx(4.0) and rep["phases"]["warmup_s"] == 10.0
    assert rep["stages"]["engine"]["seconds"] == pytest.approx(sum((e - s) / 2 for s, e in CALLS))
    tl = rep["timeline"]
    assert sum(tl["pages_per_s"]) * tl["bin_s"] == pytest.approx(24)
    assert max(tl["gpu_busy"]) <= 1.0 + 1e-9
    lat = rep["latency"]["page_s"]
    assert lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"] and sum(lat["histogram"]["counts"]) == 24


def test_busy_share_is_capped_at_one_engine():
    """The call that returns first claims the engine time of both overlapping calls (pipeline.stages), so spreading
    it over its own span can count more than the engine had: the share says 1, not more."""
    from pipeline.report import _busy_in, busy_share

    rows = [dict(p, engine_s=p["engine_s"] * 2 if p["uri"] == "doc0.pdf" else 0.0) for p in _pages(CALLS[:2])]
    assert _busy_in(rows, 1002, 1010) / 8 == pytest.approx(1.0)  # call 1: all 8 s of engine time over its 8 s
    rows += [dict(p, uri="x.pdf", engine_s=1.0) for p in _pages([(4, 8)])]  # 4 s more over [4, 8]
    assert _busy_in(rows, 1004, 1008) / 4 == pytest.approx(2.0)
    assert busy_share(rows, 1004, 1008, engines=1) == 1.0 and busy_share(rows, 1004, 1008, engines=2) == 1.0
    assert busy_share(rows, 1002, 1004, engines=2) == pytest.approx(0.5)


def test_a_run_too_short_for_a_steady_window_says_so():
    rep = build_report(_summary(pages=8, wall_s=13.0), _pages(CALLS[:2]), {})
    m = rep["metrics"]
    assert rep["steady_window"]["seconds"] is None and rep["steady_window"]["pages"] == 0
    assert m["pages_per_s_steady"] is None and m["gpu_busy_steady"] is None and m["usd_per_million_pages"] is None
    assert m["pages_per_s"] == 1.2  # the overall figures still stand
    json.dumps(rep, allow_nan=False)  # strict JSON: nothing undefined written as NaN


def test_baseline_comparison_per_metric():
    old = {"metrics": {"pages_per_s_steady": 2.0, "gpu_busy_steady": 0.8, "warmup_s": 0.0, "wall_s": None,
                       "not_compared": 1.0}}
    new = {"metrics": {"pages_per_s_steady": 3.0, "gpu_busy_steady": 0.96, "warmup_s": 5.0, "wall_s": 10.0,
                       "usd_per_million_pages": 100.0}}
    rows = {r["metric"]: r for r in compare(old, new)}
    assert set(rows) == {"pages_per_s_steady", "gpu_busy_steady", "warmup_s", "wall_s"}  # only metrics both have
    assert rows["pages_per_s_steady"] == {"metric": "pages_per_s_steady", "old": 2.0, "new": 3.0, "ratio": 1.5}
    assert rows["gpu_busy_steady"]["ratio"] == pytest.approx(1.2)
    assert rows["warmup_s"]["ratio"] is None and rows["wall_s"]["ratio"] is None  # old 0, old missing: no ratio
    table = format_comparison(list(rows.values())).splitlines()
    assert table[0].split() == ["metric", "old", "new", "new/old"]
    assert table[1].split() == ["pages_per_s_steady", "2", "3", "1.5"]


def test_plot_writes_a_png_with_and_without_a_steady_window(tmp_path):
    from PIL import Image

    require_matplotlib()
    rep = build_report(_summary(), _pages(), {"gpus": 1, "gpu_name": "NVIDIA H100 80GB HBM3"})
    short = build_report(_summary(pages=8, wall_s=13.0), _pages(CALLS[:2]), {})
    for name, r, base in (("a.png", rep, short), ("b.png", short, None)):
        path = plot(r, tmp_path / "plots" / name, base)
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert Image.open(path).size == (1080, 720)


def test_matplotlib_missing_is_one_clear_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^the report's plots need matplotlib: pip install") as e:
        require_matplotlib()
    assert "\n" not in str(e.value)


def test_headline_keeps_one_row_per_setup(tmp_path):
    rep = build_report(_summary(), _pages(), {"gpus": 1, "gpu_key": "h100", "precision": "bfloat16",
                                              "gdn_state_dtype": "float32", "settings_vs_gpu_yaml": {}})
    path = write_headline(tmp_path, rep, "cmd")
    again = write_headline(tmp_path, rep, "cmd")  # a rerun of the same setup replaces its row
    bf16 = copy.deepcopy(rep)
    bf16["setup"]["gdn_state_dtype"] = "bfloat16"
    write_headline(tmp_path, bf16, "cmd --engine-option gdn_state_dtype=bfloat16")
    assert path == again == tmp_path / "h100_job_throughput.json"
    runs = json.loads(path.read_text())["runs"]
    assert [r["gdn_state_dtype"] for r in runs] == ["float32", "bfloat16"]
    for r in runs:
        for key in ("gpus", "pages", "pages_per_s_steady", "gpu_busy_steady", "warmup_s", "usd_per_million_pages",
                    "precision", "gdn_state_dtype", "settings"):
            assert key in r
        assert r["pages_per_s_steady"] == pytest.approx(2.0) and r["gpu_busy_steady"] == pytest.approx(1.0)


def test_headline_keeps_its_claim_and_indexes(tmp_path, capsys):
    """A rerun rewrites the headline file: the claim and figure a README quotes stay (and it says the figure is the
    old run's), the commit is the rerun's, and bench/results_index.py finds what, command and card."""
    from bench import results_index

    rep = build_report(_summary(), _pages(), {"gpus": 1, "gpu_key": "h100", "precision": "bfloat16",
                                              "gdn_state_dtype": "float32", "settings_vs_gpu_yaml": {}})
    path = write_headline(tmp_path, rep, "python jobs/benchmark_job.py --pages 24")
    assert "kept" not in capsys.readouterr().out
    path.write_text(json.dumps(dict(json.loads(path.read_text()), claim="2 pages/s", figure="2.0"), indent=2))
    write_headline(tmp_path, rep, "python jobs/benchmark_job.py --pages 24")
    assert "kept claim and figure of the file this run replaces" in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert list(data)[:4] == ["claim", "figure", "what", "commit"] and len(data["runs"]) == 1
    (entry,), problems = results_index.collect(tmp_path)
    assert not problems and entry.card == "H100" and entry.claims == (("2 pages/s", "2.0"),)
    assert entry.command == "python jobs/benchmark_job.py --pages 24"


def test_gpu_key_names_the_card():
    assert gpu_key(1, "NVIDIA H200") == "h200" and gpu_key(8, "NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_key(1, "NVIDIA A100-SXM4-80GB") == "a100" and gpu_key(0, None) == "cpu"


# ------------------------------------------------------------------------------------------------ the command

def _cli(*args, timeout=120, probe=False):
    cmd = [sys.executable, *(["-c", RAY_PROBE] if probe else []), str(ROOT / "jobs/benchmark_job.py"), *args]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def test_generated_corpus_defaults_by_device(tmp_path):
    from pipeline.job import local_gpus
    from pipeline.report import plan_benchmark

    cpu = plan_benchmark(None, {"model": {"device": "cpu"}}, str(tmp_path / "a"))
    gpu = plan_benchmark(None, {"model": {"device": "cuda"}}, str(tmp_path / "b"))  # a cluster's GPUs, unseen here
    mine = plan_benchmark(None, {"input": {"uris": ["samples"]}}, str(tmp_path / "c"))
    assert cpu.corpus == {"generated": {"pages": 24, "pages_per_doc": 8, "paragraphs": 1}}
    pages = 1000 * max(local_gpus(gpu.cfg), 1)
    assert gpu.corpus == {"generated": {"pages": pages, "pages_per_doc": 8, "paragraphs": 7}}
    assert mine.corpus == {"input": ["samples"]}
    assert cpu.cfg.input.uris == [str(tmp_path / "a" / "corpus")] and cpu.cfg.output == str(tmp_path / "a" / "output")
    assert not any(p.exists() for p in (tmp_path / "a", tmp_path / "b", tmp_path / "c"))  # nothing made yet


@pytest.mark.parametrize("args,message", [
    (["--bogus"], "No such option '--bogus'"),
    (["--pages", "0"], "--pages must be at least 1, got 0"),
    (["--input", "samples", "--pages", "4"], "--pages and --paragraphs shape the generated corpus"),
    (["--engine-option", "gdn_state_dtype"], "--engine-option 'gdn_state_dtype': give KEY=VALUE"),
    (["--baseline", "no/such/report"], "--baseline 'no/such/report': no report there"),
    (["--max-tokens", "x"], "Invalid value for '--max-tokens'"),
])
def test_bad_flags_fail_in_one_line_before_ray(tmp_path, args, message):
    proc = _cli("--out", str(tmp_path / "r"), *args, probe=True)
    err = proc.stderr.replace("\nray imported: False\n", "")
    assert proc.returncode == 1 and "ray imported: False" in proc.stderr, proc.stderr
    assert err.startswith("Error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()


@pytest.fixture(scope="module")
def cpu_benchmark(tiny_checkpoint, tmp_path_factory):
    """One real benchmark rerun on CPU through the command: 16 generated pages, 2 pages per engine call, compared
    with a baseline report and writing the headline file."""
    tmp = tmp_path_factory.mktemp("bench")
    base = build_report(_summary(), _pages(), {"gpus": 0, "engines": 1})
    (tmp / "old").mkdir()
    (tmp / "old" / "report.json").write_text(json.dumps(base))
    proc = _cli("--out", str(tmp / "r"), "--baseline", str(tmp / "old"), "--results", str(tmp / "results"),
                "--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--max-tokens", "8", "--batch-size", "2",
                "--num-cpus", "2", "--commit-every", "2", "--pages", "16", "--pages-per-doc", "2", timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, proc.stdout


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_report_from_a_real_cpu_run(cpu_benchmark):
    tmp, stdout = cpu_benchmark
    out = tmp / "r"
    rep = json.loads((out / "report.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in report.json"))
    assert rep == load_report(out)
    # what bench/results_index.py reads, written by the run itself
    assert rep["what"] and rep["command"].startswith("python ") and "--pages 16" in rep["command"]
    assert rep["device"] == "cpu" and rep["commit"] == git_commit()
    summary, pages = load_job_output(str(out / "output"))
    assert rep["run_id"] == summary["run_id"] and len(pages) == 16
    m, w, s = rep["metrics"], rep["steady_window"], rep["setup"]
    assert (m["pages"], m["pages_ok"], m["documents"]) == (16, 16, 8)
    assert s["corpus"] == {"generated": {"pages": 16, "pages_per_doc": 2, "paragraphs": 1}}
    assert (s["device"], s["gpus"], s["engines"], s["precision"], s["gdn_state_dtype"]) == (
        "cpu", 0, 1, "float32", "float32")
    assert s["settings_vs_gpu_yaml"]["parse.batch_size"] == 2 and "parse.concurrent_batches" not in s[
        "settings_vs_gpu_yaml"]
    # every page carries its engine call's span; the warm-up mark comes after the first call returned
    assert all(p["parse_started_unix"] <= p["parse_ended_unix"] for p in pages)
    mark = summary["stream_started_unix"] + summary["warmup_s"]
    assert min(p["parse_ended_unix"] for p in pages) <= mark < max(p["parse_ended_unix"] for p in pages)
    # 8 calls of 2 pages: a steady window with pages in it, its rate those pages over its length
    assert w["seconds"] > 0 and w["pages"] >= 2 and m["pages_per_s_steady"] == pytest.approx(w["pages"] / w["seconds"])
    assert 0 < m["gpu_busy_steady"] <= 1 and 0 < m["gpu_busy"] <= 1
    assert m["usd_per_million_pages"] == pytest.approx(summary["usd_per_gpu_hour"] / 3600 / m["pages_per_s_steady"]
                                                       * 1e6)
    assert math.isclose(rep["stages"]["engine"]["seconds"], sum(p["engine_s"] for p in pages))
    assert sum(rep["timeline"]["pages_per_s"]) * rep["timeline"]["bin_s"] == pytest.approx(16)
    assert rep["phases"]["startup_s"] > 0 and m["command_s"] > m["wall_s"]
    # the baseline's comparison, in the report and printed
    rows = {r["metric"]: r for r in rep["baseline"]["comparison"]}
    assert rows["pages_per_s_steady"]["old"] == pytest.approx(2.0)
    assert rows["pages_per_s_steady"]["ratio"] == pytest.approx(m["pages_per_s_steady"] / 2.0)
    assert re.search(r"^pages_per_s_steady\s+2\s+\S+\s+\S+$", stdout, re.M), stdout
    # the plot and the headline row
    assert (out / "report.png").read_bytes()[:8] == PNG_SIGNATURE
    head = json.loads((tmp / "results" / "cpu_job_throughput.json").read_text())
    [row] = head["runs"]
    assert row["pages"] == 16 and row["pages_per_s_steady"] == m["pages_per_s_steady"]
    assert row["gpus"] == 0 and row["precision"] == "float32" and "--pages 16" in row["command"]


@pytest.mark.ray
@pytest.mark.slow
def test_a_second_run_into_the_same_out_needs_overwrite(cpu_benchmark):
    tmp, _ = cpu_benchmark
    proc = _cli("--out", str(tmp / "r"), "--pages", "4", probe=True)
    assert proc.returncode == 1 and "holds an earlier benchmark" in proc.stderr and "ray imported: False" in proc.stderr
