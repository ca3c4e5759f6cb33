"""Quantized small-M GEMVs (kernels/quant_linear) and the FP8 activation quantizers (kernels/fp8_quant): Triton under
the interpreter against their torch references on fresh random inputs, odd shapes included.

The decoded weight tiles are exact (E2M1 x E4M3 and FP8 values fit bf16), so kernel and reference multiply the same
operands and differ only in fp32 summation order: fp32 outputs within 1e-5, bf16 within one bf16 ulp (1e-2)."""
import pytest
import torch

from kernels.testing import assert_close, poisoned, require_interpreted  # sets TRITON_INTERPRET first
from kernels import fp8_quant as fq  # noqa: I001
from kernels.quant_linear import (
    FP8, E2M1_VALUES, _quant_gemv_kernel, default_launch, dequant_nvfp4_ref, dequant_nvfp4_triton, fp8_linear,
    fp8_linear_ref, fp8_linear_silu_mul_ref, fp8_linear_triton, fp8_matmul, nvfp4_linear, nvfp4_linear_ref,
    nvfp4_linear_silu_mul_ref, nvfp4_linear_triton, quant_workspace_size, unpack_e2m1,
)
from kernels.small_m_linear import SplitKWorkspace


def fp8_weight(N, K, gen):
    w = torch.randn(N, K, generator=gen) * K ** -0.5
    scale = w.abs().amax(1) / 448
    return (w / scale[:, None]).to(FP8), scale.float()


def nvfp4_weight(N, K, gen):
    packed = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8)
    bs = (torch.rand(N, K // 16, generator=gen) * 2 + 0.01).to(FP8)
    row = torch.rand(N, generator=gen) * K ** -0.5 + 1e-3
    return packed, bs, row


def test_default_launch_splits_k_like_small_m_linear():
    """No split where the 32-row tiles give every SM a program; ~8 chunks of 128 a split elsewhere (the 4B down_proj
    9 splits, out_proj 4); a split launch on odd shapes gives the reference's result."""
    cpu = torch.device("cpu")
    splits = {(N, K): default_launch(N, K, cpu)["split_k"] for N, K in ((18432, 2560), (12352, 2560), (2560, 9216),
                                                                       (2560, 4096))}
    assert splits == {(18432, 2560): 1, (12352, 2560): 1, (2560, 9216): 9, (2560, 4096): 4}
    # unsplit FP8: 128-wide K chunks where the tiles make more than four waves (gate_up, 576 tiles on 132 SMs)
    assert {(N, default_launch(N, K, cpu)["block_k"]) for N, K in ((18432, 2560), (12352, 2560), (10240, 2560))} == \
        {(18432, 128), (12352, 256), (10240, 256)}
    # NVFP4: 64-row tiles where they still make two waves (gate_up, down), 32 elsewhere
    shapes = {"gate_up": (18432, 2560), "gdn_qkvz": (12352, 2560), "attn_qkv": (10240, 2560), "down": (2560, 9216),
              "out_proj": (2560, 4096)}
    assert {k: default_launch(*nk, cpu, nvfp4=True)["block_n"] for k, nk in shapes.items()} == \
        {"gate_up": 64, "gdn_qkvz": 32, "attn_qkv": 32, "down": 64, "out_proj": 32}
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(3, 400, generator=gen).to(torch.bfloat16)
    w8, row = fp8_weight(40, 400, gen)
    assert_close(fp8_linear_triton(x, w8, row, out=poisoned((3, 40), torch.bfloat16), block_k=32, split_k=5),
                 fp8_linear_ref(x, w8, row))
    packed, bs, rs = nvfp4_weight(40, 400, gen)
    assert_close(nvfp4_linear_triton(x, packed, bs, rs, out=poisoned((3, 40), torch.bfloat16), block_k=64,
                                     split_k=3), nvfp4_linear_ref(x, packed, bs, rs))


def test_e4m3_bit_decode_recipe_gives_every_code_exactly():
    """_E4M3_ASM's recipe (the GPU runs it as PTX; the interpreter cannot) emulated with its own constants: each byte
    at the high end of a 16-bit half, the sign kept, the other bits shifted right by 4, read as bf16 and multiplied
    by the bias, equals float8_e4m3fn's value for all 254 non-NaN codes, subnormals and -0 included."""
    import re

    from kernels.quant_linear import _E4M3_ASM

    asm = _E4M3_ASM.value
    sign, field = (int(v, 16) for v in re.findall(r"and\.b32 \w+, \w+, (0x[0-9A-F]+);", asm)[:2])
    shift = int(re.search(r"shr\.b32 t, t, (\d+);", asm).group(1))
    bias = int(re.search(r"mov\.b32 bias, (0x[0-9A-F]+);", asm).group(1), 16) & 0xFFFF
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.int32)
    half = codes << 8
    bits = (half & (sign & 0xFFFF)) | ((half >> shift) & (field & 0xFFFF))
    as_bf16 = bits.to(torch.int16).view(torch.bfloat16).double()
    scale = torch.tensor([bias], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).double()
    want = codes.to(torch.uint8).view(FP8).double()
    assert torch.equal(as_bf16 * scale, want)
    assert torch.equal(torch.signbit(as_bf16 * scale), torch.signbit(want))


def test_unpack_e2m1_codes():
    """Every code once: low nibble = even element, bit 3 = sign."""
    codes = torch.arange(16, dtype=torch.uint8)
    packed = (codes[0::2] | (codes[1::2] << 4))[None]
    want = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES))
    assert torch.equal(unpack_e2m1(packed)[0], want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 40, 48), (3, 130, 208), (16, 33, 96), (7, 100, 400), (45, 70, 80),
                                   (131, 36, 48)])
def test_nvfp4_gemv_matches_ref(M, N, K, dtype):
    require_interpreted(_quant_gemv_kernel)
    gen = torch.Generator().manual_seed(M * 977 + N + K)
    x = torch.randn(M, K, generator=gen).to(dtype)
    packed, bs, row = nvfp4_weight(N, K, gen)
    for launch in (dict(block_n=32, block_k=64), dict(block_n=16, block_k=32, split_k=4), {},
                   dict(block_n=64, block_k=128, split_k=3, num_stages=2)):
        y = nvfp4_linear_triton(x, packed, bs, row, out=poisoned((M, N), dtype), **launch)
        assert_close(y, nvfp4_linear_ref(x, packed, bs, row), dtype)
    # the reference is x @ dequantized weight
    assert_close(nvfp4_linear_ref(x.float(), packed, bs, row), x.float() @ dequant_nvfp4_ref(packed, bs, row).T,
                 torch.float32, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 40, 48), (5, 130, 200), (16, 33, 96), (64, 50, 72), (100, 24, 40)])
def test_fp8_gemv_matches_ref(M, N, K, dtype):
    """W8A16 (what the GEMV runs for FP8 checkpoints, W8A8 ones included); W8A8's reference stays close to it."""
    gen = torch.Generator().manual_seed(M * 131 + N + K)
    x = torch.randn(M, K, generator=gen).to(dtype)
    w8, row = fp8_weight(N, K, gen)
    want = fp8_linear_ref(x, w8, row)
    for launch in (dict(block_k=64), dict(block_k=32, split_k=3), {}):
        assert_close(fp8_linear_triton(x, w8, row, out=poisoned((M, N), dtype), **launch), want, dtype)
    # W8A8 (the prefill GEMM's product) stays close to the exact one (per-token FP8 error ~2^-4 relative)
    xq, xs = fq.quant_fp8_per_token_ref(x)
    w8a8 = fp8_linear_ref(xq, w8, row, xs, out_dtype=torch.float32)
    exact = x.float() @ (w8.float() * row[:, None]).T
    assert (w8a8 - exact).norm() / exact.norm() < 0.06
    assert (want.float() - exact).norm() / exact.norm() < (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("M,N,K,split", [(1, 40, 48, 1), (3, 37, 208, 3), (8, 100, 400, 4), (16, 24, 96, 1)])
def test_swiglu_epilogue_matches_linear_then_silu_mul(fmt, M, N, K, split):
    """swiglu=True on a fused [gate | up] weight [2N, K] (N odd included, K split or not): the reference's linear
    rounded to the dtype, then silu(gate) * up; the CPU fallback (fp8_linear / nvfp4_linear) gives the same."""
    require_interpreted(_quant_gemv_kernel)
    gen = torch.Generator().manual_seed(M * 31 + N * 7 + K + split)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    if fmt == "fp8":
        w = fp8_weight(2 * N, K, gen)
        got = fp8_linear_triton(x, *w, out=poisoned((M, N), torch.bfloat16), swiglu=True, block_k=32, split_k=split)
        want, fallback = fp8_linear_silu_mul_ref(x, *w), fp8_linear(x, *w, swiglu=True)
    else:
        w = nvfp4_weight(2 * N, K, gen)
        got = nvfp4_linear_triton(x, *w, out=poisoned((M, N), torch.bfloat16), swiglu=True, block_k=32,
                                  split_k=split)
        want, fallback = nvfp4_linear_silu_mul_ref(x, *w), nvfp4_linear(x, *w, swiglu=True)
    assert got.shape == (M, N)
    assert_close(got, want, torch.bfloat16)
    assert torch.equal(fallback, want)


def test_fp8_past_the_gemv_rows_multiplies_the_dequantized_weight(monkeypatch):
    """fp8_linear past FP8_GEMV_MAX_M rows where the kernels run (a W8A16 checkpoint's prefill): the weight dequantized
    to x's dtype (each weight rounded once) through the library GEMM, not the fp32 reference; with swiglu too."""
    from kernels.quant_linear import FP8_GEMV_MAX_M

    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    gen = torch.Generator().manual_seed(3)
    M, N, K = FP8_GEMV_MAX_M + 9, 2 * 37, 96
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    w8, row = fp8_weight(N, K, gen)
    twin = (w8.float() * row[:, None]).to(torch.bfloat16)
    got = fp8_linear(x, w8, row, out=poisoned((M, N), torch.bfloat16))
    assert torch.equal(got, torch.nn.functional.linear(x, twin))
    assert_close(got, fp8_linear_ref(x, w8, row), torch.bfloat16)
    assert_close(fp8_linear(x, w8, row, swiglu=True), fp8_linear_silu_mul_ref(x, w8, row), torch.bfloat16)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_split_k_workspace_is_reused_and_left_rearmed(fmt):
    """A split launch adds its partials in-kernel through the caller's workspace (the engine's one per step): the
    counters are back at 0 after each launch, so a second launch (other rows, two row blocks of 64) is right too;
    quant_workspace_size is what the default launch asks of it; a short workspace fails in a line naming the need."""
    require_interpreted(_quant_gemv_kernel)
    gen = torch.Generator().manual_seed(5)
    N, K = 2560, 9216  # the 4B down_proj: 9 splits by default
    assert default_launch(N, K, torch.device("cpu"), fmt == "nvfp4")["split_k"] == 9
    parts, counters = quant_workspace_size(N, K, torch.device("cpu"), fmt == "nvfp4", max_m=70)
    ws = SplitKWorkspace(torch.empty(parts), torch.zeros(counters, dtype=torch.int32))
    w = fp8_weight(48, 640, gen) if fmt == "fp8" else nvfp4_weight(48, 640, gen)
    run = fp8_linear_triton if fmt == "fp8" else nvfp4_linear_triton
    ref = fp8_linear_ref if fmt == "fp8" else nvfp4_linear_ref
    for M in (3, 70):
        x = torch.randn(M, 640, generator=gen).to(torch.bfloat16)
        assert_close(run(x, *w, out=poisoned((M, 48), torch.bfloat16), block_k=32, split_k=4, workspace=ws),
                     ref(x, *w), torch.bfloat16)
        assert not ws.counters.any()
    with pytest.raises(ValueError, match=r"workspace.partials must be contiguous fp32 with >= 576 elements"):
        run(torch.randn(3, 640).to(torch.bfloat16), *w, block_k=32, split_k=4,
            workspace=SplitKWorkspace(torch.empty(10), torch.zeros(4, dtype=torch.int32)))


@pytest.mark.parametrize("N,K", [(40, 48), (33, 544)])
def test_nvfp4_dequantize_kernel_matches_ref(N, K):
    """The prefill path's weight expansion: e2m1 x block scale x row scale, rounded once to bf16."""
    gen = torch.Generator().manual_seed(N + K)
    packed, bs, row = nvfp4_weight(N, K, gen)
    want = dequant_nvfp4_ref(packed, bs, row).to(torch.bfloat16)
    out = poisoned((N, K), torch.bfloat16)
    assert torch.equal(dequant_nvfp4_triton(packed, bs, row, torch.bfloat16, out=out), want)


@pytest.mark.parametrize("R,D", [(1, 48), (5, 200), (3, 1000)])
def test_activation_quantizers_match_ref(R, D):
    gen = torch.Generator().manual_seed(R * 7 + D)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(R, D, generator=gen) * 3).to(dtype)
        w = (torch.randn(D, generator=gen) * 0.1).to(dtype)
        gu = torch.randn(R, 2 * D, generator=gen).to(dtype)
        res = torch.randn(R, D, generator=gen).to(dtype)
        fused = fq.rmsnorm_quant_fp8_triton(x, w, 1e-6, residual=res)
        fused_ref = fq.rmsnorm_quant_fp8_ref(x, w, 1e-6, residual=res)
        assert torch.equal(fused[2], fused_ref[2])  # the new residual x + residual
        pairs = [(fq.quant_fp8_per_token_triton(x), fq.quant_fp8_per_token_ref(x)),
                 (fq.rmsnorm_quant_fp8_triton(x, w, 1e-6), fq.rmsnorm_quant_fp8_ref(x, w, 1e-6)),
                 (fused[:2], fused_ref[:2]),
                 (fq.silu_mul_quant_fp8_triton(gu), fq.silu_mul_quant_fp8_ref(gu))]
        for (q, s), (q_ref, s_ref) in pairs:
            assert q.dtype == FP8 and s.shape == (R,)
            torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
            assert torch.equal(q.float(), q_ref.float())
            assert q.float().abs().amax(1).eq(448).all()  # each row's amax lands on the top code


def test_round_to_e4m3_every_binade():
    """The in-kernel E4M3 rounding equals torch's cast on values across the whole range, subnormals and ties
    included (the interpreter's own cast gets ~2 % of these wrong)."""
    import triton
    import triton.language as tl

    @triton.jit
    def k(x_ptr, o_ptr, n, B: tl.constexpr):
        offs = tl.arange(0, B)
        m = offs < n
        tl.store(o_ptr + offs, fq.round_to_e4m3(tl.load(x_ptr + offs, mask=m)).to(o_ptr.dtype.element_ty), mask=m)

    gen = torch.Generator().manual_seed(11)
    grid = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    grid = grid[~grid.isnan()].unique()
    mids = (grid[1:] + grid[:-1]) / 2  # exact ties
    x = torch.cat([grid, mids, torch.randn(4000, generator=gen) * 100, torch.randn(1000, generator=gen) * 0.01])
    x = x.clamp(-448, 448)
    out = torch.empty(x.numel(), dtype=FP8)
    k[(1,)](x, out, x.numel(), B=8192)
    assert torch.equal(out.float(), x.to(FP8).float())


def test_fused_quantizers_equal_unfused():
    from kernels.rmsnorm import rmsnorm_ref
    from kernels.silu_mul import silu_mul_ref

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 96, generator=gen).to(torch.bfloat16)
    w = torch.randn(96, generator=gen).to(torch.bfloat16) * 0.1
    r = torch.randn(4, 96, generator=gen).to(torch.bfloat16)
    q, s, nr = fq.rmsnorm_quant_fp8_ref(x, w, 1e-6, r)
    h, nr2 = rmsnorm_ref(x, w, 1e-6, r)
    assert torch.equal(nr, nr2) and torch.equal(q.float(), fq.quant_fp8_per_token_ref(h)[0].float())
    for (q, s), h in ((fq.rmsnorm_quant_fp8_ref(x, w, 1e-6), rmsnorm_ref(x, w, 1e-6)),
                      (fq.silu_mul_quant_fp8_ref(torch.cat([x, x], 1)), silu_mul_ref(torch.cat([x, x], 1)))):
        q2, s2 = fq.quant_fp8_per_token_ref(h)
        assert torch.equal(q.float(), q2.float()) and torch.equal(s, s2)


def test_fp8_matmul_cpu_falls_back_to_ref():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 64, generator=gen)
    w8, row = fp8_weight(48, 64, gen)
    xq, xs = fq.quant_fp8_per_token_ref(x)
    assert torch.equal(fp8_matmul(xq, xs, w8, row, torch.float32), fp8_linear_ref(xq, w8, row, xs, torch.float32))
    # and torch._scaled_mm's CPU implementation agrees with the reference (what the CUDA path computes)
    sm = torch._scaled_mm(xq, w8.t(), scale_a=xs[:, None], scale_b=row[None, :], out_dtype=torch.float32)
    assert_close(sm, fp8_linear_ref(xq, w8, row, xs, torch.float32), torch.float32, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("call,match", [
    (lambda: nvfp4_linear_triton(torch.zeros(2, 40), torch.zeros(3, 20, dtype=torch.uint8),
                                 torch.zeros(3, 2, dtype=FP8), torch.ones(3)), "divisible by 16"),
    (lambda: nvfp4_linear_triton(torch.zeros(2, 32), torch.zeros(3, 16, dtype=torch.uint8),
                                 torch.zeros(3, 1, dtype=FP8), torch.ones(3)), "block_scale must be"),
    (lambda: fp8_linear_triton(torch.zeros(2, 32), torch.zeros(3, 32), torch.ones(3)), "float8_e4m3fn"),
    (lambda: fp8_linear_triton(torch.zeros(2, 32, dtype=torch.int8), torch.zeros(3, 32, dtype=FP8), torch.ones(3)),
     "unsupported"),
    (lambda: fp8_linear_triton(torch.zeros(2, 32), torch.zeros(3, 32, dtype=FP8), torch.ones(4)), "row_scale"),
])
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
