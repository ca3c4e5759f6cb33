"""Where the device time of one decode step of the native engine goes (Qwen3.5-4B shape, random weights, bf16).

For each variant (bench.engine_bench.variant_short_names: VARIANTS without the "native_" prefix, "native" being
"default") and batch size, in one process:
  1. `--batch-sizes` text requests (random `--prompt`-token prompts) are stepped until all of them decode;
  2. the engine's normal path (CUDA graph replay) is timed over `--graph-steps` steps, as bench/engine_bench.py does;
  3. `--steps` more steps run EAGERLY (the graphs are set aside, so the same kernels launch one by one) under
     torch.profiler: each kernel is attributed to the op that launched it (GEMM shapes from record_shapes) and to
     the layer kind around that op (profiler ranges around each layer's forward).
Reported per run: roofline ms (bench.engine_bench.decode_bytes over the copy bandwidth measured here), graph step ms,
the sum of eager kernel times, GEMM time and share, kernels per step, per-category "gap" = kernel time - bytes /
bandwidth (GEMMs are charged their weight + activation bytes, our Triton kernels the KV + GDN state bytes, the rest
nothing), achieved bandwidth per GEMM weight, the top kernels. Eager kernel times stand in for the graph's: the same
kernels, but without the graph's launch packing, so "graph - kernel sum" is what the graph adds between kernels.

    python bench/decode_profile.py --out $OUT/prof                      # 4B shape, bf16, CUDA (H200)
    python bench/decode_profile.py --tiny --device cpu --out /tmp/prof  # CPU smoke: leaf CPU ops stand in for kernels
    python bench/decode_profile.py --spec 16 --variants default --batch-sizes 1,32 --out $OUT/prof_spec  # speculative

Writes <out>/decode_profile.json (meta + one record per variant and batch size).
"""
from __future__ import annotations

import argparse
import gc
import math
import re
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import triton
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from bench.op_names import NO_DEVICE_WORK  # noqa: E402
from engine.config import parse_config  # noqa: E402
from engine.llm_engine import Engine  # noqa: E402
from engine.model_runner import resolve_dtype  # noqa: E402
from engine.models.gdn_prefill import fla_available  # noqa: E402
from engine.quantize import builtin_plan, quantize_tensors  # noqa: E402
from engine.sequence import SeqStatus  # noqa: E402
from bench import engine_bench as eb  # noqa: E402

SCOPE = "prof::"  # prefix of our profiler ranges
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::_scaled_mm"}
GEMM_NAME = re.compile(r"gemm|gemv|nvjet|cutlass|xmma|splitkreduce|cublas|small_m_linear", re.IGNORECASE)  # cuBLAS(Lt), ours
# CPU fallback only: aten ops doing no work of their own (views, allocations, no-op casts); GEMM ops stand for their
# kernel there (their children are bookkeeping)
NO_WORK = {"aten::" + n for n in NO_DEVICE_WORK}
CPU_GEMMS = {"aten::mm", "aten::addmm", "aten::bmm"}
DEVICE_WORK = {"kernel", "gpu_memcpy", "gpu_memset"}  # activity types of device events that are work, not spans


def prof_range(name: str):
    """A profiler range of FUNCTION scope (torch's _RecordFunctionFast, as inductor uses): the profiler links a
    kernel to the innermost such range or op around its launch, so Triton kernels launched inside a layer's range are
    listed under it. A record_function range is USER scope and takes no part in that linking (fallback only)."""
    fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
    return fast(SCOPE + name) if fast is not None else record_function(SCOPE + name)


def our_triton_kernels() -> set[str]:
    """Names of the @triton.jit functions behind engine.ops (a Triton kernel's profiler name is its function's)."""
    from triton.runtime.jit import KernelInterface

    from engine import ops
    mods = {sys.modules[getattr(ops, n).__module__] for n in ops.__all__}
    return {k for m in mods for k, v in vars(m).items() if isinstance(v, KernelInterface)}


def ranged(fn, name):
    def call(*a, **k):
        with prof_range(name):
            return fn(*a, **k)
    return call


@contextmanager
def eager_and_ranged(engine):
    """Decode without CUDA graphs, inside named ranges. run_decode replays a graph only if one exists for the padded
    size: without them the same _decode_forward (same padding, same kernels) runs eagerly and the profiler sees each
    kernel on its own. Ranges: the decode forward ("embed+rope": what no inner range claims), each decoder layer
    (named by its kind), the final norm + LM head; a kernel belongs to the innermost range around its launching op."""
    runner, model, lm = engine.runner, engine.model, engine.model.language_model
    patched = [(layer, "forward", layer.kind) for layer in lm.layers] + [
        (lm.norm, "forward", "norm+head"), (runner, "_decode_forward", "embed+rope"),
        (model, "compute_logits", "norm+head")]
    spec = engine.spec
    if spec is not None:  # a speculative step: its draft pass, the drafter's context write, the commit
        patched += [(spec, "step", "spec step (inputs, accept)"), (spec, "propose", "draft"),
                    (spec.drafter, "write_context", "drafter context"), (spec, "commit", "commit")]
    for obj, attr, name in patched:
        setattr(obj, attr, ranged(getattr(obj, attr), name))  # an instance attribute shadows the method
    graphs, runner.graphs = runner.graphs, {}
    spec_graphs = spec.graphs if spec is not None else None
    if spec is not None:
        spec.graphs = None  # the eager step: the same kernels as the captured greedy step, launched one by one
    try:
        yield
    finally:
        runner.graphs = graphs
        if spec is not None:
            spec.graphs = spec_graphs
        for obj, attr, _ in patched:
            delattr(obj, attr)


def ancestors(ev):
    while ev is not None:
        yield ev
        ev = ev.cpu_parent


def scope_of(op) -> str:
    if op is None:
        return "unlinked"
    return next((e.name[len(SCOPE):] for e in ancestors(op) if e.name.startswith(SCOPE)), "step (inputs, sampler)")


def gemm_of(op):
    """The GEMM op at or above `op` (a cuBLAS kernel is listed under aten::mm itself), below our ranges."""
    for e in ancestors(op):
        if e.name.startswith(SCOPE):
            return None
        if e.name in GEMM_OPS:
            return e
    return None


def gemm_shape(op) -> tuple[int, int, int] | None:
    """(M, K, N) from the recorded shapes: mm/addmm/matmul multiply [M, K] @ [K, N], linear [M, K] by [N, K]^T;
    _scaled_mm's first two matrices are the operands (its row-wise scales, [M, 1] and [1, N], come after)."""
    mats = [s for s in (op.input_shapes or []) if len(s) == 2]
    if len(mats) < 2:
        return None
    (m, k), b = mats[:2] if op.name == "aten::_scaled_mm" else mats[-2:]
    return m, k, (b[0] if op.name == "aten::linear" else b[1])


def kernel_records(events) -> tuple[list[tuple], dict]:
    """(name, µs, launching op) per kernel. torch.profiler lists a kernel under the CPU op that launched it; a kernel
    it could not link is kept with op None. Without device events (CPU) the leaf aten ops stand in."""
    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    user = {e.name for e in cpu if getattr(e, "is_user_annotation", False)}

    def is_work(e):  # a kernel, memcpy or memset; not the device-side span of a user range
        kind = getattr(e, "activity_type", None)
        return kind in DEVICE_WORK if kind else e.name not in user and not e.name.startswith(SCOPE)

    device = [e for e in events if e.device_type != DeviceType.CPU and is_work(e)]
    # only spans are listed under user ranges (which the profiler does not link kernels to)
    recs = [(k.name, k.duration, e) for e in cpu if not getattr(e, "is_user_annotation", False) for k in e.kernels]
    if device:
        ops = {e.id for e in cpu if not e.is_async and not getattr(e, "linked_correlation_id", 0)}
        unlinked = [(e.name, e.time_range.elapsed_us(), None) for e in device
                    if getattr(e, "linked_correlation_id", None) is not None and e.linked_correlation_id not in ops]
        listed = sum(r[1] for r in recs + unlinked)
        return recs + unlinked, dict(
            source="device kernels", unlinked_us=sum(r[1] for r in unlinked),
            uncounted_us=sum(e.time_range.elapsed_us() for e in device) - listed,
            span_us=max(e.time_range.end for e in device) - min(e.time_range.start for e in device))
    for e in cpu:
        busy = [c for c in e.cpu_children if c.name.startswith("aten::") and c.name not in NO_WORK]
        if e.name in CPU_GEMMS or (e.name.startswith("aten::") and e.name not in NO_WORK and not busy
                                   and not any(a.name in CPU_GEMMS for a in ancestors(e.cpu_parent))):
            recs.append((e.name, e.time_range.elapsed_us(), e))
    return recs, dict(source="cpu ops (no device events)")


def category(name: str, gemm, ours: set[str]) -> str:
    if gemm is not None or GEMM_NAME.search(name):
        return "gemm"
    if name.startswith(("Memcpy", "Memset")):
        return "memcpy/memset"
    if name in ours:
        return "triton (ours)"
    return "inductor" if name.startswith("triton_") else "torch (aten)"


def weight_labels(model) -> dict:
    """(layer kind, N, K) -> weight name, to say which matrix a GEMM multiplies (o_proj and GDN out_proj share a
    shape at 4B: the layer kind tells them apart)."""
    lm, out = model.language_model, defaultdict(set)
    for name, p in lm.layers.named_parameters():
        if p.dim() == 2:
            i, short = name.split(".", 1)
            out[(lm.layers[int(i)].kind, *p.shape)].add(short.rsplit(".", 1)[0])
    out[("norm+head", *model.head_weight.shape)].add("lm_head")
    return {k: "|".join(sorted(v)) for k, v in out.items()}  # "a|b": two weights of one kind share the shape


def table(rows: dict, per_step: float) -> dict:
    """{key: [count, µs]} -> {key: {per_step, us_per_step, mean_us}}, largest time first."""
    return {k: dict(per_step=n * per_step, us_per_step=us * per_step, mean_us=us / n)
            for k, (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])}


def tally(recs, ours: set[str]):
    """Kernel records -> their [count, µs] by kernel name, category and scope, each name's category, and the GEMMs'
    [launching ops, µs] by (scope, (M, K, N) or None)."""
    kern, cats, scopes = (defaultdict(lambda: [0, 0.0]) for _ in range(3))
    kind, gemms = {}, defaultdict(lambda: [set(), 0.0])
    for name, us, op in recs:
        g = gemm_of(op)
        cat, scope = category(name, g, ours), scope_of(op)
        kind[name] = cat
        for acc, key in ((kern, name), (cats, cat), (scopes, scope)):
            acc[key][0] += 1
            acc[key][1] += us
        if cat == "gemm":
            row = gemms[(scope, gemm_shape(g) if g is not None else None)]
            row[0].add(id(g))  # calls = launching ops (a split-K GEMM is two kernels of one call)
            row[1] += us
    return kern, cats, scopes, kind, gemms


def summarise(recs, info, steps, bw, roof, labels, elt, ours, layers) -> dict:
    """Per-step totals by kernel name, category, scope and GEMM shape, and the bytes each category must move."""
    ps = 1.0 / steps

    def ms(us):  # µs over all profiled steps -> ms per step
        return None if us is None else us * ps / 1e3

    kern, cats, scopes, kind, gemms = tally(recs, ours)
    gemm_rows = []
    for (scope, shape), (calls, us) in sorted(gemms.items(), key=lambda kv: -kv[1][1]):
        m, k, n = shape or (None, None, None)
        b = (m * k + k * n + m * n) * elt if shape else None  # per call: the weight + activations in and out
        gemm_rows.append(dict(scope=scope, weight=labels.get((scope, n, k), "?"), M=m, K=k, N=n,
                              calls_per_step=len(calls) * ps, us_per_step=us * ps, mean_us=us / len(calls),
                              MB_per_call=b / 1e6 if b else None, GBps=b * len(calls) / us / 1e3 if b else None))
    # GEMM bytes from the shapes when every GEMM was mapped to one, else the model's weight bytes
    shaped = bool(gemm_rows) and all(r["MB_per_call"] for r in gemm_rows)
    gemm_bytes = sum(r["MB_per_call"] * 1e6 * r["calls_per_step"] for r in gemm_rows) if shaped else roof["weights"]
    state_cat = "triton (ours)" if "triton (ours)" in cats else "torch (aten)"  # on CPU: the torch references
    categories = {}
    for cat, row in table(cats, ps).items():
        nbytes = gemm_bytes if cat == "gemm" else roof["kv"] + roof["gdn_state"] if cat == state_cat else 0
        categories[cat] = dict(kernels_per_step=row["per_step"], ms=row["us_per_step"] / 1e3, MB=nbytes / 1e6,
                               ideal_ms=1e3 * nbytes / bw, gap_ms=row["us_per_step"] / 1e3 - 1e3 * nbytes / bw)
    total_ms = ms(sum(us for _, us, _ in recs))
    gemm_ms = categories.get("gemm", {}).get("ms", 0.0)
    return dict(
        profile_source=info["source"], kernels_per_step=len(recs) * ps, kernel_sum_ms=total_ms,
        unlinked_ms=ms(info.get("unlinked_us")), uncounted_ms=ms(info.get("uncounted_us")),
        span_ms=ms(info.get("span_us")),
        gemm_ms=gemm_ms, gemm_share=gemm_ms / total_ms if total_ms else 0.0, gemm_MB=gemm_bytes / 1e6,
        gemm_bytes_source="gemm shapes" if shaped else "model weight bytes", weight_MB=roof["weights"] / 1e6,
        gemm_GBps=gemm_bytes / gemm_ms / 1e6 if gemm_ms else None,
        gap_ms=sum(c["gap_ms"] for c in categories.values()), categories=categories,
        scopes={s: dict(r, layers=layers.get(s, 1), ms_per_layer=r["us_per_step"] / 1e3 / layers.get(s, 1))
                for s, r in table(scopes, ps).items()},
        kernels=[dict(r, name=n[:300], category=kind[n]) for n, r in table(kern, ps).items()], gemms=gemm_rows)


def gen_tokens(args) -> int:
    """Tokens each request may generate: every step of the run, at the most tokens a step can emit (a speculative
    step up to its block), so that no step near the end runs with a shortened block or a finished sequence."""
    return (2 * args.warmup + args.graph_steps + args.steps + 4) * max(1, args.spec)


def profile_batch(engine, batch, args, cfg, dtype, bw, rng, ours) -> dict:
    """Requests to decoding, graph-replayed timing, then the eager profile; the requests are aborted afterwards."""
    gen = gen_tokens(args)
    reqs = eb.make_requests("text", batch, argparse.Namespace(text_prompt=args.prompt, text_gen=gen), cfg, rng)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for rid, r in zip(ids, reqs):
        engine.add_request(rid, **r, ignore_eos=True)
    for _ in range(1000):  # prefill (in chunks) until every request decodes
        if sum(s.status == SeqStatus.DECODING for s in engine.scheduler.running) == batch:
            break
        engine.step()
    for _ in range(args.warmup):
        engine.step()
    engine.step_log.clear()
    engine.record_steps = True
    for _ in range(args.graph_steps):
        engine.step()
    engine.record_steps = False
    step_s, device_s, _, _ = eb.decode_step_times(engine.step_log, batch)
    with eager_and_ranged(engine):
        for _ in range(args.warmup):
            engine.step()
        eb.sync(engine.device)  # nothing queued from before the profile
        context = float(np.mean([len(s) for s in engine.scheduler.running])) + args.steps / 2  # mean over the steps
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
        with profile(activities=acts, record_shapes=True) as prof:
            for _ in range(args.steps):
                engine.step()
            eb.sync(engine.device)
    for rid in ids:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    roof = eb.decode_bytes(cfg, engine.model, batch, context, dtype)
    layers = {k: sum(layer.kind == k for layer in engine.model.language_model.layers)
              for k in ("full_attention", "linear_attention")}
    res = summarise(*kernel_records(prof.events()), args.steps, bw, roof, weight_labels(engine.model),
                    torch.finfo(dtype).bits // 8, ours, layers)
    roof_ms, graph_ms = 1e3 * roof["total"] / bw, 1e3 * step_s
    return dict(batch=batch, context=context, steps_profiled=args.steps, cuda_graphs=bool(engine.runner.graphs),
                roofline_ms=roof_ms, roofline_MB={k: v / 1e6 for k, v in roof.items()}, graph_step_ms=graph_ms,
                graph_device_ms=None if math.isnan(device_s) else 1e3 * device_s,  # nan: no CUDA events (CPU)
                graph_vs_roofline=graph_ms / roof_ms,
                graph_minus_kernels_ms=graph_ms - res["kernel_sum_ms"], **res)


def show(title: str, cols: str, rows) -> None:
    """A table: `cols` space-separated headers (the first left-aligned), rows of pre-formatted cells."""
    head = cols.split()
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    print(title)
    for row in [head, *rows]:
        print("  " + "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))))


def f(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def print_run(r: dict, top: int) -> None:
    print(f"\n== {r['variant']} b{r['batch']}, context {r['context']:.0f}, {r['profile_source']}, graph step "
          f"{'replayed' if r['cuda_graphs'] else 'eager (no CUDA graphs)'}; GEMM bytes from "
          f"{r['gemm_bytes_source']}; kernels not linked to an op {f(r['unlinked_ms'])} ms, device time not counted "
          f"{f(r['uncounted_ms'])} ms, eager span {f(r['span_ms'])} ms")
    show("per category (gap = ms - MB / copy bandwidth)", "category kernels/step ms MB ideal_ms gap_ms",
         [(c, f(v["kernels_per_step"], ".1f"), f(v["ms"]), f(v["MB"], ".1f"), f(v["ideal_ms"]), f(v["gap_ms"]))
          for c, v in r["categories"].items()])
    show("per scope", "scope kernels/step ms layers ms/layer",
         [(s, f(v["per_step"], ".1f"), f(v["us_per_step"] / 1e3), v["layers"], f(v["ms_per_layer"], ".4f"))
          for s, v in r["scopes"].items()])
    show("GEMMs (bytes = weight + activations)", "scope_weight M,K,N calls/step ms mean_us GB/s",
         [(f"{g['scope']} {g['weight']}", f"{g['M']},{g['K']},{g['N']}", f(g["calls_per_step"], ".1f"),
           f(g["us_per_step"] / 1e3), f(g["mean_us"], ".1f"), f(g["GBps"], ".0f")) for g in r["gemms"]])
    show(f"top {top} kernels", "name category per_step us/step mean_us",
         [(k["name"][:90], k["category"], f(k["per_step"], ".1f"), f(k["us_per_step"], ".1f"), f(k["mean_us"], ".2f"))
          for k in r["kernels"][:top]])


def print_summary(runs: list[dict]) -> None:
    show("\nsummary (ms per decode step; kernel times from the eager profile)",
         "variant batch roofline graph graph/roof kernel_sum kernels GEMM GEMM% GEMM_GB/s gap graph-kernels",
         [(r["variant"], r["batch"], f(r["roofline_ms"]), f(r["graph_step_ms"]), f(r["graph_vs_roofline"], ".2f"),
           f(r["kernel_sum_ms"]), f(r["kernels_per_step"], ".0f"), f(r["gemm_ms"]), f(100 * r["gemm_share"], ".0f"),
           f(r["gemm_GBps"], ".0f"), f(r["gap_ms"]), f(r["graph_minus_kernels_ms"])) for r in runs])


def main(argv=None):
    ap = eb.model_shape_args(__doc__)
    ap.add_argument("--variants", default="default")
    ap.add_argument("--precisions", default="bf16",
                    help="decoder weights: bf16, fp8, nvfp4 (engine/quantize.py's built-in recipes, round to nearest)")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 512 as the benchmark, tiny 32)")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="default 2080 (tiny 256): the benchmark's, which sizes the paged-attention partitions")
    ap.add_argument("--steps", type=int, default=None, help="eager decode steps profiled (default 20, tiny 8)")
    ap.add_argument("--graph-steps", type=int, default=None, help="graph-replayed steps timed (default 50, tiny 10)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--spec", type=int, default=0, metavar="BLOCK",
                    help="profile speculative steps instead: a random drafter of the shipped drafter's shape (4 layers, "
                         "4 taps) at this block; a step then emits 1-BLOCK tokens (the roofline stays a plain step's)")
    args = ap.parse_args(argv)
    args.prompt = args.prompt or (32 if args.tiny else 512)
    args.max_model_len = args.max_model_len or (256 if args.tiny else 2080)
    args.steps = args.steps or (8 if args.tiny else 20)
    args.graph_steps = args.graph_steps or (10 if args.tiny else 50)
    batches, variants = [int(b) for b in args.batch_sizes.split(",")], args.variants.split(",")
    names = eb.variant_short_names()
    if not set(variants) <= set(names):
        ap.error(f"--variants: some of {', '.join(names)}, got {args.variants}")
    if args.graph_steps < 3 or args.steps < 1:
        ap.error("--graph-steps must be >= 3 (a median over step periods) and --steps >= 1")
    if args.prompt + gen_tokens(args) > args.max_model_len:
        ap.error(f"--max-model-len {args.max_model_len} is less than the prompt ({args.prompt}) plus the tokens the "
                 f"steps may generate ({gen_tokens(args)}): raise it or take fewer steps")
    device = torch.device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    bw = eb.copy_bandwidth(device, (2 << 30) if device.type == "cuda" else (64 << 20))
    hf_cfg = eb.hf_config(args.tiny)
    cfg = parse_config(hf_cfg.to_dict())
    hf = eb.build_hf_model(hf_cfg, device, dtype)
    # decode needs no vision tower: a text-only engine builds faster and leaves the memory to the rest
    weights = {n: t for n, t in hf.state_dict().items() if not n.startswith("model.visual.")}
    opts = eb.engine_options(max(batches), args.max_model_len, device, text_only=True)
    if args.spec:
        from engine.testing import write_random_drafter

        opts["speculative"] = dict(drafter=str(write_random_drafter(out / "drafter", cfg.text, num_layers=4,
                                                                    num_taps=4, block_size=args.spec, dtype=dtype)))
    meta = dict(device=str(device), gpu=harness.device_name(device),
                dtype=str(dtype), tiny=args.tiny, torch=torch.__version__, triton=triton.__version__,
                fla_available=fla_available(), copy_bandwidth_GBps=bw / 1e9, engine_options=opts, args=vars(args))
    step = f"speculative step (a random drafter, block {args.spec})" if args.spec else "decode step"
    results = harness.ResultFile(out / "decode_profile.json", harness.result_meta(
        __file__, f"where one {step}'s device time goes ({'tiny' if args.tiny else '4B'} shape, random weights, "
        f"{str(dtype).removeprefix('torch.')}), per precision, variant and batch: graph step time, eager kernels by "
        f"category, scope and GEMM, against the roofline", argv, device))
    ours, runs, rng = our_triton_kernels(), [], np.random.default_rng(0)
    for precision, variant in [(p, v) for p in args.precisions.split(",") for v in variants]:
        t = time.perf_counter()
        pcfg, pweights = cfg, weights
        if precision != "bf16":
            plan, act_fp8 = builtin_plan(cfg, precision)
            pweights, qc, _ = quantize_tensors(cfg, weights, plan, act_fp8=act_fp8)
            pcfg = parse_config(dict(hf_cfg.to_dict(), quantization_config=qc))
        engine = Engine(pcfg, pweights.items(), device=device, dtype=dtype,
                        **eb.variant_args(names[variant], **opts))
        del pweights
        name = variant if precision == "bf16" else f"{precision}:{variant}"
        meta[f"engine_build_s_{name}"] = time.perf_counter() - t
        for b in batches:
            runs.append(dict(variant=name, **profile_batch(engine, b, args, cfg, dtype, bw, rng, ours)))
            print_run(runs[-1], args.top)
            results.write(dict(meta=meta, runs=runs))
        del engine  # weights, caches and graph pools go before the next variant's engine is built
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_summary(runs)
    print(f"wrote {out / 'decode_profile.json'}")
    return dict(meta=meta, runs=runs)


if __name__ == "__main__":
    main()
