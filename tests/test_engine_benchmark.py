"""jobs/benchmark.py end to end on CPU with tiny shapes: both engines run, JSON and PNG are written."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import json

from jobs import benchmark


def test_benchmark_tiny_cpu(tmp_path):
    benchmark.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--batch-sizes", "1,3", "--text-gen", "6",
                    "--page-gen", "5", "--hf-max-new", "4"])
    data = json.loads((tmp_path / "benchmark.json").read_text())
    assert data["meta"]["copy_bandwidth_GBps"] > 0
    res = data["results"]
    assert {(r["engine"], r["scenario"], r["batch"]) for r in res} == {
        (e, s, b) for e in ("native", "transformers") for s in ("text", "page") for b in (1, 3)}
    for r in res:
        assert r["total_tok_s"] > 0 and r["decode_step_ms"] > 0
        if r["engine"] == "native":
            assert r["output_tokens"] == (6 if r["scenario"] == "text" else 5)
            assert r["roofline_ms"] > 0 and r["speedup_step_vs_transformers"] > 0
            assert r["prompt_tokens"] > (16 if r["scenario"] == "page" else 39)
    assert (tmp_path / "benchmark.png").stat().st_size > 1000


def test_benchmark_variants_cpu(tmp_path):
    """--variants: each native variant runs the scenarios, its options are recorded, and its greedy outputs are
    compared with the first's (on CPU the decode GEMV is off, so both run the torch ops and agree exactly)."""
    benchmark.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--batch-sizes", "2", "--text-gen", "5",
                    "--scenarios", "text", "--skip-transformers", "--variants", "native,native_cublas"])
    data = json.loads((tmp_path / "benchmark.json").read_text())
    assert [r["engine"] for r in data["results"]] == ["native", "native_cublas"]
    check = data["meta"]["output_checks"]["native vs native_cublas"]
    assert check["all_equal"] and check["max_abs_logit_diff"] < 1e-4
    assert data["meta"]["variant_options"] == {"native": {}, "native_cublas": {"decode_gemv": False}}


def test_beam_search_bench_4b_part_tiny_cpu(tmp_path):
    """bench/beam_search_bench.py run --skip-tiny (its H200 4B part) at tiny shapes: greedy at every sequence count a
    beam run has, beam requests (jobs/benchmark.py's requests with num_beams) beside them, their extra step time
    and the cache copy timed alone."""
    from conftest import load_bench

    bench = load_bench("beam_search_bench")
    bench.main(["run", "--skip-tiny", "--device", "cpu", "--tiny-shapes", "--out", str(tmp_path), "--beams", "3",
                "--batches-4b", "2", "--page-image-tokens", "16", "--page-gen", "6"])
    rows = json.loads((tmp_path / "beam_search.json").read_text())["rows"]
    assert [(r["num_beams"], r["batch"]) for r in rows] == [(1, 2), (1, 6), (3, 2)]
    beam = rows[-1]
    assert beam["output_tokens"] == 6 and beam["requests_per_s"] > 0
    assert beam["decode_steps"] > 0 and beam["step_ms_over_greedy_same_rows"] is not None
    assert beam["copy_caches_ms_mid_answer"] > 0
