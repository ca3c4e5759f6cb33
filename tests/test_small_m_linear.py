"""Small-M linear (decode GEMV): Triton (interpreter) vs the fp32 F.linear reference, split-K on/off, both reduce
modes, the MMA and FMA paths, workspace re-arming, launch heuristic, validation errors, and the bench's dry run.

Tolerances: fp32 outputs within 1e-5 (rel and abs; outputs are O(1) and only the summation order differs); bf16 within
1e-2 (both sides round the same fp32 sum once, so they differ by at most one bf16 ulp, 2^-7 relative); fp16 1e-3.
"""
import importlib.util
import json
import os

import pytest
import torch

from kernels.testing import assert_close, poisoned, require_interpreted  # sets TRITON_INTERPRET first
from kernels.small_m_linear import (  # noqa: I001
    _small_m_linear_kernel, default_launch, gated_rmsnorm_linear, gated_rmsnorm_linear_ref,
    gated_rmsnorm_linear_triton, linear_silu_mul, linear_silu_mul_ref, linear_silu_mul_triton, pick_split_k,
    rmsnorm_linear, rmsnorm_linear_ref, rmsnorm_linear_triton,
    silu_mul_linear, silu_mul_linear_ref, silu_mul_linear_triton, small_m_linear, small_m_linear_ref,
    small_m_linear_triton, small_m_linear_workspace,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_inputs(M, N, K, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen).to(dtype)
    w = (torch.randn(N, K, generator=gen) * K ** -0.5).to(dtype)  # outputs O(1)
    return x, w


LAUNCHES = {
    "default": {},
    "no_split": dict(split_k=1),
    "split3_fused": dict(block_k=32, split_k=3),  # K=200: 7 chunks of 32 -> 3 splits, last chunk partial
    "split2_kernel": dict(block_n=32, block_k=16, split_k=2, split_reduce="kernel"),
    "fma": dict(mma=False, block_n=16, block_k=32, split_k=1),
    "fma_split": dict(mma=False, block_n=32, block_k=16, split_k=4),
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


@pytest.mark.parametrize("launch", ["default", "split3_fused", "split2_kernel", "fma_split"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 40, 48), (5, 130, 200)])
def test_silu_mul_prologue_matches_ref(M, N, K, dtype, launch):
    """silu_mul_linear reads [gate | up] and multiplies silu(gate) * up (rounded like kernels/silu_mul) into the GEMV."""
    gen = torch.Generator().manual_seed(M + N)
    gate_up = (torch.randn(M, 2 * K, generator=gen) * 2).to(dtype)
    w = (torch.randn(N, K, generator=gen) * K ** -0.5).to(dtype)
    y = silu_mul_linear_triton(gate_up, w, out=poisoned((M, N), dtype), **LAUNCHES[launch])
    assert_close(y, silu_mul_linear_ref(gate_up, w), dtype)


@pytest.mark.parametrize("launch", ["default", "no_split", "split3_fused", "fma", "fma_split"])
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
    * sum(x) column by column; and the option errors."""
    x, w = make_inputs(3, 40, 48, torch.float32, seed=2)
    w[20:] = 1.0
    want = torch.nn.functional.silu(x @ w[:20].T) * x.sum(1, keepdim=True)
    assert_close(linear_silu_mul_triton(x, w, block_n=16, block_k=16, split_k=2), want)
    with pytest.raises(ValueError, match="odd"):
        linear_silu_mul_triton(x, w[:39])
    with pytest.raises(ValueError, match="split_reduce='fused'"):
        linear_silu_mul_triton(x, w, block_k=16, split_k=2, split_reduce="kernel")
    monkeypatch.delenv("OCRIA_FORCE_TRITON", raising=False)
    assert torch.equal(linear_silu_mul(x, w), linear_silu_mul_ref(x, w))


@pytest.mark.parametrize("launch", ["default", "split3_fused", "split2_kernel", "fma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 40, 48), (6, 130, 200), (3, 72, 256)])  # K=256: whole chunks (EVEN_K)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_prologue_matches_ref(M, N, K, dtype, launch, with_residual):
    """rmsnorm_linear normalises x (+ residual) with a zero-centred weight before the GEMV; with a residual the new
    residual stream x + residual is written exactly (the programs of the first N tile write it, every split reads the
    old one). Launches without a K split ("default", "fma" here) do it in one pass: they round h * (1 + w) to the
    dtype and scale the sums by 1/rms at the end, where the reference rounds the normalised product, so in bf16 the
    GEMV's inputs differ by rounding (within the same tolerance as a GEMV); split launches round as the reference."""
    gen = torch.Generator().manual_seed(M * 7 + N)
    x = (torch.randn(M, K, generator=gen) * 3).to(dtype)
    res = (torch.randn(M, K, generator=gen) * 3).to(dtype) if with_residual else None
    nw = (torch.randn(K, generator=gen) * 0.2).to(dtype)
    w = (torch.randn(N, K, generator=gen) * K ** -0.5).to(dtype)
    kw = dict(residual=res)
    if with_residual:
        kw["residual_out"] = poisoned((M, K), dtype)
    got = rmsnorm_linear_triton(x, nw, 1e-6, w, out=poisoned((M, N), dtype), **kw, **LAUNCHES[launch])
    want = rmsnorm_linear_ref(x, nw, 1e-6, w, residual=res)
    if with_residual:
        assert got[1] is kw["residual_out"] and torch.equal(got[1], want[1])
        got, want = got[0], want[0]
    assert_close(got, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rmsnorm_prologue_with_a_massive_activation_channel(dtype):
    """Residual streams carry a few channels of ~1e3-1e4. The one-pass form rounds the unnormalised h * (1 + w) to
    the dtype, which fp16 cannot hold there: fp16 keeps the normalise-first pass (finite, as the reference), bf16
    takes the one pass."""
    M, N, K = 3, 40, 256
    gen = torch.Generator().manual_seed(3)
    x, res = (torch.randn(M, K, generator=gen).to(dtype) for _ in range(2))
    res[:, 7] = 3000.0
    nw = (torch.randn(K, generator=gen) * 0.2).to(dtype)
    nw[7] = 25.0
    w = (torch.randn(N, K, generator=gen) * K ** -0.5).to(dtype)
    for launch in ({}, dict(mma=False, block_n=16, block_k=32, split_k=1)):  # no split: where the one pass would run
        got, new_res = rmsnorm_linear_triton(x, nw, 1e-6, w, residual=res, **launch)
        want, want_res = rmsnorm_linear_ref(x, nw, 1e-6, w, residual=res)
        assert torch.isfinite(got).all() and torch.equal(new_res, want_res)
        assert_close(got, want, dtype)


@pytest.mark.parametrize("launch", ["default", "split3_fused", "fma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 20, 48), (5, 65, 200), (4, 33, 256)])
def test_rmsnorm_prologue_with_swiglu_epilogue(M, N, K, dtype, launch):
    """rmsnorm_linear(swiglu=True): the MLP's gate_up GEMV reading the normalised input and writing silu(gate) * up,
    the 1/rms scale applied to both sums before the SwiGLU; the new residual as without the epilogue."""
    gen = torch.Generator().manual_seed(M * 5 + N)
    x, res = ((torch.randn(M, K, generator=gen) * 3).to(dtype) for _ in range(2))
    nw = (torch.randn(K, generator=gen) * 0.2).to(dtype)
    w = (torch.randn(2 * N, K, generator=gen) * K ** -0.5).to(dtype)
    got, new_res = rmsnorm_linear_triton(x, nw, 1e-6, w, residual=res, out=poisoned((M, N), dtype),
                                         residual_out=poisoned((M, K), dtype), swiglu=True, **LAUNCHES[launch])
    want, want_res = rmsnorm_linear_ref(x, nw, 1e-6, w, residual=res, swiglu=True)
    assert got.shape == (M, N) and torch.equal(new_res, want_res)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("launch", ["default", "split3_fused", "split2_kernel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,H", [(1, 40, 3), (7, 130, 5)])
def test_gated_rmsnorm_prologue_matches_ref(M, N, H, dtype, launch):
    """gated_rmsnorm_linear: each K chunk is one head of the GDN output, normalised and gated by silu(z) (z a strided
    slice of a wider projection, as in the engine) like kernels/gated_rmsnorm, then the GEMV."""
    D = 16
    gen = torch.Generator().manual_seed(M + N + H)
    o = (torch.randn(M, H, D, generator=gen) * 2).to(dtype)
    wide = (torch.randn(M, H * D + 9, generator=gen) * 2).to(dtype)
    z = wide[:, 4:4 + H * D].view(M, H, D)
    nw = (1 + torch.randn(D, generator=gen) * 0.2).to(dtype)
    w = (torch.randn(N, H * D, generator=gen) * (H * D) ** -0.5).to(dtype)
    launch = {k: v for k, v in LAUNCHES[launch].items() if k != "block_k"}
    y = gated_rmsnorm_linear_triton(o, z, nw, 1e-6, w, out=poisoned((M, N), dtype), **launch)
    assert_close(y, gated_rmsnorm_linear_ref(o, z, nw, 1e-6, w), dtype)


def test_prologue_errors_and_dispatch(monkeypatch):
    x, w = make_inputs(2, 40, 48, torch.float32)
    with pytest.raises(ValueError, match="needs 96 columns"):
        silu_mul_linear_triton(x, w)
    with pytest.raises(ValueError, match="norm_weight must be"):
        rmsnorm_linear_triton(x, torch.zeros(47), 1e-6, w)
    with pytest.raises(ValueError, match="must not alias"):
        rmsnorm_linear_triton(x, torch.zeros(48), 1e-6, w, residual=x.clone(), residual_out=x)
    with pytest.raises(ValueError, match="needs a GPU"):
        small_m_linear_triton(x, w, pdl=True)
    o = torch.randn(2, 3, 16)
    with pytest.raises(ValueError, match="block_k must be 16"):
        gated_rmsnorm_linear_triton(o, o, torch.ones(16), 1e-6, torch.zeros(5, 48), block_k=32)
    with pytest.raises(ValueError, match="power of two"):
        gated_rmsnorm_linear_triton(o[..., :12].contiguous(), o[..., :12], torch.ones(12), 1e-6, torch.zeros(5, 36))
    monkeypatch.delenv("OCRIA_FORCE_TRITON", raising=False)
    assert torch.equal(gated_rmsnorm_linear(o, o, torch.ones(16), 1e-6, torch.ones(5, 48)),
                       gated_rmsnorm_linear_ref(o, o, torch.ones(16), 1e-6, torch.ones(5, 48)))
    gate_up = torch.randn(2, 96)
    assert torch.equal(silu_mul_linear(gate_up, w), silu_mul_linear_ref(gate_up, w))
    assert torch.equal(rmsnorm_linear(x, torch.zeros(48), 1e-6, w), rmsnorm_linear_ref(x, torch.zeros(48), 1e-6, w))


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
    ((torch.zeros(2, 64), torch.zeros(3, 64)), dict(split_reduce="atomic"), "split_reduce"),
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
    spec = importlib.util.spec_from_file_location("small_m_linear_bench",
                                                  os.path.join(ROOT, "bench", "small_m_linear_bench.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
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


def test_gpu_prologue_check_script_passes_in_the_interpreter(tmp_path, monkeypatch):
    """bench/gemv_prologue_check.py (run on the H200 before timing the prologues) on tiny shapes, every kernel forced
    to Triton: each prologue as accurate as its bf16 reference, the new residual exact."""
    import importlib.util

    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    path = os.path.join(ROOT, "bench", "gemv_prologue_check.py")
    spec = importlib.util.spec_from_file_location("gemv_prologue_check", path)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    out = tmp_path / "check.json"
    assert check.main(["--tiny", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 * 5 and all(r["ok"] for r in rows)
