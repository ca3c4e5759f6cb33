"""Compile every Triton kernel for sm_90 (H200) on a machine without a GPU, using the ptxas that ships with Triton.

The interpreter runs kernels as numpy and so cannot catch errors that only the GPU compiler raises (layouts, dot
shapes, type rules) nor show register pressure. This records the launches the real launchers make at the 4B model's
decode shapes (on small CPU tensors: only dtypes, head sizes and launch heuristics matter for code generation),
compiles each one to a cubin and reports registers, spills and shared memory from `ptxas -v`.

    python -m kernels.compile_check            # must run WITHOUT TRITON_INTERPRET=1
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import torch

TYPE_CODES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
              torch.int64: "i64", torch.uint8: "u8", torch.float8_e4m3fn: "fp8e4nv"}


class LaunchRecorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kwargs)` records the call instead of running it."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))


@contextmanager
def recording(module):
    """Replace every @triton.jit kernel of `module` by a LaunchRecorder for the duration of the block."""
    from triton.runtime.jit import JITFunction

    kernels = {name: obj for name, obj in vars(module).items() if isinstance(obj, JITFunction) and name.endswith("_kernel")}
    recorders = {name: LaunchRecorder(k) for name, k in kernels.items()}
    for name, rec in recorders.items():
        setattr(module, name, rec)
    try:
        yield list(recorders.values())
    finally:
        for name, k in kernels.items():
            setattr(module, name, k)


def _signature(kernel, args, kwargs):
    names = kernel.arg_names
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(kernel.params):
        value = bound[param.name]
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            # recorded on CPU tensors, the launchers ask for the interpreter's fp32 dot operands: compile the GPU code
            constexprs[param.name] = False if param.name == "UPCAST_DOT" else value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + TYPE_CODES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # real allocations are 16-byte aligned; lets loads vectorise
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
            if value % 16 == 0 and value != 0:  # as the JIT specialises: strides/sizes known multiples of 16
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(f"{kernel.__name__}: cannot type argument {param.name}={value!r}")
    options = {k: kwargs[k] for k in ("num_warps", "num_stages", "launch_pdl") if k in kwargs}
    return signature, constexprs, attrs, options


def _ptxas_report(ptx: str) -> dict:
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run([ptxas, "-arch=sm_90a", "-v", "-o", os.path.join(tmp, "k.cubin"), path],
                             capture_output=True, text=True)
    text = res.stdout + res.stderr
    num = lambda pattern: int(m.group(1)) if (m := re.search(pattern, text)) else None  # noqa: E731
    return {"regs": num(r"Used (\d+) registers"), "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads")}


def compile_recorded(name, recorder):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rows = []
    for grid, args, kwargs in recorder.launches:
        signature, constexprs, attrs, options = _signature(recorder.kernel, args, kwargs)
        t0 = time.time()
        compiled = triton.compile(ASTSource(recorder.kernel, signature, constexprs, attrs),
                                  target=GPUTarget("cuda", 90, 32), options=options)
        row = {"case": name, "kernel": recorder.kernel.__name__, "grid": tuple(grid), **options,
               "compile_s": round(time.time() - t0, 2), **_ptxas_report(compiled.asm["ptx"]),
               "smem": compiled.metadata.shared,  # dynamic shared memory (ptxas only sees static)
               "griddepcontrol": "griddepcontrol.wait" in compiled.asm["ptx"]}  # programmatic dependent launch
        rows.append(row)
    return rows


def decode_cases(batch_sizes=(1, 64)):
    """(name, module, thunk calling the launcher) at the 4B model's decode shapes."""
    from kernels import (
        conv1d_update, copy_rows, fp8_quant, fused_attn_decode, gated_rmsnorm, gdn_recurrent, gdn_verify,
        paged_attention, quant_linear, rmsnorm, silu_mul, small_m_linear)

    bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32
    Hk, Hv, dk, dv, C, K, Hq, Hkv, D, hidden, inter = 16, 32, 128, 128, 8192, 4, 16, 4, 256, 2560, 9216
    cases = []
    for dtype in (f32, bf16):  # beam search's cache copy: fp32 GDN state rows, bf16 conv state and KV blocks
        cases.append((f"copy_rows {TYPE_CODES[dtype]}", copy_rows,
                      lambda dtype=dtype: copy_rows.copy_rows_triton(torch.empty(2, 3, Hv, dk, dv, dtype=dtype),
                                                                     torch.zeros(2, dtype=torch.int64),
                                                                     torch.ones(2, dtype=torch.int64))))
    for B in batch_sizes:
        idx = torch.zeros(B, dtype=i32)
        for T in (1, 4):
            cases.append((f"gdn_recurrent B={B} T={T}", gdn_recurrent,
                          lambda B=B, T=T, idx=idx: gdn_recurrent.gdn_recurrent_triton(
                              torch.empty(B, T, Hk, dk, dtype=bf16), torch.empty(B, T, Hk, dk, dtype=bf16),
                              torch.empty(B, T, Hv, dv, dtype=bf16), torch.empty(B, T, Hv, dtype=f32),
                              torch.empty(B, T, Hv, dtype=bf16), torch.empty(1, Hv, dk, dv, dtype=f32), idx)))
        ba = torch.empty(B, 2 * Hv, dtype=bf16)  # the engine's decode call: raw gates, strided views of [b | a]
        cases.append((f"gdn_recurrent B={B} raw gates", gdn_recurrent,
                      lambda B=B, idx=idx, ba=ba: gdn_recurrent.gdn_recurrent_triton(
                          torch.empty(B, 1, Hk, dk, dtype=bf16), torch.empty(B, 1, Hk, dk, dtype=bf16),
                          torch.empty(B, 1, Hv, dv, dtype=bf16), ba[:, None, Hv:], ba[:, None, :Hv],
                          torch.empty(1, Hv, dk, dv, dtype=f32), idx,
                          raw_gates=(torch.empty(Hv, dtype=f32), torch.empty(Hv, dtype=f32)))))
        cases.append((f"conv1d_update B={B}", conv1d_update,
                      lambda B=B, idx=idx: conv1d_update.causal_conv1d_update_triton(
                          torch.empty(B, C, dtype=bf16), torch.empty(1, C, K - 1, dtype=bf16),
                          torch.empty(C, K, dtype=bf16), idx)))
        cases.append((f"paged_decode_attention B={B} ctx<=4096", paged_attention,
                      lambda B=B: paged_attention.paged_decode_attention_triton(
                          torch.empty(B, Hq, D, dtype=bf16), torch.empty(2, 16, Hkv, D, dtype=bf16),
                          torch.empty(2, 16, Hkv, D, dtype=bf16), torch.zeros(B, 256, dtype=i32),
                          torch.empty(B, dtype=i32), D ** -0.5)))
        cases.append((f"store_kvcache N={B}", paged_attention,
                      lambda B=B: paged_attention.store_kvcache_triton(
                          torch.empty(B, Hkv, D, dtype=bf16), torch.empty(B, Hkv, D, dtype=bf16),
                          torch.empty(2, 16, Hkv, D, dtype=bf16), torch.empty(2, 16, Hkv, D, dtype=bf16),
                          torch.zeros(B, dtype=torch.int64))))
        cases.append((f"gated_rmsnorm N={B}", gated_rmsnorm,
                      lambda B=B: gated_rmsnorm.gated_rmsnorm_triton(
                          torch.empty(B, Hv, dv, dtype=bf16), torch.empty(B, Hv, dv, dtype=bf16),
                          torch.empty(dv, dtype=bf16), 1e-6)))
        cases.append((f"rmsnorm+residual N={B}", rmsnorm,
                      lambda B=B: rmsnorm.rmsnorm_triton(torch.empty(B, hidden, dtype=bf16), torch.empty(hidden, dtype=bf16),
                                                         1e-6, residual=torch.empty(B, hidden, dtype=bf16))))
        for launch in ({}, dict(pdl=True)):  # the attention layers' fused inputs (q/k norm, rotary, KV store)
            cases.append((f"fused_attn_decode_inputs N={B}" + (" pdl" if launch else ""), fused_attn_decode,
                          lambda B=B, launch=launch: fused_attn_decode.fused_attn_decode_inputs_triton(
                              torch.empty(B, (2 * Hq + 2 * Hkv) * D, dtype=bf16), torch.empty(D, dtype=bf16),
                              torch.empty(D, dtype=bf16), torch.empty(B, 64, dtype=bf16),
                              torch.empty(B, 64, dtype=bf16), 1e-6, Hq, Hkv, D, torch.empty(2, 16, Hkv, D, dtype=bf16),
                              torch.empty(2, 16, Hkv, D, dtype=bf16), torch.zeros(B, dtype=torch.int64), **launch)))
        cases.append((f"silu_mul N={B}", silu_mul,
                      lambda B=B: silu_mul.silu_mul_triton(torch.empty(B, 2 * inter, dtype=bf16))))
        if B <= small_m_linear.MAX_M:  # decode projections (N, K): gate_up, GDN in_proj, down, GDN out_proj, lm_head
            for N, K_in in ((2 * inter, hidden), (12352, hidden), (hidden, inter), (hidden, 4096), (248320, hidden)):
                cases.append((f"small_m_linear M={B} {N}x{K_in}", small_m_linear,
                              lambda B=B, N=N, K_in=K_in: small_m_linear.small_m_linear_triton(
                                  torch.empty(B, K_in, dtype=bf16), torch.empty(N, K_in, dtype=bf16))))
            cases.append((f"linear_silu_mul M={B}", small_m_linear,  # the SwiGLU epilogue on gate_up
                          lambda B=B: small_m_linear.linear_silu_mul_triton(
                              torch.empty(B, hidden, dtype=bf16), torch.empty(2 * inter, hidden, dtype=bf16))))
            cases.append((f"linear_silu_mul M={B} split", small_m_linear,  # ... with the in-kernel split-K reduction
                          lambda B=B: small_m_linear.linear_silu_mul_triton(
                              torch.empty(B, hidden, dtype=bf16), torch.empty(512, hidden, dtype=bf16))))
            # programmatic dependent launch (engine/options.DecodeTuning.pdl) for every kernel of the decode step
            pdl = dict(pdl=True)
            cases += [
                (f"rmsnorm+residual N={B} pdl", rmsnorm, lambda B=B: rmsnorm.rmsnorm_triton(
                    torch.empty(B, hidden, dtype=bf16), torch.empty(hidden, dtype=bf16), 1e-6,
                    residual=torch.empty(B, hidden, dtype=bf16), **pdl)),
                (f"gated_rmsnorm N={B} pdl", gated_rmsnorm, lambda B=B: gated_rmsnorm.gated_rmsnorm_triton(
                    torch.empty(B, Hv, dv, dtype=bf16), torch.empty(B, Hv, dv, dtype=bf16), torch.empty(dv, dtype=bf16),
                    1e-6, **pdl)),
                (f"conv1d_update B={B} pdl", conv1d_update,
                 lambda B=B, idx=idx: conv1d_update.causal_conv1d_update_triton(
                     torch.empty(B, C, dtype=bf16), torch.empty(1, C, K - 1, dtype=bf16), torch.empty(C, K, dtype=bf16),
                     idx, **pdl)),
                (f"gdn_recurrent B={B} raw gates pdl", gdn_recurrent,
                 lambda B=B, idx=idx, ba=ba: gdn_recurrent.gdn_recurrent_triton(
                     torch.empty(B, 1, Hk, dk, dtype=bf16), torch.empty(B, 1, Hk, dk, dtype=bf16),
                     torch.empty(B, 1, Hv, dv, dtype=bf16), ba[:, None, Hv:], ba[:, None, :Hv],
                     torch.empty(1, Hv, dk, dv, dtype=f32), idx,
                     raw_gates=(torch.empty(Hv, dtype=f32), torch.empty(Hv, dtype=f32)), **pdl)),
                (f"paged_decode_attention B={B} ctx<=4096 pdl", paged_attention,
                 lambda B=B: paged_attention.paged_decode_attention_triton(
                     torch.empty(B, Hq, D, dtype=bf16), torch.empty(2, 16, Hkv, D, dtype=bf16),
                     torch.empty(2, 16, Hkv, D, dtype=bf16), torch.zeros(B, 256, dtype=i32),
                     torch.empty(B, dtype=i32), D ** -0.5, **pdl)),
                (f"small_m_linear M={B} pdl", small_m_linear, lambda B=B: small_m_linear.small_m_linear_triton(
                    torch.empty(B, inter, dtype=bf16), torch.empty(hidden, inter, dtype=bf16), **pdl)),
                (f"linear_silu_mul M={B} pdl", small_m_linear, lambda B=B: small_m_linear.linear_silu_mul_triton(
                    torch.empty(B, hidden, dtype=bf16), torch.empty(2 * inter, hidden, dtype=bf16), **pdl)),
            ]
    cases += quant_cases(batch_sizes, fp8_quant, quant_linear)
    cases += verify_cases(gdn_verify) + block_attention_cases(paged_attention)
    return cases


def block_attention_cases(paged_attention, configs=((None, None), (64, 8))):
    """Speculative verify's attention at the 4B shape: 32 sequences x 16 rows attending through the paged cache,
    each sequence's (row, head) pairs in tiles per program (rows_per_seq): the default launch (tiles of 32 at 8
    warps) and tiles of 64 at 8 warps (the one other without spills: at 4 warps a 32-pair tile takes 252 registers
    and a 64-pair one spills)."""
    bf16, i32 = torch.bfloat16, torch.int32
    S, T, Hq, Hkv, D = 32, 16, 16, 4, 256
    return [(f"block attention {S}x{T} tile {m or 'default'} w{w or 'default'}", paged_attention,
             lambda m=m, w=w: paged_attention.paged_decode_attention_triton(
                 torch.empty(S * T, Hq, D, dtype=bf16), torch.empty(2, 16, Hkv, D, dtype=bf16),
                 torch.empty(2, 16, Hkv, D, dtype=bf16), torch.zeros(S * T, 256, dtype=i32),
                 torch.empty(S * T, dtype=i32), D ** -0.5, rows_per_seq=T, max_tile_rows=m, num_warps=w))
            for m, w in configs]


def verify_cases(gdn_verify):
    """Speculative decoding's GDN verify with its ring of pending updates, the ring's advance and fold, and conv
    verify / commit (kernels/gdn_verify.py) at the 4B shape: 32 sequences x a block of 16, a ring of 2 blocks, raw
    gates as the engine passes them."""
    bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32
    B, T, Hk, Hv, dk, dv, P = 32, 16, 16, 32, 128, 128, 32
    C, K = 2 * Hk * dk + Hv * dv, 4  # the conv's channels: q, k and v
    idx = torch.zeros(B, dtype=i32)
    raw = (torch.empty(Hv, dtype=f32), torch.empty(Hv, dtype=f32))

    def ring():
        return (torch.empty(1, P, Hk, dk, dtype=f32), torch.empty(1, P, Hv, dv, dtype=f32),
                torch.empty(1, P, Hv, dtype=f32), torch.zeros(1, 2, dtype=i32))

    def verify_args():
        qk = (torch.empty(B, T, Hk, dk, dtype=bf16), torch.empty(B, T, Hk, dk, dtype=bf16))
        gates = (torch.empty(B, T, Hv, dtype=bf16), torch.empty(B, T, Hv, dtype=bf16))
        return (*qk, torch.empty(B, T, Hv, dv, dtype=bf16), *gates, torch.empty(1, Hv, dk, dv, dtype=f32), idx,
                ring())

    return [(f"gdn_verify B={B} T={T} raw gates", gdn_verify,
             lambda: gdn_verify.gdn_verify_triton(*verify_args(), raw_gates=raw)),
            (f"gdn_fold B={B} P={P}", gdn_verify,
             lambda: gdn_verify.gdn_fold_triton(torch.empty(1, Hv, dk, dv, dtype=f32), idx, ring())),
            (f"gdn ring advance B={B}", gdn_verify,
             lambda: gdn_verify.gdn_ring_advance_triton(torch.zeros(1, 2, dtype=i32), idx,
                                                        torch.zeros(B, dtype=torch.int64), 0, P)),
            (f"conv verify B={B} T={T} C={C}", gdn_verify,
             lambda: gdn_verify.causal_conv1d_verify_triton(torch.empty(B, T, C, dtype=bf16),
                                                            torch.empty(1, C, K - 1, dtype=bf16),
                                                            torch.empty(C, K, dtype=bf16), idx,
                                                            keep=torch.empty(B, T, C, dtype=bf16))),
            (f"conv commit B={B} T={T} C={C}", gdn_verify,
             lambda: gdn_verify.conv_state_commit_triton(torch.empty(B, T, C, dtype=bf16),
                                                         torch.empty(1, C, K - 1, dtype=bf16), idx,
                                                         torch.zeros(B, dtype=torch.int64)))]


def gpu_decode(quant_linear, launch):
    """Run `launch` as on an sm_90 GPU: the NVFP4 kernels then take their inline-assembly decode (_E2M1_ASM)."""
    from unittest import mock

    with mock.patch.object(quant_linear, "asm_decode", lambda x: True):
        return launch()


def quant_cases(batch_sizes, fp8_quant, quant_linear):
    """The quantized decode path (docs/quantization.md): FP8 / NVFP4 GEMVs at the 4B projection shapes, the
    per-token FP8 activation quantizers."""
    bf16, f32, fp8, u8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.uint8
    hidden, inter = 2560, 9216
    cases = []
    for B in batch_sizes:
        cases += [(f"quant_fp8_per_token N={B}", fp8_quant,
                   lambda B=B: fp8_quant.quant_fp8_per_token_triton(torch.empty(B, hidden, dtype=bf16))),
                  (f"rmsnorm_quant_fp8+residual N={B}", fp8_quant,
                   lambda B=B: fp8_quant.rmsnorm_quant_fp8_triton(torch.empty(B, hidden, dtype=bf16),
                                                                  torch.empty(hidden, dtype=bf16), 1e-6,
                                                                  residual=torch.empty(B, hidden, dtype=bf16))),
                  (f"silu_mul_quant_fp8 N={B}", fp8_quant,
                   lambda B=B: fp8_quant.silu_mul_quant_fp8_triton(torch.empty(B, 2 * inter, dtype=bf16)))]
        if B > quant_linear.NVFP4_GEMV_MAX_M:
            continue
        for N, K_in in ((2 * inter, hidden), (12352, hidden), (hidden, inter), (hidden, 4096)):
            cases += [(f"fp8_linear W8A16 M={B} {N}x{K_in}", quant_linear,
                       lambda B=B, N=N, K_in=K_in: quant_linear.fp8_linear_triton(
                           torch.empty(B, K_in, dtype=bf16), torch.empty(N, K_in, dtype=fp8),
                           torch.empty(N, dtype=f32)))] if B <= quant_linear.FP8_GEMV_MAX_M else []
            cases += [(f"nvfp4_linear M={B} {N}x{K_in}", quant_linear,
                       lambda B=B, N=N, K_in=K_in: gpu_decode(quant_linear, lambda: quant_linear.nvfp4_linear_triton(
                           torch.empty(B, K_in, dtype=bf16), torch.empty(N, K_in // 2, dtype=u8),
                           torch.empty(N, K_in // 16, dtype=fp8), torch.empty(N, dtype=f32))))]
        if B <= quant_linear.NVFP4_GEMV_MAX_M:  # what the engine launches: gate_up with the SwiGLU epilogue, and
            # every projection with PDL (down_proj split along K, so its in-kernel reduction too)
            fp8_w = lambda N, K_in: (torch.empty(N, K_in, dtype=fp8), torch.empty(N, dtype=f32))  # noqa: E731
            nv_w = lambda N, K_in: (torch.empty(N, K_in // 2, dtype=u8), torch.empty(N, K_in // 16, dtype=fp8),  # noqa: E731
                                    torch.empty(N, dtype=f32))
            for fmt, run, weight in (("fp8", quant_linear.fp8_linear_triton, fp8_w),
                                     ("nvfp4", quant_linear.nvfp4_linear_triton, nv_w)):
                launches = [("silu_mul", 2 * inter, hidden, dict(swiglu=True)),
                            ("silu_mul pdl", 2 * inter, hidden, dict(swiglu=True, pdl=True)),
                            ("down pdl", hidden, inter, dict(pdl=True))]
                if fmt == "fp8":  # the bit-level E4M3 decode the sweep times (fp8_asm)
                    launches.append(("fp8_asm", 2 * inter, hidden, dict(fp8_asm=True)))
                for name, N, K_in, launch in launches:
                    cases.append((f"{fmt}_linear M={B} {name}", quant_linear,
                                  lambda B=B, N=N, K_in=K_in, run=run, weight=weight, launch=launch: gpu_decode(
                                      quant_linear, lambda: run(torch.empty(B, K_in, dtype=bf16), *weight(N, K_in),
                                                                **launch))))
    cases.append(("dequant_nvfp4 bf16", quant_linear, lambda: gpu_decode(quant_linear, lambda: (
        quant_linear.dequant_nvfp4_triton(torch.empty(2 * inter, hidden // 2, dtype=u8),
                                          torch.empty(2 * inter, hidden // 16, dtype=fp8),
                                          torch.empty(2 * inter, dtype=f32), bf16)))))
    return cases


def run(batch_sizes=(1, 64)):
    from kernels._common import interpreted

    if interpreted():
        raise RuntimeError("compile_check needs TRITON_INTERPRET unset: it compiles for the GPU, not the interpreter")
    rows = []
    for name, module, thunk in decode_cases(batch_sizes):
        with recording(module) as recorders:
            thunk()
        for recorder in recorders:
            rows.extend(compile_recorded(name, recorder))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    args = parser.parse_args(argv)
    rows = run(tuple(args.batch_sizes))
    print(f"{'case':40s} {'kernel':32s} {'warps':>5s} {'regs':>5s} {'spill':>6s} {'smem':>6s} {'sec':>5s}")
    for r in rows:
        print(f"{r['case']:40s} {r['kernel']:32s} {r.get('num_warps', 4):5d} {r['regs'] or 0:5d} "
              f"{(r['spill_stores'] or 0) + (r['spill_loads'] or 0):6d} {r['smem'] or 0:6d} {r['compile_s']:5.1f}")
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
