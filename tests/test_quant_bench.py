"""bench/quantized_decode_bench.py end to end on CPU at toy sizes (the H200 run uses the same code at the 4B shape)."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import json

from conftest import load_bench


def test_quantized_decode_bench_smoke(tmp_path, monkeypatch):
    monkeypatch.delenv("OCRIA_FORCE_TRITON", raising=False)
    bench = load_bench("quantized_decode_bench")
    out = tmp_path / "qdb.json"
    assert bench.main(["--device", "cpu", "--smoke", "--batch-sizes", "1,2", "--prefill-repeats", "1",
                       "--quality-prompts", "3", "--check-tokens", "4", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert [(r["precision"], r["batch"]) for r in rows] == [(p, b) for p in ("bf16", "fp8", "nvfp4") for b in (1, 2)]
    for r in rows:
        assert r["decode_step_ms"] > 0 and r["roofline_ms"] > 0 and r["decode_steps"] >= 3
    wb = {r["precision"]: r["weight_bytes"] for r in rows}
    assert wb["nvfp4"] < wb["fp8"] < wb["bf16"]  # the roofline counts each format's stored bytes
    assert [p["precision"] for p in res["prefill"]] == ["bf16", "fp8", "nvfp4"]
    assert all(p["tokens_per_s"] > 0 for p in res["prefill"])
    q = {(x["precision"], x["against"]): x for x in res["quality"]}
    assert set(q) == {(p, a) for p in ("fp8", "nvfp4") for a in ("dequantized twin", "bf16")} | \
        {(f"{p} weight-only", "dequantized twin") for p in ("fp8", "nvfp4")}
    assert 0 < q["fp8", "bf16"]["logit_rel_err"] < q["nvfp4", "bf16"]["logit_rel_err"] < 0.5
    for p in ("fp8", "nvfp4"):  # the twin holds the same quantized weights: what is left is not the weights' noise
        assert q[p, "dequantized twin"]["logit_rel_err"] < q[p, "bf16"]["logit_rel_err"]
        # weight-only on CPU runs the twin's own products in fp32 (the references): only summation order differs,
        # where the FP8 activations of the W8A8 prefill add their own error
        wo = q[f"{p} weight-only", "dequantized twin"]
        assert wo["logit_rel_err"] < 1e-3 and wo["top1_agreement"] == 1.0, wo
    assert q["fp8 weight-only", "dequantized twin"]["logit_rel_err"] < q["fp8", "dequantized twin"]["logit_rel_err"]
    assert res["meta"]["copy_bandwidth_GBps"] > 0
    gemv = res["gemv"]
    assert {(g["shape"], g["M"]) for g in gemv} == {(s, m) for s in ("tiny_a", "tiny_b") for m in (1, 8, 32, 64)}
    for g in gemv:
        timed = {c["precision"] for c in g["cases"] if c.get("us", 0) > 0 and c["rel_err"] < 1e-2}
        assert timed == {"bf16", "fp8", "nvfp4"}, g["cases"]
        wb = g["weight_bytes"]
        assert wb["nvfp4"] < wb["fp8"] < wb["bf16"]


def test_gemv_bench_decode_check_on_cpu():
    """bench/quant_gemv_bench.decode_check, which stops a GPU run whose bit-level decodes are wrong, runs its checks
    here on the interpreter's decodes: every NVFP4 code and every non-NaN FP8 code exact."""
    import torch

    check = load_bench("quant_gemv_bench").decode_check(torch.device("cpu"))
    assert check == dict(asm_decode=False, dequant_exact=True, dequant_mismatches=0, gemv_rel_err=0.0,
                         fp8_asm_mismatches=0)
