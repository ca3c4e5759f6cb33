"""bf16 vs FP8 vs the NVFP4 mix at the Qwen3.5-4B shape (random weights), one process, one GPU:

  * decode ms/step at each batch size (text prompts of --prompt tokens, --gen tokens generated, the engine's normal
    path: CUDA graphs, GEMVs), each against its own roofline: the bytes one step must move (every decoder weight in
    its stored format, the head once, KV cache read, GDN state read + written) / the device-to-device copy bandwidth
    measured in the same run;
  * prefill tokens/s at page-sized prompts (--page-tokens per sequence, --prefill-batch sequences, one step each);
  * next-token logit error and top-1 agreement of FP8 / NVFP4 against bf16 on page-shaped prompts (an image of
    --page-image-tokens merged tokens + text), and how many of the first --check-tokens greedy tokens agree;
  * `gemv`: each decode projection shape alone at 1-64 rows, default launches (bench/quant_gemv_bench.measure: CUDA
    graphs, weights rotated out of L2; bf16 small_m_linear and cuBLAS, FP8 ours and torch._scaled_mm, NVFP4 ours);
  * `quality`: each quantized engine against its dequantized twin (the same quantized weights expanded to bf16:
    differences are our kernels' and FP8 activation quantization's), the same weights run weight-only against the
    twin (our kernels' rounding alone: a kernel bug shows here), and each against the original bf16 weights.
The quantized engines are built from the bf16 weights by engine.quantize.quantize_tensors with the built-in recipes
(engine/quantize.py BUILTIN_RECIPES: fp8 = every projection FP8 W8A8 but the GDN gates, run W8A16 by the decode
GEMVs up to 16 rows; nvfp4 = NVFP4, down_proj FP8),
round-to-nearest (random weights have no activations worth calibrating on).

    python bench/quantized_decode_bench.py --out bench/results/h200_quantized_decode.json        # H200
    python bench/quantized_decode_bench.py --device cpu --smoke --out /tmp/qdb.json             # toy sizes, CPU

Writes `rows` [{precision, batch, decode_step_ms, roofline_ms, ...}], `prefill` and `quality`, rewritten after each
measurement (a later failure keeps what was measured).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.config import parse_config  # noqa: E402
from engine.interface import SamplingParams  # noqa: E402
from engine.llm_engine import Engine, EngineOptions  # noqa: E402
from engine.models.quant_linear import QuantWeight  # noqa: E402
from engine.quantize import builtin_plan, dequantize_tensors, quantize_tensors  # noqa: E402
from bench import harness  # noqa: E402
from bench import quant_gemv_bench as quant_gemv  # noqa: E402
from bench import engine_bench as eb  # noqa: E402

PRECISIONS = ("bf16", "fp8", "nvfp4")


def weight_bytes(model) -> int:
    """Bytes of every decoder weight as stored (parameters and quantized buffers), embeddings left out, plus the head."""
    lm = model.language_model
    params = sum(p.numel() * p.element_size() for n, p in lm.named_parameters() if "embed_tokens" not in n)
    quant = sum(m.nbytes() for m in lm.modules() if isinstance(m, QuantWeight))
    return params + quant + model.head_weight.numel() * model.head_weight.element_size()


def build_engine(precision: str, hf_raw: dict, sd: dict, device, dtype, opts: dict, twin: bool = False,
                 weight_only: bool = False) -> Engine:
    """The engine on `precision` weights quantized from `sd`; twin: on those quantized weights dequantized back to
    `dtype` (plain projections), the reference that tells our kernels' error from quantization's; weight_only: the
    same weights with no FP8 activations anywhere (W8A16 / W4A16 prefill too), so that against the twin only our
    kernels' rounding differs."""
    if precision == "bf16":
        return Engine(parse_config(hf_raw), sd.items(), device=device, dtype=dtype, options=EngineOptions(**opts))
    cfg = parse_config(hf_raw)
    plan, act_fp8 = builtin_plan(cfg, precision)
    tensors, qc, _ = quantize_tensors(cfg, sd, plan, act_fp8=act_fp8 and not weight_only)
    if twin:
        tensors = dequantize_tensors(tensors, qc, dtype)
        return Engine(cfg, tensors.items(), device=device, dtype=dtype, options=EngineOptions(**opts))
    qcfg = parse_config(dict(hf_raw, quantization_config=qc))
    eng = Engine(qcfg, tensors.items(), device=device, dtype=dtype, options=EngineOptions(**opts))
    del tensors
    return eng


def decode_row(engine: Engine, precision: str, batch: int, args, cfg, bw: float, dtype, rng) -> dict:
    reqs = [dict(prompt_token_ids=rng.integers(0, args.vocab_hi, args.prompt).tolist(), ignore_eos=True,
                 sampling=SamplingParams(max_tokens=args.gen)) for _ in range(batch)]
    engine.generate([dict(r, sampling=SamplingParams(max_tokens=2)) for r in reqs])  # warm-up at these shapes
    engine.step_log.clear()
    engine.record_steps = True
    eb.sync(engine.device)
    engine.generate(reqs)
    eb.sync(engine.device)
    engine.record_steps = False
    step_s, device_s, _, dec = eb.decode_step_times(engine.step_log, batch)
    state = eb.decode_bytes(cfg, engine.model, batch, args.prompt + args.gen / 2, dtype)
    wbytes = weight_bytes(engine.model)
    total = wbytes + state["kv"] + state["gdn_state"]
    return dict(precision=precision, batch=batch, decode_step_ms=1e3 * step_s, decode_device_ms=1e3 * device_s,
                roofline_ms=1e3 * total / bw, roofline_ratio=step_s * bw / total, weight_bytes=wbytes,
                state_bytes=state["kv"] + state["gdn_state"], decode_steps=len(dec))


def prefill_row(engine: Engine, precision: str, args, rng) -> dict:
    reqs = [dict(prompt_token_ids=rng.integers(0, args.vocab_hi, args.page_tokens).tolist(),
                 sampling=SamplingParams(max_tokens=1)) for _ in range(args.prefill_batch)]
    engine.generate([dict(r) for r in reqs])  # warm-up
    times = []
    for _ in range(args.prefill_repeats):
        eb.sync(engine.device)
        t0 = time.perf_counter()
        engine.generate([dict(r) for r in reqs])
        eb.sync(engine.device)
        times.append(time.perf_counter() - t0)
    s = float(np.median(times))
    return dict(precision=precision, prompt_tokens=args.page_tokens, sequences=args.prefill_batch, seconds=s,
                tokens_per_s=args.page_tokens * args.prefill_batch / s)


def page_outputs(engine: Engine, args, cfg) -> list:
    ns = argparse.Namespace(page_image_tokens=args.page_image_tokens, page_gen=args.check_tokens, text_prompt=1,
                            text_gen=1)
    reqs = eb.make_requests("page", args.quality_prompts, ns, cfg, np.random.default_rng(7))
    return engine.generate([dict(r, keep_logits=True, ignore_eos=True) for r in reqs])


def quality_row(precision: str, against: str, got: list, ref: list) -> dict:
    """Next-token logits of the first generated position, the greedy prefix shared with `ref`, and at each first
    divergence the top-2 margin of ref's logits there (a near-tie when small: either token is a fair answer)."""
    a = torch.stack([o.logits[0].float() for o in got])
    b = torch.stack([o.logits[0].float() for o in ref])
    same, margins = [], []
    for o, r in zip(got, ref):
        n = next((i for i, (x, y) in enumerate(zip(o.output_token_ids, r.output_token_ids)) if x != y),
                 len(r.output_token_ids))
        same.append(n / len(r.output_token_ids))
        if n < len(r.output_token_ids):
            top2 = r.logits[n].float().topk(2).values
            margins.append(float(top2[0] - top2[1]))
    return dict(precision=precision, against=against, prompts=len(got), logit_rel_err=float((a - b).norm() / b.norm()),
                logit_max_abs_err=float((a - b).abs().max()),
                top1_agreement=float((a.argmax(-1) == b.argmax(-1)).float().mean()),
                greedy_prefix_agreement=float(np.mean(same)), greedy_identical=sum(x == 1.0 for x in same),
                divergence_top2_margins=margins)


GEMV_ROWS = (1, 8, 32, 64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="toy model sizes (CPU run end to end)")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--batch-sizes", default=None, help="default 1,8,32,64,128 (smoke: 1,2)")
    ap.add_argument("--prompt", type=int, default=None, help="decode runs' prompt tokens (default 512; smoke 24)")
    ap.add_argument("--gen", type=int, default=None, help="decode runs' generated tokens (default 64; smoke 6)")
    ap.add_argument("--page-tokens", type=int, default=None, help="prefill prompt tokens (default 1320; smoke 40)")
    ap.add_argument("--prefill-batch", type=int, default=8)
    ap.add_argument("--prefill-repeats", type=int, default=3)
    ap.add_argument("--page-image-tokens", type=int, default=None, help="quality prompts' merged image tokens")
    ap.add_argument("--quality-prompts", type=int, default=8)
    ap.add_argument("--check-tokens", type=int, default=16)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    small = args.smoke
    for k, (toy, real) in dict(prompt=(24, 512), gen=(6, 64), page_tokens=(40, 1320),
                               page_image_tokens=(16, 1296)).items():
        if getattr(args, k) is None:
            setattr(args, k, toy if small else real)
    batches = [int(b) for b in (args.batch_sizes or ("1,2" if small else "1,8,32,64,128")).split(",")]
    precisions = args.precisions.split(",")
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hf_cfg = eb.hf_config(small)
    hf_raw = hf_cfg.to_dict()
    cfg = parse_config(hf_raw)
    args.vocab_hi = min(240000, cfg.vision_start_token_id - 10)
    bw = eb.copy_bandwidth(device, (2 << 30) if device.type == "cuda" else (64 << 20))
    hf = eb.build_hf_model(hf_cfg, device, dtype)
    sd = dict(hf.state_dict())
    del hf
    max_len = max(args.prompt + args.gen, args.page_tokens + 1, args.page_image_tokens + 24 + args.check_tokens)
    opts = eb.engine_options(max(max(batches), args.prefill_batch, args.quality_prompts), max_len, device)
    meta = dict(device=str(device), gpu=harness.device_name(device), dtype=str(dtype), smoke=small,
                copy_bandwidth_GBps=bw / 1e9,
                args={k: v for k, v in vars(args).items() if k != "out"} | {"out": str(args.out)},
                torch=torch.__version__)
    result = dict(meta=meta, rows=[], prefill=[], quality=[], gemv=[])
    results = harness.ResultFile(args.out, harness.result_meta(
        __file__, f"{' / '.join(precisions)} at the {'toy' if small else '4B'} shape (random weights): decode ms per "
        f"step at batch {', '.join(map(str, batches))} against each format's roofline, prefill tokens/s, logit error "
        f"and greedy agreement against bf16 and each format's dequantized twin, the decode GEMVs alone",
        argv, device))

    def save():
        results.write(result)

    result["gemv"] = quant_gemv.measure(quant_gemv.TINY_SHAPES if small else quant_gemv.SHAPES, GEMV_ROWS, device,
                                        sweep=False)
    save()
    ref_pages = None
    rng = np.random.default_rng(0)
    for precision in precisions:
        if precision != "bf16":
            twin = build_engine(precision, hf_raw, sd, device, dtype, opts, twin=True)
            twin_pages = page_outputs(twin, args, cfg)
            del twin
            wo = build_engine(precision, hf_raw, sd, device, dtype, opts, weight_only=True)
            result["quality"].append(quality_row(f"{precision} weight-only", "dequantized twin",
                                                 page_outputs(wo, args, cfg), twin_pages))
            del wo
            gc.collect()
        engine = build_engine(precision, hf_raw, sd, device, dtype, opts)
        pages = page_outputs(engine, args, cfg)
        if precision == "bf16":
            ref_pages = pages
        else:
            result["quality"].append(quality_row(precision, "dequantized twin", pages, twin_pages))
            if ref_pages is not None:
                result["quality"].append(quality_row(precision, "bf16", pages, ref_pages))
        result["prefill"].append(prefill_row(engine, precision, args, rng))
        save()
        for b in batches:
            row = decode_row(engine, precision, b, args, cfg, bw, dtype, rng)
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
            save()
        del engine
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    bf16_prefill = next((p["tokens_per_s"] for p in result["prefill"] if p["precision"] == "bf16"), None)
    for p in result["prefill"]:
        p["vs_bf16"] = p["tokens_per_s"] / bf16_prefill if bf16_prefill else None
    save()
    print(json.dumps(dict(prefill=result["prefill"], quality=result["quality"]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
