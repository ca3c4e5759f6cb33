"""Small-M linear (decode GEMV): Triton (interpreter) vs the fp32 F.linear reference, split-K on/off, workspace
re-arming, launch heuristic, validation errors, and the bench's dry run.

Tolerances: fp32 outputs within 1e-5 (rel and abs; outputs are O(1) and only the summation order differs); bf16 within
1e-2 (both sides round the same fp32 sum once, so they differ by at most one bf16 ulp, 2^-7 relative); fp16 1e-3.
"""
import json

import pytest
import torch

from kernels.testing import assert_close, poisoned, require_interpreted  # sets TRITON_INTERPRET first
from kernels.small_m_linear import (  # noqa: I001
    _small_m_linear_kernel, default_launch, linear_silu_mul, linear_silu_mul_ref, linear_silu_mul_triton,
    pick_split_k, small_m_linear, small_m_linear_ref, small_m_linear_triton, small_m_linear_workspace,
)

from conftest import load_bench


def make_inputs(M, N, K, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen).to(dtype)
    w = (torch.randn(N, K, generator=gen) * K ** -0.5).to(dtype)  # outputs O(1)
    return x, w


LAUNCHES = {
    "default": {},
    "no_split": dict(split_k=1),
    "split3": dict(block_k=32, split_k=3),  # K=200: 7 chunks of 32 -> 3 splits, last chunk partial
}


@pytest.mark.parametrize("launch", list(LAUNCHES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 40, 48), (3, 130, 200), (8, 130, 200), (8, 40, 48)])
def test_triton_matches_ref(M, N, K, dtype, launch):
    require_interpreted(_small_m_linear_kernel)
    x, w = make_inputs(M, N, K, dtype, seed=M * 1000 + N + K)
    y = small_m_linear_triton(x, w, out=poisoned((M, N), dtype), **LAUNCHES[launch])
    assert y.dtype == dtype and y.shape == (M, N)
    assert_close(y, small_m_linear_ref(x, w), dtype)


@pytest.mark.parametrize("launch", ["default", "no_split", "split3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 20, 48), (5, 65, 200), (16, 33, 96)])
def test_swiglu_epilogue_matches_ref(M, N, K, dtype, launch):
    """linear_silu_mul: the fused [gate | up] projection [2N, K] with silu(gate) * up applied to the finished sums
    (after the split-K reduction), as the gate_up GEMV followed by kernels/silu_mul would give."""
    x, w = make_inputs(M, 2 * N, K, dtype, seed=M * 31 + N + K)
    y = linear_silu_mul_triton(x, w, out=poisoned((M, N), dtype), **LAUNCHES[launch])
    assert y.shape == (M, N)
    assert_close(y, linear_silu_mul_ref(x, w), dtype)


def test_swiglu_epilogue_rows_and_errors(monkeypatch):
    """Output column j pairs gate row j with up row N + j: a weight whose up half is all ones gives silu(gate)
    * sum(x) column by column; and a weight of an odd row count is refused."""
    x, w = make_inputs(3, 40, 48, torch.float32, seed=2)
    w[20:] = 1.0
    want = torch.nn.functional.silu(x @ w[:20].T) * x.sum(1, keepdim=True)
    assert_close(linear_silu_mul_triton(x, w, block_n=16, block_k=16, split_k=2), want)
    with pytest.raises(ValueError, match="odd"):
        linear_silu_mul_triton(x, w[:39])
    monkeypatch.delenv("OCRIA_FORCE_TRITON", raising=False)
    assert torch.equal(linear_silu_mul(x, w), linear_silu_mul_ref(x, w))


def test_fp16_and_m16():
    x, w = make_inputs(16, 72, 96, torch.float16, seed=7)
    for launch in ({}, dict(block_k=32, split_k=3)):
        assert_close(small_m_linear_triton(x, w, **launch), small_m_linear_ref(x, w), torch.float16)


def test_strided_x_and_given_out():
    """x as a row slice of a wider buffer (row stride != K); out given and written in place."""
    gen = torch.Generator().manual_seed(3)
    big = torch.randn(5, 80, generator=gen).to(torch.bfloat16)
    x = big[:, 8:72]
    w = (torch.randn(50, 64, generator=gen) * 0.125).to(torch.bfloat16)
    out = poisoned((5, 50), torch.bfloat16)
    y = small_m_linear_triton(x, w, out=out, block_k=16, split_k=2)
    assert y is out
    assert_close(out, small_m_linear_ref(x, w))


def test_workspace_rearmed_and_deterministic():
    """The fused split-K path leaves the counters at 0 (so a preallocated workspace can be reused, e.g. by CUDA graph
    replays) and sums partials in fixed split order: repeated calls are bitwise equal."""
    x, w = make_inputs(3, 130, 200, torch.bfloat16, seed=11)
    ws = small_m_linear_workspace(130, x.device)
    launch = dict(block_n=32, block_k=32, split_k=4)
    y1 = small_m_linear_triton(x, w, workspace=ws, **launch)
    assert not ws.counters.any()
    y2 = small_m_linear_triton(x, w, workspace=ws, **launch)
    assert torch.equal(y1, y2) and not ws.counters.any()
    assert torch.equal(y1, small_m_linear_triton(x, w, **launch))  # without a workspace: same result
    assert_close(y1, small_m_linear_ref(x, w))


def test_rows_independent_of_batch_size():
    """Default launches depend on (N, K) only: a row gives the same bits alone or in a batch of 8."""
    x, w = make_inputs(8, 130, 200, torch.bfloat16, seed=5)
    y8 = small_m_linear_triton(x, w)
    assert torch.equal(small_m_linear_triton(x[2:3], w), y8[2:3])


def test_empty_dims():
    x, w = make_inputs(0, 40, 48, torch.float32)
    assert small_m_linear_triton(x, w).shape == (0, 40)
    y = small_m_linear_triton(torch.zeros(2, 0), torch.zeros(7, 0), out=poisoned((2, 7), torch.float32))
    assert torch.equal(y, torch.zeros(2, 7))


def test_default_launch_at_4b_decode_shapes():
    """The split-K rule documented in the module docstring (132 SMs, 32-row tiles): no split where N has >= 132
    tiles, else ~8 chunks of 128 per split, as the H200 sweep's best configs were."""
    splits = {(N, K): default_launch(N, K, torch.bfloat16, torch.device("cpu"))["split_k"]
              for N, K in ((18432, 2560), (12352, 2560), (2560, 9216), (2560, 4096), (248320, 2560))}
    assert splits == {(18432, 2560): 1, (12352, 2560): 1, (2560, 9216): 9, (2560, 4096): 4, (248320, 2560): 1}
    assert default_launch(2560, 9216, torch.float32, torch.device("cpu"))["block_k"] == 64  # 256-byte rows
    assert pick_split_k(40, 48, 64, 128, 132) == 1  # one chunk: nothing to split


@pytest.mark.parametrize("args,kwargs,match", [
    ((torch.zeros(4), torch.zeros(3, 4)), {}, "x must be"),
    ((torch.zeros(2, 4), torch.zeros(3, 4, 1)), {}, "weight must be"),
    ((torch.zeros(2, 4), torch.zeros(3, 5)), {}, "K="),
    ((torch.zeros(17, 4), torch.zeros(3, 4)), {}, "M <= 16"),
    ((torch.zeros(2, 4, dtype=torch.int32), torch.zeros(3, 4, dtype=torch.int32)), {}, "dtype must be"),
    ((torch.zeros(2, 4), torch.zeros(3, 4, dtype=torch.bfloat16)), {}, "weight dtype"),
    ((torch.zeros(2, 4), torch.zeros(4, 3).t()), {}, "weight: last dimension"),
    ((torch.zeros(2, 4), torch.zeros(3, 4)), dict(out=torch.zeros(3, 2)), "out must be"),
    ((torch.zeros(2, 64), torch.zeros(3, 64)), dict(block_n=48), "block_n"),
    ((torch.zeros(2, 64), torch.zeros(3, 64)), dict(block_k=8), "block_k"),
    ((torch.zeros(2, 64), torch.zeros(3, 64)), dict(split_k=0), "split_k"),
    ((torch.zeros(2, 64), torch.zeros(3, 64)), dict(pdl=True), "needs a GPU"),  # (compile_check covers it for sm_90)
    ((torch.zeros(2, 64), torch.zeros(3, 64)), dict(pdl=2), "pdl must be a bool"),
    ((torch.zeros(2, 64), torch.zeros(3, 64)),
     dict(block_k=16, split_k=2, workspace=small_m_linear_workspace(3, "cpu", max_m=1, max_split_k=1)), "partials"),
])
def test_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        small_m_linear_triton(*args, **kwargs)


def test_dispatch(monkeypatch):
    x, w = make_inputs(2, 40, 48, torch.float32)
    monkeypatch.delenv("OCRIA_FORCE_TRITON", raising=False)
    assert torch.equal(small_m_linear(x, w), small_m_linear_ref(x, w))  # CPU tensors: the reference
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    calls = []
    monkeypatch.setattr("kernels.small_m_linear.small_m_linear_triton", lambda *a, **kw: calls.append(kw))
    small_m_linear(x, w, split_k=2)
    assert calls == [dict(split_k=2)]


def test_bench_dry_run_writes_json(tmp_path, monkeypatch):
    """bench/small_m_linear_bench.py end to end on CPU: tiny shapes, reference + interpreter, every swept config."""
    monkeypatch.delenv("OCRIA_FORCE_TRITON", raising=False)
    bench = load_bench("small_m_linear_bench")
    out = tmp_path / "sml.json"
    bench.main(["--dry-run", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["meta"]["dry_run"] and data["meta"]["copy_bandwidth_GBps"] > 0
    assert len(data["rows"]) == len(bench.TINY_SHAPES) * 2
    for r in data["rows"]:
        assert r["rel_err"] < 1e-2 and r["cublas_rel_err"] < 1e-2 and r["bytes"] > 0 and r["repeat_identical"]
        assert len(r["configs"]) >= 8, r
        assert all(c["error"] is None and c["rel_err"] < 1e-2 and c["repeat_identical"] for c in r["configs"]), r
        assert not r["wrong_configs"]
        assert r["best"]["name"] in {c["name"] for c in r["configs"]}


def test_gpu_pdl_check_script_passes_in_the_interpreter(tmp_path, monkeypatch):
    """bench/gemv_pdl_check.py (run on the H200) on tiny shapes, every kernel forced to Triton: on CPU only the chain
    without PDL runs, so this checks the script, not PDL."""
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    check = load_bench("gemv_pdl_check")
    out = tmp_path / "check.json"
    assert check.main(["--tiny", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert [r["M"] for r in rows] == [1, 3, 8, 16] and all(r["ok"] for r in rows)
    assert all(r["rel_err_vs_ref"] <= res["max_rel_err"] for r in rows)
    # a GEMV that is wrong the same way with and without PDL fails the comparison with the reference chain
    monkeypatch.setattr(check.sml, "small_m_linear", lambda x, w, **launch: check.sml.small_m_linear_ref(x, w) * 1.1)
    assert check.main(["--tiny", "--out", str(out)]) == 1
    assert not any(r["ok"] for r in json.loads(out.read_text())["rows"])
