"""bench/engine_bench.py end to end on CPU with tiny shapes: both engines run, JSON and PNG are written."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import json

import pytest

from bench import engine_bench as benchmark


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


@pytest.mark.slow  # the GEMV and the model's other kernels run in the Triton interpreter
def test_benchmark_variants_cpu(tmp_path, monkeypatch):
    """--variants: each native variant runs the scenarios, its options are recorded, and its greedy outputs are
    compared with the first's. Triton is forced (run by the interpreter), so the default variant's decode
    projections go through kernels/small_m_linear's GEMV and native_cublas's through torch's matmul: two paths."""
    import kernels.small_m_linear as sml

    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    gemv_calls = []
    gemv = sml.small_m_linear_triton
    monkeypatch.setattr(sml, "small_m_linear_triton", lambda *a, **k: (gemv_calls.append(1), gemv(*a, **k))[1])
    benchmark.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--batch-sizes", "2", "--text-gen", "3",
                    "--scenarios", "text", "--skip-transformers", "--variants", "native,native_cublas"])
    data = json.loads((tmp_path / "benchmark.json").read_text())
    assert [r["engine"] for r in data["results"]] == ["native", "native_cublas"]
    check = data["meta"]["output_checks"]["native vs native_cublas"]
    assert check["all_equal"] and check["max_abs_logit_diff"] < 1e-4
    assert data["meta"]["variant_options"] == {"native": {}, "native_cublas": {"tuning": {"gemv": False}}}
    assert gemv_calls, "the default variant never ran the GEMV: the check compared a path with itself"


def test_benchmark_fp8_variant_runs_quantized_weights(tmp_path):
    """native_fp8: the same random weights quantized by the built-in FP8 recipe, run by the quantized projections;
    its output check against native is written (a run cut short keeps the checks it reached)."""
    from engine.models.quant_linear import QuantWeight

    built = []
    engine_of = benchmark.variant_engine
    benchmark.variant_engine = lambda *a, **k: built.append(engine_of(*a, **k)) or built[-1]
    try:
        benchmark.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--batch-sizes", "2", "--text-gen",
                        "3", "--scenarios", "text", "--skip-transformers", "--variants", "native,native_fp8",
                        "--check-tokens", "4"])
    finally:
        benchmark.variant_engine = engine_of
    data = json.loads((tmp_path / "benchmark.json").read_text())
    assert [r["engine"] for r in data["results"]] == ["native", "native_fp8"]
    assert "native vs native_fp8" in data["meta"]["output_checks"]
    quantized = [m for m in built[-1].model.modules() if isinstance(m, QuantWeight)]
    assert quantized and all(q.kind == "fp8" for q in quantized)
    with pytest.raises(ValueError, match="variant_engine"):
        benchmark.variant_args("native_fp8")


def test_beam_search_bench_4b_part_tiny_cpu(tmp_path):
    """bench/beam_search_bench.py run --skip-tiny (its H200 4B part) at tiny shapes: greedy at every sequence count a
    beam run has, beam requests (bench/engine_bench.py's requests with num_beams) beside them, their extra step time
    and the cache copy timed alone."""
    from conftest import load_bench

    bench = load_bench("beam_search_bench")
    bench.main(["run", "--skip-tiny", "--device", "cpu", "--tiny-shapes", "--out", str(tmp_path), "--beams", "3",
                "--batches-4b", "2", "--page-image-tokens", "16", "--page-gen", "6"])
    rows = json.loads((tmp_path / "beam_search.json").read_text())["rows"]
    assert [(r["num_beams"], r["batch"]) for r in rows] == [(1, 2), (1, 6), (3, 2)]
    beam = rows[-1]
    assert beam["output_tokens"] == 6 and beam["requests_per_s"] > 0
    assert beam["decode_steps"] > 0
    assert beam["step_ms_over_greedy_same_rows"] == beam["decode_step_ms"] - rows[1]["decode_step_ms"]  # greedy, 6 rows
    assert all("step_ms_over_greedy_same_rows" not in r for r in rows[:2])
    assert beam["copy_caches_ms_mid_answer"] > 0
