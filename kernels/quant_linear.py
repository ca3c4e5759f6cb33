"""Small-M linear layers (decode GEMV, M <= MAX_M rows) over low-precision weights, dequantized in registers.

Two weight formats, both in compressed-tensors' on-disk layout (engine/quant_config.py):
  * FP8: w8 [N, K] float8_e4m3fn, row_scale [N] fp32 (per output channel): W = w8 * row_scale[:, None]. The GEMV
    multiplies x in the model dtype (W8A16), also for a W8A8 checkpoint: at decode sizes a separate per-token
    quantization kernel before each projection cost more than the FP8 dot saved (docs/decisions.md); the prefill
    GEMM (fp8_matmul) quantizes x per token and runs W8A8 on the FP8 tensor cores.
  * NVFP4: packed [N, K/2] uint8 (two E2M1 codes a byte, element 2i in the low nibble), block_scale [N, K/16]
    float8_e4m3fn (one per 16 weights along K), row_scale [N] fp32 = 1 / the tensor's global scale (a fused
    projection concatenates several tensors, each with its own global scale, so it is kept per row):
    W = e2m1(packed) * block_scale (repeated over its 16 weights) * row_scale[:, None]. Activations stay in the
    model dtype (W4A16): Hopper has no FP4 tensor cores.

Kernel: each program owns BLOCK_N weight rows and walks K in BLOCK_K chunks, loading the low-precision bytes (1 or
0.5 byte a weight, + 1/16 byte of block scale), decoding them in registers to bf16 and multiplying by the chunk of
all M rows of x with tl.dot ("swap AB" as kernels/small_m_linear: the weight tile is the MMA's M side, x is padded
to 16 rows). E2M1 x E4M3 products have at most 6 significant bits and FP8 values 4, so the decoded tiles are exact in
bf16: the dot sees exactly the reference's operands, and the per-row fp32 scales are applied once, after the K loop.
On the GPU the E2M1 decode is a few bit operations and two bf16x2 multiplies per pair of weights (_E2M1_ASM): the
arithmetic decode it replaced made the NVFP4 GEMV compute-bound at 6 % of the copy bandwidth. The Triton interpreter
runs the same kernels on CPU with the arithmetic decode (_e2m1_decode), so the tests check the tiling, masks and
scales; the bit recipe is checked against the reference on the GPU (tests/test_kernels_quant_linear.py, CUDA only,
and every quant_gemv_bench launch).

The rest is kernels/small_m_linear's, shared with it: split-K where N alone gives too few programs (default_launch;
the 4B down_proj and out_proj) with the last program of a tile adding the partials in split order (deterministic,
one rounding; a SplitKWorkspace sized by quant_workspace_size); the SwiGLU epilogue (swiglu=True: a fused
[gate | up] weight [2N, K], output silu(gate) * up [M, N]); PDL (pdl=True, sm_90+: the weight's first lines
prefetched into L2 before waiting for the kernel before). The FP8 decode step ran 64 separate split-K reductions and
32 SwiGLU kernels that the bf16 step does without (bench/results/h100_quant_decode_profile_c.json).
"""
import torch
import triton
import triton.language as tl

from kernels._common import (
    cast_rtne, cdiv, check, next_pow2, output, pdl_enter, pdl_launch, require_last_dim_contiguous, sm_count, use_triton)
from kernels.silu_mul import silu_mul_ref
from kernels.small_m_linear import (
    MAX_SPLIT_K, _finish_tile, _prefetch_weight_lines, _tile_rows, pick_split_k, split_ranges, workspace_checked)

MAX_M = 64  # rows of x one program multiplies (its MMA's N side); more rows take more programs along the grid's m axis
# Rows up to which the GEMV serves (more: the GEMMs of fp8_matmul / nvfp4_matmul). FP8 hands over to the FP8 tensor
# cores of torch._scaled_mm; NVFP4 has no tensor-core GEMM reading packed weights here, so its GEMV serves decode
# batches as far as a dequantize-then-cuBLAS GEMM (which writes and rereads a bf16 copy of the weight) is slower: on
# the H100 at 1 row everywhere, at 8 rows on about half the shapes, at 128 rows nowhere (47.8-90 against 241-1005 us;
# bench/results/h100_quant_gemv_b.json).
FP8_GEMV_MAX_M = 16
NVFP4_GEMV_MAX_M = 8
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # code & 7 -> magnitude; bit 3 is the sign


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[N, K/2] uint8 -> [N, K] fp32 E2M1 values (low nibble = even element)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    mag = table[codes & 7]
    return torch.where(codes >= 8, -mag, mag)


def dequant_fp8_ref(w8: torch.Tensor, row_scale: torch.Tensor) -> torch.Tensor:
    """[N, K] fp32 weight of an FP8 tensor with per-row scales."""
    return w8.float() * row_scale.float()[:, None]


def dequant_nvfp4_ref(packed, block_scale, row_scale) -> torch.Tensor:
    """[N, K] fp32 weight of an NVFP4 tensor (packed [N, K/2], block_scale [N, K/16], row_scale [N])."""
    return nvfp4_tile_ref(packed, block_scale) * row_scale.float()[:, None]


def nvfp4_tile_ref(packed, block_scale) -> torch.Tensor:
    """E2M1 values times their block scale, before the per-row scale: [N, K] fp32 (exact in bf16)."""
    v = unpack_e2m1(packed)
    return v * block_scale.float().repeat_interleave(NVFP4_BLOCK, dim=1)


def _validate_x(x, K):
    check(x.dim() == 2, f"x must be [M, K], got shape {tuple(x.shape)}")
    check(x.shape[1] == K, f"x is [M, {x.shape[1]}] but the weight has K={K}")


def _validate_fp8(x, w8, row_scale, x_scale):
    check(w8.dim() == 2 and w8.dtype == FP8, f"w8 must be float8_e4m3fn [N, K], got {w8.dtype} {tuple(w8.shape)}")
    _validate_x(x, w8.shape[1])
    check(row_scale.shape == (w8.shape[0],) and row_scale.dtype == torch.float32,
          f"row_scale must be fp32 [{w8.shape[0]}], got {row_scale.dtype} {tuple(row_scale.shape)}")
    if x_scale is not None:
        check(x.dtype == FP8, f"with x_scale, x must be float8_e4m3fn (quantized per token), got {x.dtype}")
        check(x_scale.shape == (x.shape[0],) and x_scale.dtype == torch.float32,
              f"x_scale must be fp32 [{x.shape[0]}], got {x_scale.dtype} {tuple(x_scale.shape)}")
    else:
        check(x.dtype in (torch.bfloat16, torch.float16, torch.float32), f"x dtype {x.dtype} unsupported")


def _validate_nvfp4(x, packed, block_scale, row_scale):
    check(packed.dim() == 2 and packed.dtype == torch.uint8, f"packed must be uint8 [N, K/2], got {packed.dtype}")
    N, K = packed.shape[0], packed.shape[1] * 2
    check(K % NVFP4_BLOCK == 0, f"NVFP4 needs K divisible by {NVFP4_BLOCK}, got K={K}")
    _validate_x(x, K)
    check(x.dtype in (torch.bfloat16, torch.float16, torch.float32), f"x dtype {x.dtype} unsupported")
    check(block_scale.shape == (N, K // NVFP4_BLOCK) and block_scale.dtype == FP8,
          f"block_scale must be float8_e4m3fn [{N}, {K // NVFP4_BLOCK}], got {block_scale.dtype} "
          f"{tuple(block_scale.shape)}")
    check(row_scale.shape == (N,) and row_scale.dtype == torch.float32,
          f"row_scale must be fp32 [{N}], got {row_scale.dtype} {tuple(row_scale.shape)}")


def fp8_linear_ref(x, w8, row_scale, x_scale=None, out_dtype=None, out=None):
    """y [M, N] = (x @ w8.T) * x_scale[:, None] * row_scale[None, :] in fp32, rounded once to out_dtype (x's dtype
    when x is not FP8). x: [M, K] fp8 with x_scale [M] (W8A8), or [M, K] bf16/fp16/fp32 without (W8A16)."""
    _validate_fp8(x, w8, row_scale, x_scale)
    dt = out_dtype or x.dtype
    y = output(out, (x.shape[0], w8.shape[0]), dt, x.device)
    acc = x.float() @ w8.float().T
    if x_scale is not None:
        acc = acc * x_scale[:, None]
    y.copy_(acc * row_scale[None, :])
    return y


def nvfp4_linear_ref(x, packed, block_scale, row_scale, out=None):
    """y [M, N] = (x @ (e2m1(packed) * block_scale).T) * row_scale[None, :] in fp32, rounded once to x.dtype."""
    _validate_nvfp4(x, packed, block_scale, row_scale)
    y = output(out, (x.shape[0], packed.shape[0]), x.dtype, x.device)
    y.copy_((x.float() @ nvfp4_tile_ref(packed, block_scale).T) * row_scale[None, :])
    return y


def _validate_swiglu(w):
    check(w.shape[0] % 2 == 0, f"swiglu needs a fused [gate | up] weight [2N, K], got {w.shape[0]} rows (odd)")


def fp8_linear_silu_mul_ref(x, w8, row_scale, out=None):
    """fp8_linear_ref of a fused [gate | up] weight (rounded to x's dtype), then kernels/silu_mul: [M, N]."""
    _validate_swiglu(w8)
    return silu_mul_ref(fp8_linear_ref(x, w8, row_scale), out)


def nvfp4_linear_silu_mul_ref(x, packed, block_scale, row_scale, out=None):
    """nvfp4_linear_ref of a fused [gate | up] weight (rounded to x's dtype), then kernels/silu_mul: [M, N]."""
    _validate_swiglu(packed)
    return silu_mul_ref(nvfp4_linear_ref(x, packed, block_scale, row_scale), out)


@triton.jit
def _e2m1_decode(codes):
    """4-bit E2M1 codes (int) -> fp32: sign bit 3, exponent bits 2..1, mantissa bit 0 (bias 1, subnormal at e=0)."""
    e = (codes >> 1) & 3
    m = (codes & 1).to(tl.float32)
    mag = tl.where(e == 0, m * 0.5, (1.0 + 0.5 * m) * (1 << e).to(tl.float32) * 0.5)
    return tl.where((codes & 8) != 0, -mag, mag)


# E2M1 -> bf16 on the GPU, two values a 32-bit lane op: a code's sign and its three exponent/mantissa bits are moved
# to bf16's sign (bit 15) and bits 8..6, which reads as the E2M1 value times 2^-126 (subnormal for exponent 0, which
# E2M1 and bf16 then scale alike), and one mul.bf16x2 by 2^126 (0x7E80) makes it exact; a second multiplies by the
# bf16 block scale (E2M1 x E4M3 fits bf16). Bytes 0,1 (2,3) of the packed word go to the low/high halves of $0 ($1)
# for the low nibbles and of $2 ($3) for the high ones. Hopper and later (mul.bf16x2 is sm_90).
_E2M1_ASM = tl.constexpr("""
{
.reg .b32 t, u, a, b, z, bias;
mov.b32 z, 0;
mov.b32 bias, 0x7E807E80;
prmt.b32 t, $4, z, 0x4140;
prmt.b32 u, $4, z, 0x4342;
shl.b32 a, t, 12; and.b32 a, a, 0x80008000; shl.b32 b, t, 6; and.b32 b, b, 0x01C001C0; or.b32 a, a, b;
mul.rn.bf16x2 a, a, bias; mul.rn.bf16x2 $0, a, $5;
shl.b32 a, u, 12; and.b32 a, a, 0x80008000; shl.b32 b, u, 6; and.b32 b, b, 0x01C001C0; or.b32 a, a, b;
mul.rn.bf16x2 a, a, bias; mul.rn.bf16x2 $1, a, $6;
shl.b32 a, t, 8; and.b32 a, a, 0x80008000; shl.b32 b, t, 2; and.b32 b, b, 0x01C001C0; or.b32 a, a, b;
mul.rn.bf16x2 a, a, bias; mul.rn.bf16x2 $2, a, $5;
shl.b32 a, u, 8; and.b32 a, a, 0x80008000; shl.b32 b, u, 2; and.b32 b, b, 0x01C001C0; or.b32 a, a, b;
mul.rn.bf16x2 a, a, bias; mul.rn.bf16x2 $3, a, $6;
}
""")

# E4M3 -> bf16 on the GPU (fp8_asm, a launch option the sweep measures against the conversion through fp32): bytes
# 0,1 (2,3) of the word move to the high byte of $0's (and $1's) halves, the sign stays at bit 15 and the exponent
# and mantissa bits shift right by 4 to bf16's bits 10..4, which reads as the E4M3 value times 2^-120 (subnormal for
# exponent 0, which both formats then scale alike); one mul.bf16x2 by 2^120 (0x7B80) makes it exact. Three lane ops
# a weight where the conversion through fp32 took ~5 (kernels/compile_check's PTX: 154 cvt in the gate_up loop).
_E4M3_ASM = tl.constexpr("""
{
.reg .b32 t, s, z, bias;
mov.b32 z, 0;
mov.b32 bias, 0x7B807B80;
prmt.b32 t, $2, z, 0x1404;
and.b32 s, t, 0x80008000; shr.b32 t, t, 4; and.b32 t, t, 0x07F007F0; or.b32 t, t, s;
mul.rn.bf16x2 $0, t, bias;
prmt.b32 t, $2, z, 0x3424;
and.b32 s, t, 0x80008000; shr.b32 t, t, 4; and.b32 t, t, 0x07F007F0; or.b32 t, t, s;
mul.rn.bf16x2 $1, t, bias;
}
""")


@triton.jit
def _nvfp4_tiles(b, s, ASM: tl.constexpr):
    """Packed bytes b [..., 8k] (uint8) and their block scales s (fp8, broadcastable to b) -> (low, high) nibble
    values times the scale: bf16 through _E2M1_ASM on the GPU (ASM), fp32 through _e2m1_decode elsewhere."""
    if ASM:
        sb = tl.broadcast_to(s.to(tl.float32).to(tl.bfloat16), b.shape)  # fp8 -> bf16 directly is slow
        lo, hi = tl.inline_asm_elementwise(_E2M1_ASM, "=r,=r,=r,=r,r,r,r", [b, sb],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        sf = s.to(tl.float32)
        lo = _e2m1_decode((b & 15).to(tl.int32)) * sf
        hi = _e2m1_decode((b >> 4).to(tl.int32)) * sf
    return lo, hi


@triton.jit(do_not_specialize=["M"])
def _quant_gemv_kernel(
    x_ptr, w_ptr, bs_ptr, rs_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, K_PER_SPLIT, sxm, swn, sbn, som,
    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NVFP4: tl.constexpr,
    UPCAST_DOT: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr,
    PREFETCH_LINES: tl.constexpr, SWIGLU: tl.constexpr, FP8_ASM: tl.constexpr,
):
    """NVFP4: w_ptr is packed [N, K/2] uint8, bs_ptr block scales [N, K/16] fp8; else w_ptr is fp8 [N, K].
    SPLIT: program (m, n, s) sums K range s (K_PER_SPLIT, a multiple of BLOCK_K) and stores its scaled fp32 partial
    to part_ptr [S, M, W_ROWS]; the last of a tile's programs to finish (count_ptr, one counter per (m, n) tile) adds
    them in split order, as kernels/small_m_linear does. SWIGLU: N output columns of a [gate | up] weight of 2N rows,
    tile row r < BLOCK_N/2 gate row j, the others up row N + j. NVFP4 tiles are [BLOCK_N, groups of 16, 8 bytes]: a
    group's scale broadcasts along its bytes without a reshuffle, and the low (high) nibbles multiply x's even (odd)
    columns in two dots, so the decoded values never need interleaving."""
    pid_m = tl.program_id(0)  # the fastest-varying axis: a weight tile's row blocks run together and share it in L2
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
    offs_n, mask_n, W_ROWS = _tile_rows(pid_n, N, BLOCK_N, SWIGLU)
    offs_m = pid_m * M_PAD + tl.arange(0, M_PAD)
    mask_m = offs_m < M
    offs_k = tl.arange(0, BLOCK_K)
    rows = offs_n.to(tl.int64)[:, None] * swn

    if PDL:  # as kernels/small_m_linear: the weights' first lines into L2, then wait for the kernel before
        W_PER_K: tl.constexpr = 2 if NVFP4 else 1  # K elements a stored byte holds
        _prefetch_weight_lines(w_ptr, offs_n, W_ROWS, swn, k_lo // W_PER_K, k_hi // W_PER_K, PREFETCH_LINES)
        pdl_enter(PDL)

    acc = tl.zeros((BLOCK_N, M_PAD), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        if NVFP4:
            HALF: tl.constexpr = BLOCK_K // 2
            GROUPS: tl.constexpr = BLOCK_K // 16
            offs_g = tl.arange(0, GROUPS)
            in_k = (k + 16 * offs_g) < k_hi  # K is a multiple of 16: a group is all in or all out
            byte = k // 2 + offs_g[:, None] * 8 + tl.arange(0, 8)[None, :]
            b = tl.load(w_ptr + rows[:, :, None] + byte[None, :, :],
                        mask=mask_n[:, None, None] & in_k[None, :, None], other=0)
            s = tl.load(bs_ptr + offs_n.to(tl.int64)[:, None] * sbn + k // 16 + offs_g[None, :],
                        mask=mask_n[:, None] & in_k[None, :], other=0.0)
            lo, hi = _nvfp4_tiles(b, s[:, :, None], ASM)
            xk = tl.load(x_ptr + offs_m[:, None] * sxm + k + offs_k[None, :],
                         mask=mask_m[:, None] & ((k + offs_k) < k_hi)[None, :], other=0.0)
            x_even, x_odd = tl.split(tl.reshape(xk, (M_PAD, HALF, 2)))  # one contiguous load, split in registers
            for nib in tl.static_range(2):
                w = tl.reshape(lo if nib == 0 else hi, (BLOCK_N, HALF))
                xk = x_even if nib == 0 else x_odd
                if UPCAST_DOT or x_ptr.dtype.element_ty == tl.float32:
                    acc = tl.dot(w.to(tl.float32), tl.trans(xk.to(tl.float32)), acc, input_precision="ieee")
                else:
                    acc = tl.dot(w.to(tl.bfloat16), tl.trans(xk.to(tl.bfloat16)), acc)
        else:
            mask_k = (k + offs_k) < k_hi
            w = tl.load(w_ptr + rows + k + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            xk = tl.load(x_ptr + offs_m[:, None] * sxm + k + offs_k[None, :],
                         mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            if UPCAST_DOT or x_ptr.dtype.element_ty == tl.float32:  # fp32 operands, full-precision products
                acc = tl.dot(w.to(tl.float32), tl.trans(xk.to(tl.float32)), acc, input_precision="ieee")
            elif FP8_ASM:  # the bits moved into bf16 (_E4M3_ASM)
                wb = tl.inline_asm_elementwise(_E4M3_ASM, "=r,=r,r", [w.to(tl.uint8, bitcast=True)],
                                               dtype=tl.bfloat16, is_pure=True, pack=4)
                acc = tl.dot(wb, tl.trans(xk.to(tl.bfloat16)), acc)
            else:  # bf16 tensor-core MMA: FP8 weights are exact in bf16. Through fp32: the direct fp8 -> bf16
                # conversion made the H100 GEMV 36.0 us on gate_up at 1 row against 25.1 this way
                acc = tl.dot(w.to(tl.float32).to(tl.bfloat16), tl.trans(xk.to(tl.bfloat16)), acc)
    res = tl.trans(acc)  # [M_PAD, BLOCK_N]
    res = res * tl.load(rs_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    _finish_tile(res, out_ptr, part_ptr, count_ptr, pid_m * tl.num_programs(1) + pid_n, pid_k, tl.num_programs(2),
                 offs_m, offs_n, mask_m, mask_n, M, N, W_ROWS, pid_n, som, BLOCK_N, SPLIT, SWIGLU)


def asm_decode(x: torch.Tensor) -> bool:
    """Whether the bit-level decodes can run (_E2M1_ASM for NVFP4, _E4M3_ASM where fp8_asm asks): compiled for sm_90+
    and multiplying bf16."""
    return x.is_cuda and x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)


def default_launch(N: int, K: int, device, nvfp4: bool = False) -> dict:
    """32-row tiles (N counts weight rows: a fused [gate | up] has 2N); K split as kernels/small_m_linear splits it
    (no split where the N tiles give every SM a program, else about 8 chunks of 128 a split: 9 splits for the 4B
    down_proj, 4 for out_proj). Unsplit FP8 launches take 256-element K chunks four stages deep, but 128 three deep
    where the tiles make more than four waves of programs (the 4B gate_up: 21.2 against 26.9 us at 1 and 8 rows on
    an H100, where gdn_qkvz and attn_qkv, 2.4-2.9 waves, were 6-7 % faster the other way,
    bench/results/h100_quant_gemv_c.json); NVFP4 keeps 128 (46.2 against 73.7 us on gate_up: half the registers,
    h100_quant_gemv_b.json), and takes 64-row tiles where they still make two waves of programs: gate_up 46.0
    against 49.7 us and down 23.2 against 28.3 at 1 row, where gdn_qkvz, attn_qkv and out_proj (1.2-1.5 waves at
    64 rows) lost 15-20 % (h100_quant_gemv_c.json)."""
    sms = sm_count(device)
    split = pick_split_k(N, K, 32, 128, sms)
    if split == 1 and not nvfp4 and cdiv(N, 32) <= 4 * sms:
        return dict(block_n=32, block_k=256, split_k=1, num_stages=4)
    block_n = 64 if nvfp4 and cdiv(N, 64) * split >= 2 * sms else 32
    return dict(block_n=block_n, block_k=128, split_k=split, num_stages=3)


def quant_workspace_size(N: int, K: int, device, nvfp4: bool = False, max_m: int = 16) -> tuple[int, int]:
    """(fp32 partials, int32 counters) that a default launch of up to max_m rows on an [N, K] weight (N weight rows)
    needs in its SplitKWorkspace; (0, 0) where it does not split."""
    d = default_launch(N, K, device, nvfp4)
    m_pad = min(MAX_M, max(16, next_pow2(max_m)))
    if m_pad > 16:
        d.update(block_k=128, num_stages=3)
    S = split_ranges(K, d["block_k"], d["split_k"])[1]
    return (S * max_m * N, cdiv(max_m, m_pad) * cdiv(N, d["block_n"])) if S > 1 else (0, 0)


def _launch(x, w, bs, row_scale, out, nvfp4, block_n=None, block_k=None, split_k=None, num_warps=4,
            num_stages=None, workspace=None, pdl=False, prefetch_lines=8, swiglu=False, fp8_asm=False):
    require_last_dim_contiguous("x", x)
    require_last_dim_contiguous("weight", w)
    M = x.shape[0]
    W_ROWS = w.shape[0]
    N = W_ROWS // 2 if swiglu else W_ROWS  # output columns
    K = w.shape[1] * (2 if nvfp4 else 1)
    y = output(out, (M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    d = default_launch(W_ROWS, K, x.device, nvfp4)
    m_pad = min(MAX_M, max(16, next_pow2(M)))
    if m_pad > 16:  # more rows of x: 128-element chunks keep the tiles in registers (no spills at 64 rows)
        d.update(block_k=128, num_stages=3)
    block_n, block_k = block_n or d["block_n"], block_k or d["block_k"]
    check(block_n >= 16 and block_n == next_pow2(block_n), f"block_n must be a power of two >= 16, got {block_n}")
    check(block_k >= 32 and block_k == next_pow2(block_k), f"block_k must be a power of two >= 32, got {block_k}")
    check(prefetch_lines >= 1 and prefetch_lines == next_pow2(prefetch_lines),
          f"prefetch_lines must be a power of two, got {prefetch_lines}")
    pdl_args = pdl_launch(pdl)
    split = d["split_k"] if split_k is None else split_k
    check(isinstance(split, int) and 1 <= split <= MAX_SPLIT_K, f"split_k must be an int in [1, {MAX_SPLIT_K}]")
    k_per_split, S = split_ranges(K, block_k, split)
    grid = (cdiv(M, m_pad), cdiv(W_ROWS, block_n), S)  # with swiglu cdiv(N, block_n // 2) tiles: the same number
    if S > 1:
        parts, counters = workspace_checked(workspace, S * M * W_ROWS, grid[0] * grid[1], x.device)
    else:
        parts, counters = y, y  # unused
    _quant_gemv_kernel[grid](
        x, w, bs if bs is not None else row_scale, row_scale, y, parts, counters,
        M, N, K, k_per_split, x.stride(0), w.stride(0), bs.stride(0) if bs is not None else 0, y.stride(0),
        M_PAD=m_pad, BLOCK_N=block_n, BLOCK_K=block_k, NVFP4=nvfp4,
        UPCAST_DOT=not x.is_cuda,  # the CPU interpreter multiplies bf16 tiles as raw integers: give it fp32
        SPLIT=S > 1, ASM=nvfp4 and asm_decode(x), PREFETCH_LINES=prefetch_lines, SWIGLU=bool(swiglu),
        FP8_ASM=bool(fp8_asm) and not nvfp4 and asm_decode(x),
        num_warps=num_warps, num_stages=num_stages or d["num_stages"], **pdl_args)
    return y


def fp8_linear_triton(x, w8, row_scale, out=None, swiglu=False, **launch):
    """W8A16: x [M, K] in the model dtype times the FP8 weight dequantized in registers; swiglu: silu(gate) * up of a
    fused [gate | up] weight, [M, N]. Launch options (default_launch's where None): block_n, block_k, split_k,
    num_warps, num_stages; workspace (a SplitKWorkspace, used when K is split), pdl, prefetch_lines; fp8_asm (sm_90+
    with bf16 x, else ignored): decode the weight by bit moves (_E4M3_ASM) instead of converting through fp32."""
    _validate_fp8(x, w8, row_scale, None)
    if swiglu:
        _validate_swiglu(w8)
    return _launch(x, w8, None, row_scale, out, False, swiglu=swiglu, **launch)


def nvfp4_linear_triton(x, packed, block_scale, row_scale, out=None, swiglu=False, **launch):
    """W4A16; swiglu and launch options as fp8_linear_triton."""
    _validate_nvfp4(x, packed, block_scale, row_scale)
    if swiglu:
        _validate_swiglu(packed)
    return _launch(x, packed, block_scale, row_scale, out, True, swiglu=swiglu, **launch)


def fp8_linear(x, w8, row_scale, out=None, swiglu=False, **launch):
    """FP8-weight linear, W8A16 (swiglu: with the SwiGLU epilogue): on CUDA the Triton GEMV up to FP8_GEMV_MAX_M rows,
    past it (a W8A16 checkpoint's prefill) the weight dequantized to x's dtype, then cuBLAS; elsewhere the torch
    reference. The reference's fp32 product of the FP8 weight, per call, took seconds a 4B prefill on a GPU."""
    if use_triton(x):
        if x.shape[0] <= FP8_GEMV_MAX_M:
            return fp8_linear_triton(x, w8, row_scale, out, swiglu=swiglu, **launch)
        _validate_fp8(x, w8, row_scale, None)
        w = (w8.float() * row_scale[:, None]).to(x.dtype)  # each weight rounded once, as the dequantized twin's
        y = torch.nn.functional.linear(x, w)
        if swiglu:
            _validate_swiglu(w8)
            return silu_mul_ref(y, out)
        return y if out is None else out.copy_(y)
    if swiglu:
        return fp8_linear_silu_mul_ref(x, w8, row_scale, out)
    return fp8_linear_ref(x, w8, row_scale, out=out)


def nvfp4_linear(x, packed, block_scale, row_scale, out=None, swiglu=False, **launch):
    """Small-M NVFP4-weight linear (W4A16; swiglu as fp8_linear): Triton on CUDA (M <= NVFP4_GEMV_MAX_M), else the
    torch reference."""
    if use_triton(x) and x.shape[0] <= NVFP4_GEMV_MAX_M:
        return nvfp4_linear_triton(x, packed, block_scale, row_scale, out, swiglu=swiglu, **launch)
    if swiglu:
        return nvfp4_linear_silu_mul_ref(x, packed, block_scale, row_scale, out)
    return nvfp4_linear_ref(x, packed, block_scale, row_scale, out)


def scaled_mm_ok(x8, w8, out_dtype) -> bool:
    """torch._scaled_mm's row-wise constraints (CUDA, sm_89+): K and N multiples of 16 (mat2 = w8.T is column-major),
    bf16 output (the only one row-wise scaling supports on sm_90 in every release we may meet)."""
    return (x8.is_cuda and torch.cuda.get_device_capability(x8.device) >= (8, 9) and out_dtype == torch.bfloat16
            and w8.shape[1] % 16 == 0 and w8.shape[0] % 16 == 0)


def fp8_matmul(x8, x_scale, w8, row_scale, out_dtype):
    """Prefill W8A8 GEMM of any M: (x8 @ w8.T) * x_scale[:, None] * row_scale[None, :] -> out_dtype.
    FP8 tensor cores through torch._scaled_mm (row-wise scales, cuBLAS/CUTLASS) where it applies, else the reference."""
    if scaled_mm_ok(x8, w8, out_dtype):
        return torch._scaled_mm(x8, w8.t(), scale_a=x_scale[:, None], scale_b=row_scale[None, :],
                                out_dtype=out_dtype)
    return fp8_linear_ref(x8, w8, row_scale, x_scale, out_dtype)


@triton.jit
def _dequant_nvfp4_kernel(w_ptr, bs_ptr, rs_ptr, out_ptr, N, K, swn, sbn, son,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr):
    """out [N, K] = e2m1(packed) * block_scale * row_scale, rounded once to out's dtype; program = a [BN, BK] tile.
    Tiles as in _quant_gemv_kernel; the low and high nibbles are joined back into K order for the store."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    GROUPS: tl.constexpr = BLOCK_K // 16
    offs_g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    mask_n = offs_n < N
    in_k = offs_g < K // 16
    rows = offs_n.to(tl.int64)[:, None]
    byte = offs_g[:, None] * 8 + tl.arange(0, 8)[None, :]
    b = tl.load(w_ptr + rows[:, :, None] * swn + byte[None, :, :], mask=mask_n[:, None, None] & in_k[None, :, None],
                other=0)
    s = tl.load(bs_ptr + rows * sbn + offs_g[None, :], mask=mask_n[:, None] & in_k[None, :], other=0.0)
    lo, hi = _nvfp4_tiles(b, s[:, :, None], ASM)
    rs = tl.load(rs_ptr + offs_n, mask=mask_n, other=0.0)[:, None, None, None]
    w = tl.join(lo.to(tl.float32), hi.to(tl.float32)) * rs  # [BN, GROUPS, 8, 2]: element 2j + nibble of a group
    w = tl.reshape(w, (BLOCK_N, BLOCK_K))
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rows * son + offs_k[None, :], cast_rtne(w, out_ptr.dtype.element_ty),
             mask=mask_n[:, None] & (offs_k < K)[None, :])


def dequant_nvfp4_triton(packed, block_scale, row_scale, dtype, out=None):
    """[N, K] weight of an NVFP4 tensor in `dtype` (the reference: dequant_nvfp4_ref, rounded once)."""
    _validate_nvfp4(torch.empty(0, packed.shape[1] * 2, dtype=dtype, device=packed.device), packed, block_scale,
                    row_scale)
    N, K = packed.shape[0], packed.shape[1] * 2
    y = output(out, (N, K), dtype, packed.device)
    block_n, block_k = 32, 256
    _dequant_nvfp4_kernel[(cdiv(N, block_n), cdiv(K, block_k))](
        packed, block_scale, row_scale, y, N, K, packed.stride(0), block_scale.stride(0), y.stride(0),
        BLOCK_N=block_n, BLOCK_K=block_k, ASM=asm_decode(y), num_warps=4)
    return y


def nvfp4_matmul(x, packed, block_scale, row_scale):
    """NVFP4-weight linear of any M (prefill): on CUDA the weight dequantized to x's dtype by one kernel, then cuBLAS
    (moves the bf16 weight twice more than a W4A16 tensor-core GEMM reading the packed one would, which is left out);
    elsewhere the reference."""
    if use_triton(x):
        return torch.nn.functional.linear(x, dequant_nvfp4_triton(packed, block_scale, row_scale, x.dtype))
    return nvfp4_linear_ref(x, packed, block_scale, row_scale)
