"""bench/spec_kernels_bench.py on CPU at toy shapes (--smoke): every configuration it would time runs in the
interpreter and gives its default configuration's output."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import json

import pytest
from conftest import load_bench


@pytest.mark.slow  # the whole benchmark in the interpreter
def test_spec_kernels_bench_smoke(tmp_path):
    out = tmp_path / "k.json"
    load_bench("spec_kernels_bench").main(["--smoke", "--out", str(out)])
    rows = [r for r in json.loads(out.read_text())["rows"] if "kernel" in r]
    kinds = {r["kernel"].split(" (")[0].split(",")[0] for r in rows}
    assert kinds == {"gdn step: verify + advance", "gdn step: verify + commit every step", "gdn verify", "gdn fold",
                     "gdn decode kernel over t tokens", "conv verify", "conv commit", "verify attention"}
    assert {r["block"] for r in rows if r["kernel"].startswith("gdn decode kernel")} == {1, 4}  # the smoke block: 4
    assert {r["kernel"] for r in rows if r["kernel"].startswith("gdn step")} == {
        f"gdn step: {what} ({impl})" for what in ("verify + advance", "verify + commit every step")
        for impl in ("default launches", "torch reference")}
    assert {r["kernel"] for r in rows if r["kernel"].startswith("gdn verify (steps")} >= {"gdn verify (steps)"}
    for r in rows:
        assert r["us"] > 0 and r["roofline_us"] > 0, r
        if "max_diff_vs_default" in r:
            assert r["max_diff_vs_default"] < 1e-4, r
