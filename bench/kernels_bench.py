"""GPU microbenchmark of the decode kernels at the Qwen3.5-4B shapes.

For every op and batch size: relative error of Triton vs the torch reference, median times (triton.testing) of the
reference (eager), the Triton op (eager, and replayed in a CUDA graph, which is how the engine runs it), the bytes the
op must move at minimum, and the achieved bandwidth as a fraction of a device-to-device copy measured in the same run.
A few launch configurations of the heavier kernels are swept too, so defaults can be set from data.

    python3 bench/kernels_bench.py --out $OUT/kernels.json          # on the GPU machine
    python3 bench/kernels_bench.py --dry-run --out /tmp/k.json       # CPU smoke test: tiny shapes, references only
"""
import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import harness  # noqa: E402
from kernels import conv1d_update, gated_rmsnorm, gdn_recurrent, paged_attention, rmsnorm, silu_mul  # noqa: E402

# Qwen3.5-4B decode shapes
REAL = dict(Hk=16, Hv=32, dk=128, dv=128, C=8192, K=4, Hq=16, Hkv=4, D=256, hidden=2560, inter=9216, block_size=16,
            contexts=(1024, 4096))
# --dry-run: tiny shapes that run in a second on a CPU
TINY = dict(Hk=2, Hv=4, dk=16, dv=16, C=40, K=4, Hq=4, Hkv=2, D=32, hidden=48, inter=40, block_size=4, contexts=(9,))


@dataclass
class Case:
    op: str
    batch: int
    bytes: int  # minimum bytes the op must read + write
    triton: object  # () -> output tensor(s); runs the Triton op (or, on a dry run, the dispatcher)
    ref: object  # () -> output tensor(s) from the torch reference
    check: object = None  # () -> (triton outputs, ref outputs) computed from identical inputs
    configs: dict = field(default_factory=dict)  # launch-config name -> () -> output (sweep)
    extra: dict = field(default_factory=dict)


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def make_cases(batch_sizes, shapes, device, dtype, sweep):
    s = shapes
    on_gpu = device.type == "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    randn = lambda *shape, dt=dtype: torch.randn(*shape, generator=gen, device=device).to(dt)  # noqa: E731
    f32, i32 = torch.float32, torch.int32
    pick = lambda mod, name: getattr(mod, name + ("_triton" if on_gpu else ""))  # noqa: E731
    cases = []
    for B in batch_sizes:
        # --- GDN recurrent update, T=1, one state slot per sequence
        q, k = randn(B, 1, s["Hk"], s["dk"]), randn(B, 1, s["Hk"], s["dk"])
        v = randn(B, 1, s["Hv"], s["dv"])
        g = -torch.rand(B, 1, s["Hv"], generator=gen, device=device)
        beta = torch.rand(B, 1, s["Hv"], generator=gen, device=device).to(dtype)
        state = randn(B, s["Hv"], s["dk"], s["dv"], dt=f32) * 0.1
        idx = torch.randperm(B, generator=gen, device=device).to(i32)
        gdn_args = (q, k, v, g, beta)
        run_gdn = pick(gdn_recurrent, "gdn_recurrent")

        def gdn_check(run_gdn=run_gdn, gdn_args=gdn_args, state=state, idx=idx):
            s1, s2 = state.clone(), state.clone()
            return (run_gdn(*gdn_args, s1, idx), s1), (gdn_recurrent.gdn_recurrent_ref(*gdn_args, s2, idx), s2)

        configs = {}
        if sweep and on_gpu:
            # value tile x warps around the default (one warp per 32-wide tile; 16 x 4 was the default before the
            # sweep that chose it, bench/results/h100_kernels_decode_sweep.json)
            for bv, nw in ((8, 1), (8, 2), (16, 1), (16, 2), (16, 4), (32, 1), (32, 2), (32, 4), (32, 8), (64, 2)):
                configs[f"block_v={bv},warps={nw}"] = (
                    lambda bv=bv, nw=nw, a=gdn_args, st=state, i=idx: gdn_recurrent.gdn_recurrent_triton(
                        *a, st, i, block_v=bv, num_warps=nw))
        cases.append(Case("gdn_recurrent", B, nbytes(*gdn_args) + 2 * nbytes(state) + nbytes(v),
                          lambda a=gdn_args, st=state, i=idx, f=run_gdn: f(*a, st, i),
                          lambda a=gdn_args, st=state, i=idx: gdn_recurrent.gdn_recurrent_ref(*a, st, i),
                          gdn_check, configs))

        # --- conv1d decode update
        x = randn(B, s["C"])
        conv_state = randn(B, s["C"], s["K"] - 1)
        weight = randn(s["C"], s["K"])
        run_conv = pick(conv1d_update, "causal_conv1d_update")

        def conv_check(run_conv=run_conv, x=x, conv_state=conv_state, weight=weight, idx=idx):
            s1, s2 = conv_state.clone(), conv_state.clone()
            return ((run_conv(x, s1, weight, idx), s1),
                    (conv1d_update.causal_conv1d_update_ref(x, s2, weight, idx), s2))

        configs = {}
        if sweep and on_gpu:
            for bc, nw in ((128, 4), (256, 4), (512, 4), (1024, 4), (1024, 8)):
                configs[f"block_c={bc},warps={nw}"] = (lambda bc=bc, nw=nw, x=x, cs=conv_state, w=weight, i=idx:
                                                       conv1d_update.causal_conv1d_update_triton(x, cs, w, i, block_c=bc, num_warps=nw))
        cases.append(Case("conv1d_update", B, 2 * nbytes(x) + 2 * nbytes(conv_state) + nbytes(weight),
                          lambda x=x, cs=conv_state, w=weight, i=idx, f=run_conv: f(x, cs, w, i),
                          lambda x=x, cs=conv_state, w=weight, i=idx: conv1d_update.causal_conv1d_update_ref(x, cs, w, i),
                          conv_check, configs))

        # --- paged decode attention, every sequence at the same context length
        for ctx in s["contexts"]:
            bs = s["block_size"]
            per_seq = -(-ctx // bs)
            k_cache = randn(B * per_seq, bs, s["Hkv"], s["D"])
            v_cache = randn(B * per_seq, bs, s["Hkv"], s["D"])
            tables = torch.randperm(B * per_seq, generator=gen, device=device).to(i32).view(B, per_seq)
            lens = torch.full((B,), ctx, dtype=i32, device=device)
            qa = randn(B, s["Hq"], s["D"])
            scale = s["D"] ** -0.5
            attn_args = (qa, k_cache, v_cache, tables, lens, scale)
            run_attn = pick(paged_attention, "paged_decode_attention")
            configs = {}
            if sweep and on_gpu:
                for bn, nw in ((16, 4), (16, 8), (32, 4), (32, 8)):
                    for part in (None, 256, 1024):
                        configs[f"block_n={bn},warps={nw},partition={part or 'auto'}"] = (
                            lambda bn=bn, nw=nw, part=part, a=attn_args:
                            paged_attention.paged_decode_attention_triton(*a, block_n=bn, num_warps=nw, partition_size=part))
            cases.append(Case(f"paged_decode_attention ctx={ctx}", B, 2 * B * ctx * s["Hkv"] * s["D"] * k_cache.element_size() + 2 * nbytes(qa),
                              lambda a=attn_args, f=run_attn: f(*a),
                              lambda a=attn_args: paged_attention.paged_decode_attention_ref(*a),
                              lambda a=attn_args, f=run_attn: (f(*a), paged_attention.paged_decode_attention_ref(*a)),
                              configs, {"context_len": ctx}))

        # --- KV-cache store for the B new tokens
        kn, vn = randn(B, s["Hkv"], s["D"]), randn(B, s["Hkv"], s["D"])
        kc, vc = randn(B, s["block_size"], s["Hkv"], s["D"]), randn(B, s["block_size"], s["Hkv"], s["D"])
        slots = (torch.arange(B, device=device) * s["block_size"] + 3).to(torch.int64)
        run_store = pick(paged_attention, "store_kvcache")

        def store_check(run_store=run_store, kn=kn, vn=vn, kc=kc, vc=vc, slots=slots):
            a = (kc.clone(), vc.clone())
            b = (kc.clone(), vc.clone())
            run_store(kn, vn, *a, slots)
            paged_attention.store_kvcache_ref(kn, vn, *b, slots)
            return a, b

        cases.append(Case("store_kvcache", B, 2 * 2 * nbytes(kn),
                          lambda f=run_store, kn=kn, vn=vn, kc=kc, vc=vc, sl=slots: f(kn, vn, kc, vc, sl),
                          lambda kn=kn, vn=vn, kc=kc, vc=vc, sl=slots: paged_attention.store_kvcache_ref(kn, vn, kc, vc, sl),
                          store_check))

        # --- elementwise/norm ops
        o, z, w = randn(B, s["Hv"], s["dv"]), randn(B, s["Hv"], s["dv"]), randn(s["dv"])
        run = pick(gated_rmsnorm, "gated_rmsnorm")
        cases.append(Case("gated_rmsnorm", B, 3 * nbytes(o),
                          lambda f=run, a=(o, z, w): f(*a, 1e-6), lambda a=(o, z, w): gated_rmsnorm.gated_rmsnorm_ref(*a, 1e-6),
                          lambda f=run, a=(o, z, w): (f(*a, 1e-6), gated_rmsnorm.gated_rmsnorm_ref(*a, 1e-6))))
        h, r, wn = randn(B, s["hidden"]), randn(B, s["hidden"]), randn(s["hidden"])
        run = pick(rmsnorm, "rmsnorm")
        cases.append(Case("rmsnorm+residual", B, 4 * nbytes(h),
                          lambda f=run, a=(h, wn), r=r: f(*a, 1e-6, residual=r),
                          lambda a=(h, wn), r=r: rmsnorm.rmsnorm_ref(*a, 1e-6, residual=r),
                          lambda f=run, a=(h, wn), r=r: (f(*a, 1e-6, residual=r), rmsnorm.rmsnorm_ref(*a, 1e-6, residual=r))))
        gu = randn(B, 2 * s["inter"])
        run = pick(silu_mul, "silu_mul")
        cases.append(Case("silu_mul", B, nbytes(gu) * 3 // 2,
                          lambda f=run, gu=gu: f(gu), lambda gu=gu: silu_mul.silu_mul_ref(gu),
                          lambda f=run, gu=gu: (f(gu), silu_mul.silu_mul_ref(gu))))
    return cases


def flatten(x):
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for item in x for t in flatten(item)]


def rel_error(got, want) -> float:
    worst = 0.0
    for a, b in zip(flatten(got), flatten(want)):
        denom = b.float().abs().max().clamp(min=1e-12)
        worst = max(worst, float((a.float() - b.float()).abs().max() / denom))
    return worst


def time_us(fn, device, graph=False) -> float:
    """Median microseconds per call."""
    if device.type == "cuda":
        import triton.testing as tt

        if graph:
            try:
                return 1e3 * tt.do_bench_cudagraph(fn, rep=50, return_mode="median")
            except Exception as e:  # noqa: BLE001 - report, don't abort the whole benchmark
                print(f"  (cuda graph capture failed: {type(e).__name__}: {e})")
                return float("nan")
        return 1e3 * tt.do_bench(fn, warmup=10, rep=50, return_mode="median")
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def copy_bandwidth(device, size_bytes) -> float:
    """Bytes/s of a device-to-device copy (read + write counted), the practical roofline."""
    src = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), device)
    return 2 * size_bytes / (us * 1e-6)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON results path")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU through the references")
    parser.add_argument("--no-sweep", action="store_true", help="skip the launch-config sweep")
    args = parser.parse_args(argv)

    if args.dry_run:
        device, shapes, copy_size = torch.device("cpu"), TINY, 1 << 24
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device; use --dry-run for a CPU smoke test")
        device, shapes, copy_size = torch.device("cuda"), REAL, 1 << 30
    dtype = torch.bfloat16
    copy_bw = copy_bandwidth(device, copy_size)
    meta = {"device": harness.device_name(device), "torch": torch.__version__,
            "dtype": str(dtype), "copy_bandwidth_GBps": copy_bw / 1e9, "dry_run": args.dry_run}
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    print(f"{meta['device']}  copy bandwidth {copy_bw / 1e9:.0f} GB/s")
    header = f"{'op':32s} {'B':>3s} {'rel_err':>9s} {'ref_us':>9s} {'tri_us':>8s} {'graph_us':>8s} {'MB':>8s} {'GB/s':>7s} {'%copy':>6s}"
    print(header)
    rows = []
    for case in make_cases(args.batch_sizes, shapes, device, dtype, sweep=not args.no_sweep):
        got, want = case.check()
        err = rel_error(got, want)
        ref_us = time_us(case.ref, device)
        tri_us = time_us(case.triton, device)
        graph_us = time_us(case.triton, device, graph=True) if device.type == "cuda" else float("nan")
        best_us = min(t for t in (tri_us, graph_us) if t == t)
        gbps = case.bytes / (best_us * 1e-6) / 1e9
        row = {"op": case.op, "batch": case.batch, "rel_err": err, "ref_us": ref_us, "triton_us": tri_us,
               "triton_graph_us": graph_us, "bytes": case.bytes, "GBps": gbps,
               "pct_copy_bw": 100 * gbps * 1e9 / copy_bw, **case.extra}
        if case.configs:
            row["configs_graph_us"] = {name: time_us(fn, device, graph=True) for name, fn in case.configs.items()}
        rows.append(row)
        print(f"{case.op:32s} {case.batch:3d} {err:9.2e} {ref_us:9.1f} {tri_us:8.1f} {graph_us:8.1f} "
              f"{case.bytes / 1e6:8.2f} {gbps:7.0f} {row['pct_copy_bw']:6.1f}")
        for name, us in row.get("configs_graph_us", {}).items():
            print(f"    {name:44s} {us:8.1f} us  ({case.bytes / (us * 1e-6) / 1e9:6.0f} GB/s)")
    harness.write_result(args.out, {"meta": meta, "rows": rows}, harness.result_meta(
        __file__, f"each decode kernel against its torch reference at batch {', '.join(map(str, args.batch_sizes))}"
        f"{' (tiny shapes on the CPU)' if args.dry_run else ''}: error, eager and CUDA-graph times, % of the copy "
        f"bandwidth" + ("" if args.no_sweep else ", and the launch sweeps"), argv, device))
    print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
