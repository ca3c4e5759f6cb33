"""bench/spec_host_cost.py end to end on ocria-tiny with its drafter: both timings, and the block tables a step
copies shrink by the block length."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import json

from conftest import load_bench


def test_spec_host_cost_bench(tmp_path):
    out = tmp_path / "h.json"
    load_bench("spec_host_cost").main(["--batches", "1", "3", "--reps", "3", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["plan_fill_ms"] > 0 and r["plan_fill_per_row_tables_ms"] > 0
        assert r["table_bytes_copied_per_row"] == r["block"] * r["table_bytes_copied"]
