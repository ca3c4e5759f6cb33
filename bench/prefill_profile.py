"""Where a page-load prefill's device time goes (Qwen3.5-4B shape, random weights), per engine variant.

At page load a page's prefill (one image of --page-image-tokens merged tokens through the vision tower, then ~1,314
prompt tokens through the decoder) took ~48 ms of the engine's ~110 ms a page on an H100 at batch 256
(bench/results/h100_engine_page_load_b.json: 12 of its 28 s went to the 42 prefill steps), and FP8 weights prefilled
0.9x as fast as bf16 where issue 59 asks >= 1.3x (h100_quantized_decode.json). For each variant
(bench.engine_bench.variant_short_names: default, fp8, ...), in one process:
  1. --pages page requests (bench/engine_bench.py's page scenario, max_tokens 1) prefilled --repeats times after a
     warm-up: median ms a page and prompt tokens/s;
  2. one more prefill under torch.profiler, its kernels by category (GEMM, our Triton, inductor, aten), by scope
     (the vision tower, each decoder layer kind, the head, the rest) and by GEMM shape with the TFLOP/s each reached;
  3. the compute roofline in the same run: the GEMMs' FLOPs (from their recorded shapes) over the dense bf16 matmul
     rate measured here (8192^3), and over torch._scaled_mm's FP8 rate where the variant runs FP8 GEMMs.

    python bench/prefill_profile.py --variants default,fp8 --pages 16 --out $OUT/prefill    # 4B shape, CUDA
    python bench/prefill_profile.py --tiny --device cpu --pages 2 --out /tmp/pp                 # CPU smoke

Writes <out>/prefill_profile.json (meta + one record per variant).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import engine_bench as eb  # noqa: E402
from bench import harness  # noqa: E402
from bench.decode_profile import kernel_records, our_triton_kernels, ranged, table, tally  # noqa: E402
from engine.config import parse_config  # noqa: E402
from engine.model_runner import resolve_dtype  # noqa: E402
from engine.models.gdn_prefill import fla_available  # noqa: E402
from engine.interface import SamplingParams  # noqa: E402


def matmul_tflops(device, dtype, fp8: bool = False, n: int = 8192) -> float | None:
    """Dense matmul TFLOP/s on this device ([n, n] @ [n, n], CUDA events over 20 calls); FP8 through
    torch._scaled_mm with unit scales. None off CUDA (a CPU's rate is no roofline for this)."""
    if device.type != "cuda":
        return None
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    if fp8:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()  # mat2 column-major
        one = torch.ones((), device=device)
        fn = lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=dtype)  # noqa: E731
    else:
        fn = lambda: a @ b  # noqa: E731
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    return 2 * n ** 3 * 20 / (start.elapsed_time(end) / 1e3) / 1e12


def ranged_model(engine):
    """Profiler ranges around the vision tower, each decoder layer (by kind) and the head; returns an undo."""
    model, lm = engine.model, engine.model.language_model
    patched = [(layer, "forward", layer.kind) for layer in lm.layers] + [
        (lm.norm, "forward", "norm+head"), (model, "compute_logits", "norm+head")]
    if model.visual is not None:
        patched.append((model.visual, "forward", "vision"))
    for obj, attr, name in patched:
        setattr(obj, attr, ranged(getattr(obj, attr), name))

    def undo():
        for obj, attr, _ in patched:
            delattr(obj, attr)
    return undo


def page_requests(n: int, args, cfg, rng) -> list[dict]:
    ns = argparse.Namespace(page_image_tokens=args.page_image_tokens, page_gen=1, text_prompt=1, text_gen=1)
    return [dict(r, sampling=SamplingParams(max_tokens=1)) for r in eb.make_requests("page", n, ns, cfg, rng)]


def prefill_seconds(engine, reqs) -> float:
    eb.sync(engine.device)
    t = time.perf_counter()
    engine.generate([dict(r) for r in reqs])
    eb.sync(engine.device)
    return time.perf_counter() - t


def summarise(recs, ours: set[str], bf16_tflops: float | None) -> dict:
    """Kernel time by category and scope; GEMMs by (scope, shape) with their FLOPs and the rate reached."""
    kern, cats, scopes, _, gemms = tally(recs, ours)
    gemm_rows, flops = [], 0.0
    for (scope, shape), (calls, us) in sorted(gemms.items(), key=lambda kv: -kv[1][1]):
        f = 2.0 * shape[0] * shape[1] * shape[2] * len(calls) if shape else None
        flops += f or 0.0
        gemm_rows.append(dict(scope=scope, M=shape and shape[0], K=shape and shape[1], N=shape and shape[2],
                              calls=len(calls), ms=us / 1e3, TFLOPs=f / us / 1e6 if f else None))
    total_ms = sum(us for _, us, _ in recs) / 1e3
    gemm_ms = cats["gemm"][1] / 1e3 if "gemm" in cats else 0.0
    return dict(kernel_sum_ms=total_ms, kernels=len(recs), gemm_ms=gemm_ms,
                gemm_share=gemm_ms / total_ms if total_ms else 0.0, gemm_TFLOP=flops / 1e12,
                gemm_roofline_ms=1e3 * flops / (bf16_tflops * 1e12) if bf16_tflops else None,
                categories={k: dict(kernels=r["per_step"], ms=r["us_per_step"] / 1e3) for k, r in table(cats, 1).items()},
                scopes={k: dict(kernels=r["per_step"], ms=r["us_per_step"] / 1e3) for k, r in table(scopes, 1).items()},
                top_kernels=[dict(name=k[:200], calls=r["per_step"], ms=r["us_per_step"] / 1e3)
                             for k, r in list(table(kern, 1).items())[:15]],
                gemms=gemm_rows)


def profile_variant(engine, args, cfg, rng, ours, rates) -> dict:
    reqs = page_requests(args.pages, args, cfg, rng)
    prompt_tokens = sum(len(r["prompt_token_ids"]) for r in reqs)
    prefill_seconds(engine, reqs)  # warm-up: compiles, autotunes, allocates at these shapes
    times = [prefill_seconds(engine, reqs) for _ in range(args.repeats)]
    s = statistics.median(times)
    undo = ranged_model(engine)
    try:
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
        with profile(activities=acts, record_shapes=True) as prof:
            prefill_seconds(engine, reqs)
    finally:
        undo()
    recs, info = kernel_records(prof.events())
    res = summarise(recs, ours, rates["bf16"])
    return dict(pages=args.pages, prompt_tokens=prompt_tokens, seconds=s, seconds_all=times,
                ms_per_page=1e3 * s / args.pages, tokens_per_s=prompt_tokens / s, profile_source=info["source"],
                span_ms=info["span_us"] / 1e3 if "span_us" in info else None, **res)


def show(r: dict) -> None:
    print(f"\n== {r['variant']}: {r['pages']} pages, {r['ms_per_page']:.1f} ms a page, {r['tokens_per_s']:.0f} "
          f"prompt tokens/s; kernels {r['kernel_sum_ms']:.1f} ms, GEMM {r['gemm_ms']:.1f} ms "
          f"({r['gemm_TFLOP']:.1f} TFLOP, roofline {r['gemm_roofline_ms'] or float('nan'):.1f} ms)")
    for title, rows in (("category", r["categories"]), ("scope", r["scopes"])):
        print("  " + "  ".join(f"{k} {v['ms']:.1f}" for k, v in rows.items()) + f"   (ms by {title})")
    for g in r["gemms"][:8]:
        rate = f"{g['TFLOPs']:.0f} TFLOP/s" if g["TFLOPs"] else "-"
        print(f"  gemm {g['scope']:18} M={g['M']} K={g['K']} N={g['N']} x{g['calls']}: {g['ms']:.2f} ms, {rate}")


def main(argv=None):
    ap = eb.model_shape_args(__doc__)
    ap.add_argument("--variants", default="default,fp8")
    ap.add_argument("--pages", type=int, default=None, help="pages prefilled together (default 16, tiny 2)")
    ap.add_argument("--page-image-tokens", type=int, default=None, help="merged image tokens a page (default 1296)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    args.pages = args.pages or (2 if args.tiny else 16)
    args.page_image_tokens = args.page_image_tokens or (16 if args.tiny else 1296)
    names = eb.variant_short_names()
    variants = args.variants.split(",")
    if not set(variants) <= set(names):
        ap.error(f"--variants: some of {', '.join(names)}, got {args.variants}")
    device = torch.device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hf_cfg = eb.hf_config(args.tiny)
    hf_raw = hf_cfg.to_dict()
    cfg = parse_config(hf_raw)
    sd = eb.build_hf_model(hf_cfg, device, dtype).state_dict()
    max_len = args.page_image_tokens + 64
    opts = eb.engine_options(args.pages, max_len, device)
    rates = dict(bf16=matmul_tflops(device, dtype), fp8=matmul_tflops(device, dtype, fp8=True))
    meta = dict(device=str(device), gpu=harness.device_name(device), dtype=str(dtype), tiny=args.tiny,
                torch=torch.__version__, fla_available=fla_available(), matmul_TFLOPs=rates, engine_options=opts,
                args=vars(args))
    results = harness.ResultFile(out / "prefill_profile.json", harness.result_meta(
        __file__, f"where a page-load prefill's device time goes ({'tiny' if args.tiny else '4B'} shape, random "
        f"weights, {args.pages} pages of {args.page_image_tokens} image tokens, max_tokens 1) per variant: ms a page, "
        f"prompt tokens/s, kernels by category, scope and GEMM shape, the GEMMs' FLOPs against the matmul rate "
        f"measured in the same run", argv, device))
    ours, runs, rng = our_triton_kernels(), [], np.random.default_rng(0)
    for variant in variants:
        t = time.perf_counter()
        engine = eb.variant_engine(names[variant], hf_raw, sd, device, dtype, **opts)
        meta[f"engine_build_s_{variant}"] = time.perf_counter() - t
        runs.append(dict(variant=variant, **profile_variant(engine, args, cfg, rng, ours, rates)))
        show(runs[-1])
        results.write(dict(meta=meta, runs=runs))
        del engine
        if device.type == "cuda":
            torch.cuda.empty_cache()
    base = runs[0]["tokens_per_s"]
    for r in runs:
        r["vs_first"] = r["tokens_per_s"] / base
    results.write(dict(meta=meta, runs=runs))
    print("\n" + "  ".join(f"{r['variant']} {r['tokens_per_s']:.0f} tok/s ({r['vs_first']:.2f}x)" for r in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
