"""The GPU microbenchmark script runs end to end on CPU (--dry-run: tiny shapes through the references)."""
import json

from conftest import load_bench


def test_bench_dry_run_writes_json(tmp_path, monkeypatch):
    monkeypatch.delenv("OCRIA_FORCE_TRITON", raising=False)
    bench = load_bench("kernels_bench")
    out = tmp_path / "kernels.json"
    bench.main(["--dry-run", "--batch-sizes", "1", "3", "--out", str(out)])
    data = json.loads(out.read_text())
    ops = {r["op"] for r in data["rows"]}
    assert {"gdn_recurrent", "conv1d_update", "store_kvcache", "gated_rmsnorm", "rmsnorm+residual", "silu_mul"} <= ops
    assert any(op.startswith("paged_decode_attention") for op in ops)
    assert len(data["rows"]) == 2 * len(ops)
    for r in data["rows"]:
        assert r["rel_err"] == 0.0 and r["bytes"] > 0 and r["ref_us"] > 0
