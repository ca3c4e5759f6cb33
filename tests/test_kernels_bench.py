"""The GPU microbenchmark script runs end to end on CPU (--dry-run: tiny shapes), its Triton side forced onto the
Triton interpreter, so each row's rel_err compares the Triton kernel with its torch reference."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import json

from triton.runtime.interpreter import InterpretedFunction

from conftest import load_bench


def test_bench_dry_run_compares_triton_with_the_references(tmp_path, monkeypatch):
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    launched = []
    run = InterpretedFunction.run
    monkeypatch.setattr(InterpretedFunction, "run", lambda self, *a, **k: (launched.append(self.fn.__name__),
                                                                          run(self, *a, **k))[1])
    bench = load_bench("kernels_bench")
    out = tmp_path / "kernels.json"
    bench.main(["--dry-run", "--batch-sizes", "1", "3", "--out", str(out)])
    data = json.loads(out.read_text())
    ops = {r["op"] for r in data["rows"]}
    assert {"gdn_recurrent", "conv1d_update", "store_kvcache", "gated_rmsnorm", "rmsnorm+residual", "silu_mul"} <= ops
    assert any(op.startswith("paged_decode_attention") for op in ops)
    assert len(data["rows"]) == 2 * len(ops)
    assert len(set(launched)) >= len(ops), sorted(set(launched))  # every op's kernel ran in the interpreter
    for r in data["rows"]:
        # bf16 outputs: the kernel and the reference may round the largest value one bf16 step (2^-8..2^-7) apart
        assert r["rel_err"] < 1e-2 and r["bytes"] > 0 and r["ref_us"] > 0, r
