"""End-to-end benchmark: native engine vs transformers on Qwen3.5-shaped models with random weights.

Scenarios (each at every --batch-sizes value, greedy, fixed output lengths):
  text: prompts of --text-prompt random tokens, --text-gen generated tokens
  page: one image of --page-image-tokens merged tokens (+ the chat scaffolding) in, --page-gen tokens out
Reported per run: total and per-sequence tokens/s, TTFT, decode ms/step (wall period, device time), host overhead
(share of a decode step the device is not busy with it), and the decode memory roofline -- bytes a decode step must
move (weights + KV read + GDN state read/write) over the device-to-device copy bandwidth measured in the same run.

    python bench/engine_bench.py --device cuda --out $OUT/bench            # real Qwen3.5-4B shape, bf16 (H200)
    python bench/engine_bench.py --device cpu --tiny --out /tmp/bench      # tiny shapes on CPU (exercises the code)
    --variants native,native_cublas,...: the native engine once per variant (VARIANTS: EngineOptions / DecodeTuning
    overrides), so each change is timed against its baseline in the same run; the greedy tokens / logits of every
    other variant are compared with the first on a few requests ("output_checks" in meta).

Writes <out>/benchmark.json and <out>/benchmark.png.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from engine.config import parse_config  # noqa: E402
from engine.interface import SamplingParams  # noqa: E402
from engine.llm_engine import Engine  # noqa: E402
from engine.model_runner import resolve_dtype  # noqa: E402
from engine.models.gdn_prefill import fla_available  # noqa: E402
from engine.options import DecodeTuning, EngineOptions  # noqa: E402

# native engine variants (EngineOptions overrides; "tuning": DecodeTuning overrides): the default, the paths it
# replaced, and the lower-precision caches
VARIANTS = {
    "native": {},  # EngineOptions and DecodeTuning defaults: decode projections on kernels/small_m_linear
    "native_cublas": dict(tuning=dict(gemv=False)),  # ... on cuBLAS
    "native_no_pdl": dict(tuning=dict(pdl=False)),  # ... without programmatic dependent launch
    "native_swiglu_unfused": dict(tuning=dict(swiglu_epilogue=False)),  # ... SwiGLU as its own kernel after gate_up
    "native_unfused_attn": dict(tuning=dict(fused_attention_decode=False)),  # attention inputs by the glue + KV store
    "native_bf16_state": dict(gdn_state_dtype="bfloat16"),  # the GDN state pool in bf16 (half its traffic)
    "native_fp8_kv": dict(kv_cache_dtype="fp8"),  # attention K/V as E4M3 rows with a scale each
    "native_bf16_state_fp8_kv": dict(gdn_state_dtype="bfloat16", kv_cache_dtype="fp8"),
    # the weights quantized by engine/quantize.py's built-in FP8 recipe (what jobs/quantize.py --recipe fp8 writes)
    "native_fp8": dict(weights="fp8"),
    "native_fp8_bf16_state_fp8_kv": dict(weights="fp8", gdn_state_dtype="bfloat16", kv_cache_dtype="fp8"),
}


def variant_args(name: str, **options) -> dict:
    """Engine keyword arguments of a variant: options=EngineOptions(options + its overrides), tuning=DecodeTuning(its
    tuning overrides: the decode path's internal switches, which benchmarks may set and users do not). A variant
    on quantized weights needs its checkpoint built too: variant_engine."""
    weights, args = _variant(name, options)
    if weights:
        raise ValueError(f"variant {name} runs quantized weights: build it with variant_engine")
    return args


def _variant(name: str, options: dict) -> tuple[str | None, dict]:
    """A variant's weight precision (None: as built) and its engine keyword arguments (see variant_args)."""
    v = dict(VARIANTS[name])
    weights = v.pop("weights", None)
    tuning = DecodeTuning(**v.pop("tuning", {}))
    return weights, dict(options=EngineOptions(**options, **v), tuning=tuning)


def variant_engine(name: str, hf_raw: dict, sd: dict, device, dtype, **options) -> Engine:
    """The native engine of a variant on the model's state dict; a variant with `weights` gets them quantized by the
    built-in recipe first (round to nearest: random weights have no activations worth calibrating on)."""
    from engine.quantize import builtin_plan, quantize_tensors

    weights, opts = _variant(name, options)
    cfg = parse_config(hf_raw)
    if weights is None:
        return Engine(cfg, sd.items(), device=device, dtype=dtype, **opts)
    plan, act_fp8 = builtin_plan(cfg, weights)
    tensors, qc, _ = quantize_tensors(cfg, sd, plan, act_fp8=act_fp8)
    return Engine(parse_config(dict(hf_raw, quantization_config=qc)), tensors.items(), device=device, dtype=dtype,
                  **opts)


def variant_short_names() -> dict[str, str]:
    """VARIANTS by the names the profiling scripts take: without "native_", "native" itself being "default"."""
    return {"default" if v == "native" else v.removeprefix("native_"): v for v in VARIANTS}


# Qwen3.5-4B (docs/model-architecture.md section 2)
REAL_TEXT = dict(vocab_size=248320, hidden_size=2560, intermediate_size=9216, num_hidden_layers=32,
                 num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                 linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                 linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                  "mrope_section": [11, 11, 10], "mrope_interleaved": True})
REAL_VISION = dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, in_channels=3, patch_size=16,
                   spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=2560, num_position_embeddings=2304)
TOKENS = dict(image_token_id=248056, video_token_id=248057, vision_start_token_id=248053, vision_end_token_id=248054)
IM_START, IM_END = 248045, 248046

TINY_TEXT = dict(REAL_TEXT, vocab_size=600, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                 linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                 max_position_embeddings=4096,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                  "mrope_section": [2, 1, 1], "mrope_interleaved": True})
TINY_VISION = dict(REAL_VISION, depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                   num_position_embeddings=64)
TINY_TOKENS = dict(image_token_id=500, video_token_id=503, vision_start_token_id=501, vision_end_token_id=502)


def hf_config(tiny: bool):
    from transformers import Qwen3_5Config

    tokens = TINY_TOKENS if tiny else TOKENS
    text = dict(TINY_TEXT if tiny else REAL_TEXT, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    return Qwen3_5Config(text_config=text, vision_config=TINY_VISION if tiny else REAL_VISION,
                         tie_word_embeddings=True, **tokens)


def build_hf_model(cfg, device, dtype):
    """transformers' model with its own random init, built directly on the device in `dtype`."""
    from transformers import Qwen3_5ForConditionalGeneration

    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3_5ForConditionalGeneration(cfg)
    finally:
        torch.set_default_dtype(default)
    return model.to(device=device, dtype=dtype).eval()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device, nbytes: int) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync(device)
    iters = 20
    t = time.perf_counter()
    for _ in range(iters):
        y.copy_(x)
    sync(device)
    return 2 * nbytes * iters / (time.perf_counter() - t)


# ---------------------------------------------------------------------------------------------------- workloads

def make_requests(kind: str, batch: int, args, cfg, rng, num_beams: int = 1) -> list[dict]:
    t, v = cfg.text, cfg.vision
    hi = min(240000, cfg.vision_start_token_id - 10)  # ordinary (non-special) token ids
    reqs = []
    for i in range(batch):
        words = rng.integers(0, hi, 64).tolist()
        if kind == "text":
            ids = rng.integers(0, hi, args.text_prompt).tolist()
            reqs.append(dict(prompt_token_ids=ids,
                             sampling=SamplingParams(max_tokens=args.text_gen, num_beams=num_beams)))
            continue
        side = int(math.isqrt(args.page_image_tokens))  # merged grid side; the patch grid is twice that
        n_img = side * side
        ids = ([IM_START % t.vocab_size] + words[:3] + [cfg.vision_start_token_id] + [cfg.image_token_id] * n_img
               + [cfg.vision_end_token_id] + words[3:11] + [IM_END % t.vocab_size] + words[11:14])
        grid = (1, 2 * side, 2 * side)
        pixels = rng.standard_normal((4 * n_img, v.patch_dim), dtype=np.float32)
        reqs.append(dict(prompt_token_ids=ids, pixel_values=pixels, image_grids=[grid],
                         sampling=SamplingParams(max_tokens=args.page_gen, num_beams=num_beams)))
    return reqs


def gen_len(kind, args):
    return args.text_gen if kind == "text" else args.page_gen


# ---------------------------------------------------------------------------------------------------- roofline

def decode_bytes(cfg, model, batch: int, context: float, dtype) -> dict:
    """Bytes one decode step must move: every text weight once in its stored format (the tied head once, as the LM
    head), the KV cache of the attention layers read, and GDN recurrent + conv state read and written, per
    sequence."""
    from engine.models.quant_linear import QuantWeight

    t = cfg.text
    elt = torch.finfo(dtype).bits // 8
    text_params = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                      if n.startswith("language_model.") and "embed_tokens" not in n)
    text_params += sum(m.nbytes() for m in model.language_model.modules() if isinstance(m, QuantWeight))
    head = model.head_weight.numel() * model.head_weight.element_size()
    n_attn, n_gdn = len(t.full_attention_layers), len(t.linear_attention_layers)
    kv = batch * context * n_attn * 2 * t.num_key_value_heads * t.head_dim * elt
    gdn = batch * n_gdn * 2 * (t.linear_num_value_heads * t.linear_key_head_dim * t.linear_value_head_dim * 4
                               + t.gdn_conv_dim * (t.linear_conv_kernel_dim - 1) * elt)
    return dict(weights=text_params + head, kv=kv, gdn_state=gdn, total=text_params + head + kv + gdn)


# ---------------------------------------------------------------------------------------------------- runners

def engine_options(max_batch: int, max_len: int, device, block: int = 32, **extra) -> dict:
    """EngineOptions fields of the benchmark's native engine: KV blocks for max_batch sequences of max_len tokens
    (rounded up to whole blocks), so no memory-budget probing and no preemption."""
    max_len = -(-max_len // block) * block
    return dict(max_num_seqs=max_batch, max_model_len=max_len, block_size=block,
                num_blocks=max_batch * (max_len // block) + 1,
                max_num_batched_tokens=8192 if device.type == "cuda" else 512, **extra)


def decode_step_times(step_log, batch: int) -> tuple[float, float, float, list]:
    """Medians over the logged decode steps of exactly `batch` sequences: wall period between consecutive step
    starts, device time (CUDA events; nan on CPU) and host launch time, in seconds; plus those step records."""
    dec = [r for r in step_log if not r.is_prefill and r.num_seqs == batch]
    periods = [b.t_start - a.t_start for a, b in zip(dec, dec[1:])]
    step_s = statistics.median(periods) if periods else float("nan")
    device_s = statistics.median([r.device_s for r in dec]) if dec and dec[0].device_s else float("nan")
    launch_s = statistics.median([r.t_launched - r.t_start for r in dec]) if dec else float("nan")
    return step_s, device_s, launch_s, dec


def run_native(engine: Engine, kind, batch, args, rng, bw, cfg, dtype, name="native",
               num_beams: int = 1) -> dict:
    """`batch` requests of `kind`, each a beam search of `num_beams` sequences when > 1 (ignore_eos: every beam
    runs to max_tokens), so a decode step runs batch * num_beams sequences."""
    reqs = make_requests(kind, batch, args, cfg, rng, num_beams)
    for r in reqs:
        r["ignore_eos"] = True
    # Warm-up at the same prompt shapes: one-time compilation for a new prefill size stays out of TTFT.
    engine.generate([dict(r, sampling=dataclasses.replace(r["sampling"], max_tokens=2)) for r in reqs])
    engine.step_log.clear()
    engine.record_steps = True
    sync(engine.device)
    t0 = time.perf_counter()
    outs = engine.generate(reqs)
    sync(engine.device)
    wall = time.perf_counter() - t0
    engine.record_steps = False
    errors = [o.error for o in outs if o.finish_reason == "error"]
    if errors:
        raise RuntimeError(f"native {kind} batch {batch}: {errors[0]}")
    rows = batch * num_beams
    step_s, device_s, launch_s, dec = decode_step_times(engine.step_log, rows)
    prompt = outs[0].prompt_tokens
    gen = gen_len(kind, args)
    roof = decode_bytes(cfg, engine.model, rows, prompt + gen / 2, dtype)
    roof_s = roof["total"] / bw
    total_out = sum(o.output_tokens for o in outs)
    return dict(
        engine=name, scenario=kind, batch=batch, num_beams=num_beams, prompt_tokens=prompt, output_tokens=gen,
        wall_s=wall, requests_per_s=batch / wall, total_tok_s=total_out / wall,
        per_seq_decode_tok_s=statistics.mean(o.decode_tokens_per_s for o in outs),
        ttft_ms_mean=1e3 * statistics.mean(o.ttft_s for o in outs),
        ttft_ms_p50=1e3 * statistics.median(o.ttft_s for o in outs),
        decode_step_ms=1e3 * step_s, decode_device_ms=1e3 * device_s, host_launch_ms=1e3 * launch_s,
        host_overhead_pct=100 * max(0.0, 1 - device_s / step_s) if device_s == device_s else None,
        decode_steps=len(dec), prefill_steps=sum(r.is_prefill for r in engine.step_log),
        roofline_bytes=roof, roofline_ms=1e3 * roof_s, roofline_ratio=step_s / roof_s)


class StepClock:
    """transformers logits processor that only timestamps each generation step."""

    def __init__(self, device):
        self.device, self.times = device, []

    def __call__(self, input_ids, scores):
        sync(self.device)
        self.times.append(time.perf_counter())
        return scores


def run_transformers(model, kind, batch, args, rng, cfg, device, dtype) -> dict:
    from transformers import LogitsProcessorList

    reqs = make_requests(kind, batch, args, cfg, rng)
    ids = torch.tensor([r["prompt_token_ids"] for r in reqs], device=device)
    kw = {}
    if kind == "page":
        kw = dict(pixel_values=torch.from_numpy(np.concatenate([r["pixel_values"] for r in reqs])).to(device, dtype),
                  image_grid_thw=torch.tensor([r["image_grids"][0] for r in reqs], device=device),
                  mm_token_type_ids=(ids == cfg.image_token_id).int())
    new = min(gen_len(kind, args), args.hf_max_new)
    with torch.no_grad():  # warm-up at the same shapes: fla autotunes its kernels on first use
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, eos_token_id=[], pad_token_id=0, **kw)
    clock = StepClock(device)
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, eos_token_id=[], pad_token_id=0, logits_processor=LogitsProcessorList([clock]),
                       **kw)
    sync(device)
    wall = time.perf_counter() - t0
    steps = [b - a for a, b in zip(clock.times, clock.times[1:])]
    step_s = statistics.median(steps) if steps else float("nan")
    ttft = clock.times[0] - t0
    full = gen_len(kind, args)
    return dict(engine="transformers", scenario=kind, batch=batch, prompt_tokens=ids.shape[1], output_tokens=new,
                wall_s=wall, total_tok_s=batch * new / wall, per_seq_decode_tok_s=1 / step_s,
                ttft_ms_mean=1e3 * ttft, ttft_ms_p50=1e3 * ttft, decode_step_ms=1e3 * step_s,
                # what a run to the full output length would give, from the measured TTFT and step time
                total_tok_s_at_full_gen=batch * full / (ttft + (full - 1) * step_s))


# ---------------------------------------------------------------------------------------------------- report

def plot(results: list[dict], path: Path) -> None:
    """Two bar panels drawn with PIL: decode ms/step (each native engine variant in the order run, transformers, the
    roofline of the first) and total tokens/s (the first native variant, transformers)."""
    from PIL import Image, ImageDraw

    groups = sorted({(r["scenario"], r["batch"]) for r in results})
    engines = list(dict.fromkeys(r["engine"] for r in results if r["engine"] != "transformers"))
    first = engines[0] if engines else "native"
    palette = [(31, 119, 180), (148, 103, 189), (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34),
               (23, 190, 207), (214, 39, 40)]
    series = [(e, "decode_step_ms", palette[i % len(palette)]) for i, e in enumerate(engines)]
    series += [("transformers", "decode_step_ms", (255, 127, 14)), ("roofline", "roofline_ms", (44, 160, 44))]
    step = 90 + 25 * max(0, len(series) - 3)
    W, H, pad = 200 + step * len(groups), 760, 60
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)

    def value(engine, key, g):
        src = first if engine == "roofline" else engine
        r = next((r for r in results if r["engine"] == src and (r["scenario"], r["batch"]) == g), None)
        v = r.get(key) if r else None
        return v if isinstance(v, (int, float)) and v == v and v > 0 else None

    panels = [("decode ms/step (log)", series),
              ("total tokens/s (log; transformers extrapolated to the full output length)",
               [(first, "total_tok_s", series[0][2]), ("transformers", "total_tok_s_at_full_gen", (255, 127, 14))])]
    for p, (title, ser) in enumerate(panels):
        top, bottom = pad + p * (H // 2), (p + 1) * (H // 2) - 40
        vals = [value(e, k, g) for e, k, _ in ser for g in groups]
        vals = [v for v in vals if v]
        if not vals:
            continue
        lo, hi = math.log10(min(vals)) - 0.2, math.log10(max(vals)) + 0.2
        d.text((pad, top - 40), title, fill="black")
        d.line([(pad, bottom), (W - 20, bottom)], fill="black")
        for gi, g in enumerate(groups):
            x0 = pad + 10 + gi * step
            d.text((x0, bottom + 5), f"{g[0]} b{g[1]}", fill="black")
            for si, (e, k, color) in enumerate(ser):
                v = value(e, k, g)
                if v is None:
                    continue
                h = (math.log10(v) - lo) / (hi - lo) * (bottom - top)
                d.rectangle([x0 + si * 25, bottom - h, x0 + si * 25 + 20, bottom], fill=color)
                d.text((x0 + si * 25, bottom - h - 12), f"{v:.3g}", fill="black")
        for si, (e, _, color) in enumerate(ser):
            d.rectangle([W - 150, top - 40 + si * 14, W - 140, top - 30 + si * 14], fill=color)
            d.text((W - 135, top - 42 + si * 14), e, fill="black")
    img.save(path)


def model_shape_args(doc: str) -> argparse.ArgumentParser:
    """The arguments every 4B-shape GPU script shares: device, dtype, --tiny, --out."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run) instead of Qwen3.5-4B")
    ap.add_argument("--out", required=True)
    return ap


def main(argv=None):
    ap = model_shape_args(__doc__)
    ap.add_argument("--scenarios", default="text,page")
    ap.add_argument("--batch-sizes", default=None, help="default 1,8,32,64 (tiny: 1,4)")
    ap.add_argument("--text-prompt", type=int, default=None)
    ap.add_argument("--text-gen", type=int, default=None)
    ap.add_argument("--page-image-tokens", type=int, default=None, help="merged image tokens (a square grid)")
    ap.add_argument("--page-gen", type=int, default=None)
    ap.add_argument("--hf-max-new", type=int, default=128,
                    help="transformers generates at most this many tokens per run (its per-step time is steady)")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--enforce-eager", action="store_true", help="native engine without CUDA graphs")
    ap.add_argument("--no-compile", action="store_true", help="native engine without torch.compile'd glue ops")
    ap.add_argument("--variants", default="native",
                    help=f"native engine variants, the first is the reference of the output checks: {', '.join(VARIANTS)}")
    ap.add_argument("--check-tokens", type=int, default=32,
                    help="greedy tokens of the output checks between variants (4 text prompts)")
    args = ap.parse_args(argv)
    tiny = args.tiny
    defaults = dict(text_prompt=(40, 512), text_gen=(16, 256), page_image_tokens=(16, 1296), page_gen=(12, 750))
    for k, (small, big) in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, small if tiny else big)
    batches = [int(b) for b in (args.batch_sizes or ("1,4" if tiny else "1,8,32,64")).split(",")]
    scenarios = args.scenarios.split(",")
    device = torch.device(args.device)
    dtype = resolve_dtype(args.dtype, device)  # default: bf16 on CUDA, fp32 on CPU
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    bw = copy_bandwidth(device, (2 << 30) if device.type == "cuda" else (64 << 20))
    hf_cfg = hf_config(tiny)
    cfg = parse_config(hf_cfg.to_dict())
    hf = build_hf_model(hf_cfg, device, dtype)
    opts = engine_options(max(batches), max(args.text_prompt + max(args.text_gen, args.check_tokens),
                                            args.page_image_tokens + 24 + args.page_gen),
                          device, enforce_eager=args.enforce_eager, compile=not args.no_compile)
    block, max_len = opts["block_size"], opts["max_model_len"]
    t = time.perf_counter()
    engine = Engine(cfg, hf.state_dict().items(), device=device, dtype=dtype, options=EngineOptions(**opts))
    build_s = time.perf_counter() - t
    meta = dict(device=str(device), gpu=harness.device_name(device), dtype=str(dtype), tiny=tiny,
                fla_available=fla_available(), copy_bandwidth_GBps=bw / 1e9, cuda_graphs=bool(engine.runner.graphs),
                engine_build_s=build_s, compiled_glue=engine.model.language_model.layers[0].mixer.glue.compiled,
                kv_blocks=engine.runner.cache.num_blocks, block_size=block, max_model_len=max_len,
                args=vars(args), torch=torch.__version__, host=platform.node())
    results = []
    rng = np.random.default_rng(0)
    written = harness.ResultFile(out / "benchmark.json", harness.result_meta(
        __file__, f"the native engine ({args.variants})"
        + ("" if args.skip_transformers else " against transformers")
        + f", {'tiny' if tiny else 'Qwen3.5-4B'} shape, random weights, {str(dtype).removeprefix('torch.')}, "
        f"{' and '.join(scenarios)} scenarios at batch {', '.join(map(str, batches))}: tok/s, TTFT, decode ms per "
        f"step, host overhead, the decode roofline", argv, device))

    def record(r):  # the JSON is rewritten after every run, so a later failure keeps what was measured
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "roofline_bytes"}), flush=True)
        written.write(dict(meta=meta, results=results), indent=2)

    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown --variants {unknown}; choose from {list(VARIANTS)}")
    meta["variant_options"] = {v: VARIANTS[v] for v in variants}
    if variants[0] != "native":  # the engine built above is the default one
        engine = None
    check_reqs = [dict(r, ignore_eos=True, keep_logits=True, sampling=SamplingParams(max_tokens=args.check_tokens))
                  for r in make_requests("text", 4, args, cfg, np.random.default_rng(1))]
    checks = {}
    for name in variants:
        if engine is None:
            engine = variant_engine(name, hf_cfg.to_dict(), hf.state_dict(), device, dtype, **opts)
        if len(variants) > 1:
            checks[name] = engine.generate([dict(r) for r in check_reqs])
            if name != variants[0]:  # written now: a run cut short keeps the checks of the variants it reached
                meta.setdefault("output_checks", {})[f"{variants[0]} vs {name}"] = compare_outputs(
                    checks[variants[0]], checks[name])
                print("output_check", name, json.dumps(meta["output_checks"][f"{variants[0]} vs {name}"]),
                      flush=True)
        for kind in scenarios:  # warm-up: compiles kernels and autotunes for this scenario's shapes
            engine.generate([dict(r, ignore_eos=True, sampling=SamplingParams(max_tokens=4))
                             for r in make_requests(kind, min(2, max(batches)), args, cfg, rng)])
            for b in batches:
                record(run_native(engine, kind, b, args, rng, bw, cfg, dtype, name))
        engine = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    written.write(dict(meta=meta, results=results), indent=2)
    if not args.skip_transformers:
        for kind in scenarios:
            run_transformers(hf, kind, 1, dict_args(args, hf_max_new=2), rng, cfg, device, dtype)  # warm-up
            for b in batches:
                try:
                    r = run_transformers(hf, kind, b, args, rng, cfg, device, dtype)
                except torch.cuda.OutOfMemoryError as e:  # record and go on: the native results stand
                    record(dict(engine="transformers", scenario=kind, batch=b, error=f"out of memory: {e}"[:300]))
                    torch.cuda.empty_cache()
                    continue
                for nat in [x for x in results if x["engine"] in VARIANTS and (x["scenario"], x["batch"]) == (kind, b)]:
                    nat["speedup_step_vs_transformers"] = r["decode_step_ms"] / nat["decode_step_ms"]
                    nat["speedup_total_tok_s_vs_transformers"] = nat["total_tok_s"] / r["total_tok_s_at_full_gen"]
                record(r)
    plot(results, out / "benchmark.png")
    print(f"wrote {out / 'benchmark.json'} and {out / 'benchmark.png'}")
    return results


def compare_outputs(ref, other) -> dict:
    """Greedy outputs of two native variants: per request, how many leading tokens agree, and the largest logit
    difference over those steps (random weights in bf16 can make near-ties flip, so a late divergence with small
    logit differences is rounding; an early one with large differences is a bug)."""
    agree, max_diff = [], 0.0
    for a, b in zip(ref, other):
        n = next((i for i, (x, y) in enumerate(zip(a.output_token_ids, b.output_token_ids)) if x != y),
                 min(a.output_tokens, b.output_tokens))
        agree.append(n)
        steps = max(1, n)  # the logits of the first differing step are comparable too
        steps = min(steps + 1, a.logits.shape[0], b.logits.shape[0])
        max_diff = max(max_diff, float((a.logits[:steps].float() - b.logits[:steps].float()).abs().max()))
    margins = []  # ref's top-2 logit margin where the two first differ: a near-tie when small
    for a, n in zip(ref, agree):
        if n < a.logits.shape[0] and n < a.output_tokens:
            top2 = a.logits[n].float().topk(2).values
            margins.append(float(top2[0] - top2[1]))
    return dict(tokens=[o.output_tokens for o in ref], leading_tokens_equal=agree, divergence_top2_margins=margins,
                all_equal=all(a.output_token_ids == b.output_token_ids for a, b in zip(ref, other)),
                max_abs_logit_diff=max_diff)


def dict_args(args, **over):
    ns = argparse.Namespace(**vars(args))
    for k, v in over.items():
        setattr(ns, k, v)
    return ns


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
