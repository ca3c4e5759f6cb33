"""Small-M quantized linear layers (kernels/quant_linear) against bf16 and cuBLAS at the Qwen3.5-4B decode shapes.

For each projection (N, K), rows M and precision, timed in CUDA graphs with the weight rotated over enough copies
(>= 256 MB) that every call streams it from HBM (bench/small_m_linear_bench.graph_us), against the device-to-device
copy bandwidth measured in the same run:
  * bf16: kernels/small_m_linear at its default launch, and cuBLAS (F.linear);
  * fp8: our W8A16 GEMV at its default launch and over a sweep of launches (tiles, warps, stages), and cuBLAS's
    W8A8 row-wise scaled GEMM (torch._scaled_mm; its per-token quantization kernel not counted);
  * nvfp4 (W4A16): our GEMV at its default launch and over a sweep, and the weight dequantized by a kernel then
    cuBLAS (nvfp4_matmul).
Past 64 rows our GEMVs tile the rows over more programs; these rows tell where each hands over to a GEMM. First, the
NVFP4 decode is checked bit for bit (decode_check); the run stops if it is wrong.
Each launch is checked against the fp32 reference of the same quantized weight before it is timed. Bytes per call are
the weight as stored (data + scales) + x + y.

    python3 bench/quant_gemv_bench.py --out $OUT/quant_gemv.json                 # GPU, a few minutes
    python3 bench/quant_gemv_bench.py --dry-run --out /tmp/qg.json              # CPU interpreter, tiny shapes
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import harness  # noqa: E402

SHAPES = {"gate_up": (18432, 2560), "gdn_qkvz": (12288, 2560), "attn_qkv": (10240, 2560), "down": (2560, 9216),
          "out_proj": (2560, 4096)}
TINY_SHAPES = {"tiny_a": (48, 64), "tiny_b": (130, 224)}
COLD_BYTES = 256 << 20
OK_REL_ERR = 1e-2


def fp8_configs(N, K):
    """(name, launch options) around the default; default_launch fills what a config leaves out."""
    return [("default", {}), ("bn64", dict(block_n=64)), ("bk128_st3", dict(block_k=128, num_stages=3)),
            ("bk512_st3", dict(block_k=512, num_stages=3)), ("bn64_w8", dict(block_n=64, num_warps=8)),
            ("asm", dict(fp8_asm=True)), ("asm_bk128_st3", dict(fp8_asm=True, block_k=128, num_stages=3)),
            ("asm_bk256_st4", dict(fp8_asm=True, block_k=256, num_stages=4))]


def nvfp4_configs(N, K):
    return [("default", {}), ("bn64", dict(block_n=64)), ("bk128_st3", dict(block_k=128, num_stages=3)),
            ("bk512_st3", dict(block_k=512, num_stages=3)), ("bn64_w8", dict(block_n=64, num_warps=8)),
            ("bn16", dict(block_n=16))]


def decode_check(device) -> dict:
    """The bit-level decodes bit for bit (on sm_90+; the CPU tests cannot run them): NVFP4's, every code at every
    nibble and block scales over E4M3's range (subnormals too), through the dequantize kernel against the
    reference's bf16 weight, and the GEMV's product against the reference's; FP8's (fp8_asm, which the sweep times),
    every non-NaN code through the GEMV (fp8_asm_mismatches: outputs that differ from the reference's)."""
    from kernels import quant_linear as ql

    gen = torch.Generator().manual_seed(11)
    N, K = 37, 1024
    packed = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8)
    packed[0, :128] = torch.arange(0, 256, 2, dtype=torch.int32).to(torch.uint8)
    packed[1, :128] = torch.arange(1, 256, 2, dtype=torch.int32).to(torch.uint8)
    bs = torch.exp2(torch.randint(-9, 9, (N, K // 16), generator=gen).float()).to(ql.FP8)
    bs[2] = torch.arange(K // 16).to(torch.uint8).view(ql.FP8)  # raw E4M3 codes 0..63: zero and subnormals
    row = torch.rand(N, generator=gen) + 0.5
    packed, bs, row = packed.to(device), bs.to(device), row.to(device)
    want = ql.dequant_nvfp4_ref(packed, bs, row).to(torch.bfloat16)
    got = ql.dequant_nvfp4_triton(packed, bs, row, torch.bfloat16)
    x = torch.randn(5, K, generator=gen).to(torch.bfloat16).to(device)
    y, ref = ql.nvfp4_linear_triton(x, packed, bs, row).float(), ql.nvfp4_linear_ref(x, packed, bs, row).float()
    # FP8 by bit moves (fp8_asm): one-hot rows of x pick single weights, so each output is one weight times its
    # row scale, rounded once, as the reference's; every non-NaN E4M3 code is a column of w8
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.int32).to(torch.uint8)
    w8 = codes.view(ql.FP8).repeat(8, 1).to(device)  # [8, 254]
    rs = torch.exp2(torch.arange(8).float() - 4).to(device)
    fp8_bad = 0
    for k0 in range(0, w8.shape[1], 16):
        cols = torch.arange(k0, min(k0 + 16, w8.shape[1]))
        onehot = torch.zeros(len(cols), w8.shape[1], dtype=torch.bfloat16, device=device)
        onehot[torch.arange(len(cols)), cols.to(device)] = 1
        got8 = ql.fp8_linear_triton(onehot, w8, rs, fp8_asm=True)
        fp8_bad += int((got8 != ql.fp8_linear_ref(onehot, w8, rs)).sum())
    return dict(asm_decode=ql.asm_decode(x), dequant_exact=bool(torch.equal(got, want)),
                dequant_mismatches=int((got != want).sum()),
                gemv_rel_err=float((y - ref).norm() / ref.norm()), fp8_asm_mismatches=fp8_bad)


def measure(shapes: dict, rows_m, device, sweep: bool = True, budget_s: float = 300.0, log=print) -> list[dict]:
    """One entry per (shape, M): every case's rel_err against its fp32 reference and graph-timed us / GB/s / % of
    the copy bandwidth; sweep: FP8 and NVFP4 launches beyond the default (until budget_s has passed)."""
    import torch.nn.functional as F

    from bench.kernels_bench import copy_bandwidth
    from bench.small_m_linear_bench import graph_us
    from engine.quant_codec import quantize_fp8, quantize_nvfp4
    from kernels import fp8_quant, quant_linear as ql, small_m_linear as sml

    t0 = time.time()
    bw = copy_bandwidth(device, (1 << 30) if device.type == "cuda" else (1 << 24))
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []

    def rel(y, ref):
        return float((y.float() - ref).norm() / ref.norm().clamp(min=1e-30))

    for name, (N, K) in shapes.items():
        w = torch.randn(N, K, generator=gen, device=device) * K ** -0.5
        wb = w.to(torch.bfloat16)
        w8, s8 = quantize_fp8(w)
        row8 = s8.float().reshape(-1).expand(N).contiguous()
        packed, bsc, gs = quantize_nvfp4(w)
        rown = (1 / gs.float()).reshape(1).expand(N).contiguous()
        bytes_w = dict(bf16=N * K * 2, fp8=N * K + 4 * N, nvfp4=N * K // 2 + N * K // 16 + 4 * N)
        copies = {p: max(1, math.ceil(COLD_BYTES / b)) if device.type == "cuda" else 1 for p, b in bytes_w.items()}
        pools = dict(bf16=[wb] + [wb.clone() for _ in range(copies["bf16"] - 1)],
                     fp8=[w8] + [w8.clone() for _ in range(copies["fp8"] - 1)],
                     nvfp4=[packed] + [packed.clone() for _ in range(copies["nvfp4"] - 1)])
        ref8_w = ql.dequant_fp8_ref(w8, row8)
        refn_w = ql.dequant_nvfp4_ref(packed, bsc, rown)
        for M in rows_m:
            x = torch.randn(M, K, generator=gen, device=device).to(torch.bfloat16)
            xq, xs = fp8_quant.quant_fp8_per_token(x)
            io = (M * K + M * N) * 2
            refs = dict(bf16=x.float() @ wb.float().T, fp8=x.float() @ ref8_w.T,
                        fp8_w8a8=(xq.float() @ ref8_w.T) * xs[:, None], nvfp4=x.float() @ refn_w.T)
            entry = dict(shape=name, N=N, K=K, M=M, weight_bytes=bytes_w, copies=copies, copy_bandwidth_GBps=bw / 1e9,
                         cases=[])
            ws = sml.small_m_linear_workspace(N, device, max_m=max(M, 1), max_split_k=sml.MAX_SPLIT_K)
            cases = [("bf16", "cublas", "cublas", None, lambda w, lc: F.linear(x, w))]
            if M <= sml.MAX_M:
                cases.append(("bf16", "small_m_linear", "default", None,
                              lambda w, lc: sml.small_m_linear(x, w, workspace=ws)))
            if device.type == "cuda":
                cases.append(("fp8", "cublas", "scaled_mm", None, lambda w, lc: torch._scaled_mm(
                    xq, w.t(), scale_a=xs[:, None], scale_b=row8[None, :], out_dtype=torch.bfloat16)))
            cases += [("fp8", "ours", c, lc, lambda w, lc: ql.fp8_linear_triton(x, w, row8, **lc))
                      for c, lc in fp8_configs(N, K)[:None if sweep else 1]]
            cases += [("nvfp4", "ours", c, lc, lambda w, lc: ql.nvfp4_linear_triton(x, w, bsc, rown, **lc))
                      for c, lc in nvfp4_configs(N, K)[:None if sweep else 1]]
            cases.append(("nvfp4", "dequant+cublas", "dequant_cublas", None,
                          lambda w, lc: ql.nvfp4_matmul(x, w, bsc, rown)))
            for prec, kind, cname, launch, fn in cases:
                if time.time() - t0 > budget_s and cname not in ("default", "cublas", "scaled_mm", "dequant_cublas"):
                    continue
                c = dict(precision=prec, kernel=kind, config=cname, launch=launch)
                try:
                    ref = refs["fp8_w8a8" if cname == "scaled_mm" else prec]
                    c["rel_err"] = rel(fn(pools[prec][0], launch or {}), ref)
                    if c["rel_err"] < OK_REL_ERR:
                        nbytes = bytes_w[prec] + io
                        us = graph_us([lambda w=w: fn(w, launch or {}) for w in pools[prec]], device,
                                      nbytes / 3e12 * 1e6)
                        c.update(us=us, GBps=nbytes / us / 1e3, pct_copy_bw=100 * nbytes / us / 1e3 / (bw / 1e9))
                except Exception as e:  # noqa: BLE001 - one launch that fails to compile must not end the run
                    c["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                entry["cases"].append(c)
            rows.append(entry)
            best = {}
            for c in entry["cases"]:
                if "us" in c and (c["precision"] not in best or c["us"] < best[c["precision"]]["us"]):
                    best[c["precision"]] = c
            log(f"{name:9s} M={M:<3d} " + "  ".join(f"{p} {b['us']:7.1f}us {b['pct_copy_bw']:4.0f}% {b['config']}"
                                                   for p, b in best.items()))
            bad = [f"{c['precision']}:{c['config']} {c.get('error') or c.get('rel_err')}" for c in entry["cases"]
                   if "us" not in c]
            if bad:
                log("    not timed: " + "; ".join(bad))
        del pools
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    ap.add_argument("--shapes", nargs="+", default=None)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--budget-s", type=float, default=300.0, help="sweep stops after this; defaults still run")
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.dry_run else "cuda")
    shapes = TINY_SHAPES if args.dry_run else {k: SHAPES[k] for k in (args.shapes or SHAPES)}
    t0 = time.time()
    check = decode_check(device)
    print(f"decode check: {check}", flush=True)
    if not check["dequant_exact"] or check["gemv_rel_err"] > OK_REL_ERR:
        raise SystemExit(f"the NVFP4 decode is wrong on {device}: {check}")
    rows = measure(shapes, args.rows, device, sweep=not args.no_sweep, budget_s=args.budget_s,
                   log=lambda m: print(m, flush=True))
    meta = dict(decode_check=check, device=harness.device_name(device), torch=torch.__version__,
                cold_bytes=COLD_BYTES, elapsed_s=time.time() - t0)
    harness.write_result(args.out, dict(meta=meta, rows=rows), harness.result_meta(
        __file__, f"every decode projection shape at {', '.join(map(str, args.rows))} rows, "
        + ("tiny shapes in the CPU interpreter" if args.dry_run else "CUDA graphs, the weight rotated out of L2")
        + ": bf16 (ours, cuBLAS), FP8 (our W8A16 GEMV, cuBLAS W8A8), NVFP4 (our GEMV, dequantize + cuBLAS), against "
        "the copy bandwidth; decode_check: the NVFP4 decode bit for bit", argv, device))
    print(f"wrote {args.out} in {meta['elapsed_s']:.0f} s")


if __name__ == "__main__":
    if "--dry-run" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    main()
