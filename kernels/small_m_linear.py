"""Small-M linear layer (decode GEMV): y = x @ weight.T for x [M, K] with M <= 16 and an nn.Linear weight [N, K].

At decode every projection is weight-bandwidth bound: the weight is read once per step, the M rows of x are tiny.
The kernel is therefore built around streaming the weight:
  * each program owns BLOCK_N output columns (weight rows) and walks its K range in BLOCK_K chunks; K is contiguous,
    so each thread loads 16-byte vectors along K;
  * the chunk of all M rows of x is loaded next to it (a few KB, L2-resident) and the partial products are
    accumulated in fp32;
  * tl.dot(w_chunk [BLOCK_N, BLOCK_K], x_chunk^T [BLOCK_K, 16]) with x padded to 16 rows ("swap AB": the weight
    tile is the MMA's M side, so BLOCK_N=64 fits Hopper's m64 shapes). Tensor-core work is wasted on the padding
    but is far below the memory time; what matters is that Triton software-pipelines the weight loads of a dot
    (num_stages), keeping several chunks in flight per program. (Plain FMAs into a register accumulator were slower
    at every decode shape, M = 1 included: docs/decisions.md.)
  * split-K (split_k > 1): programs [N tiles x K splits]. Every program writes its fp32 partial [M, BLOCK_N] to a
    workspace; the last program of a tile to finish (an atomic per-tile counter, release/acquire) sums the partials
    in fixed split order (deterministic), writes y and re-arms the counter to 0. (A second small kernel summing them
    instead, like cuBLAS's splitKreduce, was slower at the shapes that split.) kernels/quant_linear shares this
    reduction, the output epilogue and the PDL prologue.

Fused output epilogue:
  * linear_silu_mul: the weight is a fused [gate | up] projection [2N, K] and the output is silu(x @ gate.T) *
    (x @ up.T) [M, N] (the MLP's gate_up projection, with kernels/silu_mul folded in). A program's BLOCK_N-row weight
    tile holds BLOCK_N/2 gate rows and the BLOCK_N/2 up rows that pair with them, so loads and MMAs are those of the
    plain kernel and the SwiGLU runs once per output element, after the K loop (after the split-K reduction). Both
    sums are rounded to the dtype first, as the unfused gate_up output would be.
  No residual add + RMSNorm epilogue: normalising the rows needs one program to finish them all, and that serial pass
  costs more than the RMSNorm kernel it would replace.

No input prologues (SiLU-mul, RMSNorm, gated RMSNorm computed while loading x): the prologue math runs on the whole
MMA tile in every K step, mostly padding rows at decode sizes, and costs more than the kernels it removes. No early
PDL trigger either. docs/decisions.md has the timings behind each of these.

Default launch (default_launch): BLOCK_N=32, BLOCK_K = 256 bytes of a weight row (128 bf16), 4 warps, 4 stages;
no split of K when the N tiles alone give every SM a program, otherwise splits of MIN_CHUNKS_PER_SPLIT
BLOCK_K chunks. It depends on (N, K, dtype, SM count) only, never on M, so a row's result does not change with the
batch size. The rule is the winner of a sweep at the 4B decode shapes (bench/results/h200_small_m_linear.json): no
split with narrow tiles where N is large (gate_up, in_proj, lm_head), splits of ~8 chunks where it is small (down,
out_proj); splitting more than that loses to cuBLAS.

pdl=True (sm_90+): the kernel is launched with programmatic dependent launch. Its programs start while the kernel
before is still finishing, prefetch their first `prefetch_lines` 128-byte lines of each weight row into L2 (the
weights do not depend on that kernel), then wait for it (griddepcontrol.wait) before reading any input; each then
lets the next PDL launch start (kernels/_common.pdl_enter). In a chain of GEMVs (out_proj -> gate_up -> down -> the
next in_proj) this overlaps each one's ramp-up with the tail of the one before. Needs a GPU (the interpreter has no
inline PTX). With every decode kernel launched this way (the engine's default, DecodeTuning.pdl) it took
0.08-0.10 ms off a 4B decode step at b1 and b8 (h200_decode_pdl.json).

CUDA graphs: no host syncs and allocation from shapes only. Split-K needs a workspace (fp32 partials + int32
counters that must start at 0; the kernel leaves them at 0 again). Without one, each call allocates partials and
zeroes counters (an extra memset kernel); callers that care (the engine, graphs) pass a preallocated
`small_m_linear_workspace(...)`, one per stream: two launches that may overlap must not share a workspace.
The engine uses it for every decode-time projection with M <= 16 rows (engine/models/layers.DecodeProjections).
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._common import (
    cast_rtne, cdiv, check, next_pow2, output, pdl_enter, pdl_launch, require_last_dim_contiguous, sm_count, use_triton)
from kernels.silu_mul import silu_mul_ref

MAX_M = 16
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MIN_CHUNKS_PER_SPLIT = 8  # a split reads at least this many BLOCK_K chunks (fewer: the reduction costs more)
MAX_SPLIT_K = 32


class SplitKWorkspace(NamedTuple):
    partials: torch.Tensor  # fp32, >= split_k * M * N elements
    counters: torch.Tensor  # int32, >= cdiv(N, block_n) elements, all 0 between launches


def small_m_linear_workspace(N, device, max_m=MAX_M, max_split_k=MAX_SPLIT_K, min_block_n=16) -> SplitKWorkspace:
    """A workspace valid for any launch with M <= max_m, split_k <= max_split_k, block_n >= min_block_n."""
    return SplitKWorkspace(torch.empty(max_split_k * max_m * N, dtype=torch.float32, device=device),
                           torch.zeros(cdiv(N, min_block_n), dtype=torch.int32, device=device))


def workspace_checked(workspace: SplitKWorkspace | None, n_parts: int, n_tiles: int, device) -> SplitKWorkspace:
    """The split-K workspace of a launch with n_parts partials and n_tiles counters: `workspace` once checked, or a
    fresh one (its counters zeroed: an extra memset kernel, which callers that care avoid by passing one)."""
    if workspace is None:
        return SplitKWorkspace(torch.empty(n_parts, dtype=torch.float32, device=device),
                               torch.zeros(n_tiles, dtype=torch.int32, device=device))
    parts, counters = workspace
    check(parts.dtype == torch.float32 and parts.is_contiguous() and parts.numel() >= n_parts,
          f"workspace.partials must be contiguous fp32 with >= {n_parts} elements, got {parts.dtype} {parts.numel()}")
    check(counters.dtype == torch.int32 and counters.numel() >= n_tiles,
          f"workspace.counters must be int32 with >= {n_tiles} elements, got {counters.dtype} {counters.numel()}")
    check(parts.device == device and counters.device == device, "workspace must be on x's device")
    return workspace


def _validate(x, weight):
    check(x.dim() == 2, f"x must be [M, K], got shape {tuple(x.shape)}")
    check(weight.dim() == 2, f"weight must be [N, K] (nn.Linear layout), got shape {tuple(weight.shape)}")
    check(x.shape[1] == weight.shape[1], f"x is [M, {x.shape[1]}] but weight is [N, K={weight.shape[1]}]")
    check(x.shape[0] <= MAX_M, f"small_m_linear handles M <= {MAX_M} rows, got M={x.shape[0]}")
    check(x.dtype in DTYPES, f"x dtype must be one of {DTYPES}, got {x.dtype}")
    check(weight.dtype == x.dtype, f"weight dtype {weight.dtype} != x dtype {x.dtype}")
    check(weight.device == x.device, f"x on {x.device} but weight on {weight.device}")


def small_m_linear_ref(x, weight, out=None):
    """F.linear in fp32, rounded once to x.dtype."""
    _validate(x, weight)
    y = output(out, (x.shape[0], weight.shape[0]), x.dtype, x.device)
    y.copy_(torch.nn.functional.linear(x.float(), weight.float()))
    return y


def _validate_swiglu(x, weight):
    _validate(x, weight)
    check(weight.shape[0] % 2 == 0, f"weight must be a fused [gate | up] [2N, K], got {weight.shape[0]} rows (odd)")


def linear_silu_mul_ref(x, weight, out=None):
    """The fp32 linear rounded to the dtype (the gate_up projection), then kernels/silu_mul."""
    _validate_swiglu(x, weight)
    return silu_mul_ref(small_m_linear_ref(x, weight), out)


def pick_split_k(N, K, block_n, block_k, num_sms) -> int:
    """1 when the N tiles give every SM a program; otherwise as many splits as K has MIN_CHUNKS_PER_SPLIT chunks."""
    if cdiv(N, block_n) >= num_sms:
        return 1
    return max(1, min(MAX_SPLIT_K, cdiv(K, block_k) // MIN_CHUNKS_PER_SPLIT))


def split_ranges(K, block_k, split_k):
    """(K elements per split, a multiple of block_k; effective number of splits, none empty, possibly < split_k)."""
    chunks = cdiv(K, block_k)
    k_per_split = cdiv(chunks, min(split_k, chunks)) * block_k
    return k_per_split, cdiv(K, k_per_split)


def default_launch(N, K, dtype, device) -> dict:
    """The launch options used when none are given (see the module docstring). Independent of M on purpose."""
    block_n, block_k = 32, 256 // dtype.itemsize
    return dict(block_n=block_n, block_k=block_k, split_k=pick_split_k(N, K, block_n, block_k, sm_count(device)),
                num_warps=4, num_stages=4)


def workspace_size(N: int, K: int, dtype, device, max_m: int = MAX_M) -> tuple[int, int]:
    """(fp32 partials, int32 counters) that a default launch of up to max_m rows on an [N, K] weight needs in its
    SplitKWorkspace; (0, 0) where it does not split (kernels/quant_linear.quant_workspace_size: the same for
    quantized weights)."""
    d = default_launch(N, K, dtype, device)
    S = split_ranges(K, d["block_k"], d["split_k"])[1]
    return (S * max_m * N, cdiv(N, d["block_n"])) if S > 1 else (0, 0)


@triton.jit(do_not_specialize=["M"])  # M=1 and M=8 share one binary (the JIT would specialise M == 1)
def _small_m_linear_kernel(
    x_ptr, w_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, K_PER_SPLIT,
    sxm, swn, som,
    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
    PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr, SWIGLU: tl.constexpr,
):
    """SPLIT: False = one program per N tile writes y; True = split-K, the last program of a tile reduces. SWIGLU: N is the number of output columns and the weight has 2N rows
    [gate | up]; tile row r < BLOCK_N/2 is gate row j, the others up row N + j (j = the output column)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n, mask_n, W_ROWS = _tile_rows(pid_n, N, BLOCK_N, SWIGLU)
    offs_m = tl.arange(0, M_PAD)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)

    if PDL:  # launched early, while the kernel before finishes (programmatic dependent launch, sm_90+)
        _prefetch_weight_lines(w_ptr, offs_n, W_ROWS, swn, k_lo, k_hi, PREFETCH_LINES)
        pdl_enter(PDL)  # the inputs (and the split-K workspace) are the kernel before's to finish

    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * swn + (k_lo + offs_k)[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * sxm + (k_lo + offs_k)[None, :]
    acc = tl.zeros((BLOCK_N, M_PAD), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:  # K_PER_SPLIT and K are multiples of BLOCK_K: no mask along K, the loads stay vectorised
            w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
            xk = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        else:  # chunks never straddle a split boundary (K_PER_SPLIT % BLOCK_K == 0), only the end of K
            mask_k = (k + offs_k) < K
            w = tl.load(w_ptrs, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            xk = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        if UPCAST_DOT:  # the CPU interpreter multiplies bf16 tiles as raw integers: feed it fp32
            w = w.to(tl.float32)
            xk = xk.to(tl.float32)
        acc = tl.dot(w, tl.trans(xk), acc, input_precision=DOT_PRECISION)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    res = tl.trans(acc)  # [M_PAD, BLOCK_N]

    _finish_tile(res, out_ptr, part_ptr, count_ptr, pid_n, pid_k, tl.num_programs(1), offs_m, offs_n, mask_m, mask_n,
                 M, N, W_ROWS, pid_n, som, BLOCK_N, SPLIT, SWIGLU)


@triton.jit
def _tile_rows(pid_n, N, BLOCK_N: tl.constexpr, SWIGLU: tl.constexpr):
    """(weight rows of N tile pid_n, their mask, the weight's rows). SWIGLU: N output columns of a [gate | up] weight
    of 2N rows; tile row r < BLOCK_N/2 is gate row j, the others up row N + j (j = the output column)."""
    if SWIGLU:
        HALF: tl.constexpr = BLOCK_N // 2
        r = tl.arange(0, BLOCK_N)
        out_cols = pid_n * HALF + r % HALF
        offs_n = tl.where(r < HALF, out_cols, N + out_cols)  # weight rows (and split-K partial columns, 2N wide)
        return offs_n, out_cols < N, 2 * N
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_n, offs_n < N, N


@triton.jit
def _prefetch_weight_lines(w_ptr, offs_n, W_ROWS, swn, col_lo, col_hi, PREFETCH_LINES: tl.constexpr):
    """Pull the first PREFETCH_LINES 128-byte lines of weight rows offs_n (columns col_lo .. col_hi of the stored
    tensor) into L2: a PDL-launched GEMV does it before waiting for the kernel before, whose outputs the weights do
    not depend on."""
    line = 128 // w_ptr.dtype.element_ty.primitive_bitwidth * 8
    cols = tl.minimum(col_lo + tl.arange(0, PREFETCH_LINES) * line, col_hi - 1)
    rows = tl.minimum(offs_n, W_ROWS - 1).to(tl.int64)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                              [w_ptr + rows[:, None] * swn + cols[None, :]], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _finish_tile(res, out_ptr, part_ptr, count_ptr, tile, pid_k, S, offs_m, offs_n, mask_m, mask_n, M, N, W_ROWS,
                 pid_n, som, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, SWIGLU: tl.constexpr):
    """A program's fp32 sums res [M_PAD, BLOCK_N] (weight rows offs_n) to the output: stored (_store_output), or
    (SPLIT, this program summed split pid_k of S) stored as a partial [S, M, W_ROWS] fp32 in part_ptr, and the last
    program of the tile to finish (count_ptr[tile]) adds all S in split order, stores and re-arms the counter."""
    if SPLIT:
        M_PAD: tl.constexpr = res.shape[0]
        mask = mask_m[:, None] & mask_n[None, :]
        p_ptrs = part_ptr + offs_m[:, None] * W_ROWS + offs_n[None, :]
        tl.store(p_ptrs + pid_k * M * W_ROWS, res, mask=mask)
        # All of this program's partial stores happen before the counter increment (barrier, then a release
        # atomic); the program that sees count == S-1 acquires them all and reduces in split order.
        tl.debug_barrier()
        count = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if count == S - 1:
            total = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
            for s in range(S):  # .cg: read L2, where the other SMs' stores are, never a stale L1 line
                total += tl.load(p_ptrs + s * M * W_ROWS, mask=mask, other=0.0, cache_modifier=".cg")
            _store_output(out_ptr, total, offs_m, offs_n, mask_m, pid_n, N, som, BLOCK_N, SWIGLU)
            tl.store(count_ptr + tile, 0)  # re-arm for the next launch (kernel boundaries order it)
    else:
        _store_output(out_ptr, res, offs_m, offs_n, mask_m, pid_n, N, som, BLOCK_N, SWIGLU)


@triton.jit
def _store_output(out_ptr, res, offs_m, offs_n, mask_m, pid_n, N, som, BLOCK_N: tl.constexpr, SWIGLU: tl.constexpr):
    """Write a tile's finished fp32 sums [M_PAD, BLOCK_N]: as they are, or (SWIGLU) as silu(gate) * up of its gate
    and up halves, each rounded to the dtype first (the unfused path stores gate_up, then kernels/silu_mul reads it)."""
    dtype = out_ptr.dtype.element_ty
    if SWIGLU:
        HALF: tl.constexpr = BLOCK_N // 2
        M_PAD: tl.constexpr = res.shape[0]
        gate, up = tl.split(tl.permute(tl.reshape(res, (M_PAD, 2, HALF)), (0, 2, 1)))
        gate = cast_rtne(gate, dtype).to(tl.float32)
        up = cast_rtne(up, dtype).to(tl.float32)
        cols = pid_n * HALF + tl.arange(0, HALF)
        tl.store(out_ptr + offs_m[:, None] * som + cols[None, :], cast_rtne(gate * tl.sigmoid(gate) * up, dtype),
                 mask=mask_m[:, None] & (cols < N)[None, :])
    else:
        tl.store(out_ptr + offs_m[:, None] * som + offs_n[None, :], cast_rtne(res, dtype),
                 mask=mask_m[:, None] & (offs_n < N)[None, :])


def small_m_linear_triton(x, weight, out=None, **launch):
    """Launch options (default_launch's values where None): block_n, block_k, split_k (rounded to whole BLOCK_K
    chunks per split: the effective number of splits may be lower), num_warps, num_stages; workspace: a
    SplitKWorkspace, used when split_k > 1."""
    _validate(x, weight)
    return _launch(x, weight, out, **launch)


def linear_silu_mul_triton(x, weight, out=None, **launch):
    """Launch options as small_m_linear_triton; block_n counts weight rows (half gate, half up)."""
    _validate_swiglu(x, weight)
    return _launch(x, weight, out, swiglu=True, **launch)


def _launch(x, weight, out, block_n=None, block_k=None, split_k=None, num_warps=None, num_stages=None, workspace=None,
            pdl=False, prefetch_lines=8, swiglu=False):
    require_last_dim_contiguous("x", x)
    require_last_dim_contiguous("weight", weight)
    M = x.shape[0]
    W_ROWS, K = weight.shape
    N = W_ROWS // 2 if swiglu else W_ROWS  # output columns
    y = output(out, (M, N), x.dtype, x.device)
    require_last_dim_contiguous("out", y)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.zero_()
    d = default_launch(W_ROWS, K, x.dtype, x.device)
    BLOCK_N = block_n or d["block_n"]
    BLOCK_K = block_k or d["block_k"]
    check(BLOCK_N >= 16 and BLOCK_N == next_pow2(BLOCK_N), f"block_n must be a power of two >= 16, got {BLOCK_N}")
    check(BLOCK_K >= 16 and BLOCK_K == next_pow2(BLOCK_K), f"block_k must be a power of two >= 16, got {BLOCK_K}")
    pdl_args = pdl_launch(pdl)
    check(prefetch_lines >= 1 and prefetch_lines == next_pow2(prefetch_lines),
          f"prefetch_lines must be a power of two, got {prefetch_lines}")
    n_tiles = cdiv(W_ROWS, BLOCK_N)  # with swiglu: cdiv(N, BLOCK_N // 2), the same number
    split = pick_split_k(W_ROWS, K, BLOCK_N, BLOCK_K, sm_count(x.device)) if split_k is None else split_k
    check(isinstance(split, int) and 1 <= split <= MAX_SPLIT_K,
          f"split_k must be an int in [1, {MAX_SPLIT_K}], got {split!r}")
    k_per_split, S = split_ranges(K, BLOCK_K, split)
    if S > 1:
        parts, counters = workspace_checked(workspace, S * M * W_ROWS, n_tiles, x.device)
    else:
        parts, counters = y, y  # unused
    _small_m_linear_kernel[(n_tiles, S)](
        x, weight, y, parts, counters, M, N, K, k_per_split, x.stride(0), weight.stride(0), y.stride(0),
        M_PAD=max(16, next_pow2(M)), BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, EVEN_K=K % BLOCK_K == 0, SPLIT=S > 1,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", UPCAST_DOT=not x.is_cuda,
        PREFETCH_LINES=prefetch_lines, SWIGLU=bool(swiglu), num_warps=num_warps or d["num_warps"],
        num_stages=num_stages or d["num_stages"], **pdl_args,
    )
    return y


def small_m_linear(x, weight, out=None, **launch):
    """x @ weight.T -> [M, N] in x.dtype (written to `out` if given); x [M <= 16, K], weight [N, K] of x's dtype.
    `launch` (Triton only): block_n, block_k, split_k, num_warps, num_stages, workspace."""
    if use_triton(x):
        return small_m_linear_triton(x, weight, out, **launch)
    return small_m_linear_ref(x, weight, out)


def linear_silu_mul(x, weight, out=None, **launch):
    """silu(x @ gate.T) * (x @ up.T) -> [M, N] for x [M <= 16, K] and a fused weight [gate | up] [2N, K]; `launch` as
    small_m_linear."""
    if use_triton(x):
        return linear_silu_mul_triton(x, weight, out, **launch)
    return linear_silu_mul_ref(x, weight, out)

