"""GPU microbenchmark of kernels.small_m_linear (decode GEMV) against cuBLAS (F.linear) at the Qwen3.5-4B shapes.

For each decode projection (N, K) and M in {1, 8}, bf16: max relative error of our kernel and of cuBLAS against the
fp32 reference; median time of F.linear and of our kernel at its default launch, eagerly (triton.testing.do_bench,
L2 flushed before every call, from bench/kernels_bench.py) and replayed in a CUDA graph; then a sweep of <= 12 launch
configurations (graph timing, each checked for correctness first) and the best one. Bandwidth counts the bytes
that must move (weight + x + y) against a device-to-device copy measured in the same run.

Graph timing: one graph holds back-to-back calls that rotate over enough copies of the weight (>= 256 MB in all,
~5x the L2) that every call streams its weight from HBM, as in a decode step where 32 layers' weights pass through
L2. (kernels_bench's do_bench_cudagraph would re-read one weight, which stays L2-resident for out_proj/down.)
Times are per call, including the gap between consecutive kernels of a graph.

    python3 bench/small_m_linear_bench.py --out $OUT/small_m_linear.json     # GPU, about a minute
    python3 bench/small_m_linear_bench.py --dry-run --out /tmp/sml.json       # CPU smoke test: tiny shapes, interpreter
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import harness  # noqa: E402

# (N, K) of the 4B decode projections (nn.Linear weight [N, K])
SHAPES = {"gate_up": (18432, 2560), "in_proj": (12352, 2560), "down": (2560, 9216), "out_proj": (2560, 4096),
          "lm_head": (248320, 2560)}
TINY_SHAPES = {"tiny_a": (40, 48), "tiny_b": (130, 200)}
COLD_BYTES = 256 << 20  # weight copies streamed per graph replay
GRAPH_US = 200.0  # rough GPU time per graph replay (amortises the replay's launch)
OK_REL_ERR = 1e-2  # bf16 output: one rounding of an fp32 sum is ~4e-3 relative at worst
REPEATS_DEFAULT, REPEATS_CONFIG = 20, 4  # back-to-back correctness calls (GPU; 1 on the CPU dry run)


def _lazy_imports(dry_run):
    """Import triton/kernels only after the dry run has selected the interpreter."""
    if dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    global kb, sml
    import importlib.util

    from kernels import small_m_linear as sml

    # bench/ is not a package: load kernels_bench (timing, copy bandwidth, error helpers) from its file
    spec = importlib.util.spec_from_file_location("kernels_bench", os.path.join(ROOT, "bench", "kernels_bench.py"))
    kb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kb)


def sweep_configs(N, K, M, dtype, device, limit=12):
    """Named launch-option dicts around the default: split factor, tile sizes, stages, warps. Entries that resolve to
    the same effective launch are dropped."""
    d = sml.default_launch(N, K, dtype, device)
    sms = sml.sm_count(device)
    auto = d["split_k"]
    chunks = sml.cdiv(K, d["block_k"])

    def cfg(**kw):
        c = dict(d, **kw)
        if "split_k" not in kw:
            c["split_k"] = sml.pick_split_k(N, K, c["block_n"], c["block_k"], sms)
        return c

    candidates = [
        ("default", dict(d)),
        ("no_split", cfg(split_k=1)),
        ("split_x2", cfg(split_k=min(sml.MAX_SPLIT_K, chunks, max(2, 2 * auto)))),
        ("split_half", cfg(split_k=max(1, auto // 2))),
        ("bn128_st3", cfg(block_n=128, num_stages=3)),
        ("bn32", cfg(block_n=32)),
        ("bk2x_st3", cfg(block_k=2 * d["block_k"], num_stages=3)),
        ("bkhalf_st6", cfg(block_k=d["block_k"] // 2, num_stages=6)),
        ("st3", cfg(num_stages=3)),
        ("warps8", cfg(num_warps=8)),
        ("bn128_bk2x_w8_st3", cfg(block_n=128, block_k=2 * d["block_k"], num_warps=8, num_stages=3)),
        ("bn32_st6", cfg(block_n=32, num_stages=6)),
    ]
    seen, out = set(), []
    for name, c in candidates:
        S = sml.split_ranges(K, c["block_k"], c["split_k"])[1]
        key = (c["block_n"], c["block_k"], S, c["num_warps"], c["num_stages"])
        if key not in seen and len(out) < limit:
            seen.add(key)
            out.append((name, c))
    return out


def graph_us(fns, device, est_us):
    """Median per-call microseconds of `fns` (one launch each) captured back to back in a CUDA graph, repeated to
    ~GRAPH_US of work per replay; on CPU, one timed pass."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        for f in fns:
            f()
        return 1e6 * (time.perf_counter() - t0) / len(fns)
    n = len(fns) * max(1, math.ceil(max(4, GRAPH_US / max(est_us, 1e-3)) / len(fns)))
    calls = [fns[i % len(fns)] for i in range(n)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (compilation, cuBLAS handles/workspace)
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in calls:
            f()
    graph.replay()
    torch.cuda.synchronize()
    per_call, replays = [], 8
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        per_call.append(1e3 * start.elapsed_time(end) / (replays * n))
    del graph
    return statistics.median(per_call)


def safe_graph_us(fns, device, est_us):
    """graph_us, or NaN (reported) when capture or replay fails: the rest of the run still gets measured."""
    try:
        return graph_us(fns, device, est_us)
    except Exception as e:  # noqa: BLE001
        print(f"  (cuda graph timing failed: {type(e).__name__}: {str(e)[:300]})", flush=True)
        return float("nan")


def bandwidth(nbytes, us, copy_bw):
    if not us or math.isnan(us):
        return float("nan"), float("nan")
    gbps = nbytes / (us * 1e-6) / 1e9
    return gbps, 100 * gbps * 1e9 / copy_bw


def run_case(name, N, K, M, device, dtype, copy_bw, sweep, deadline, gen):
    import torch.nn.functional as F

    wbytes = N * K * dtype.itemsize
    copies = max(1, math.ceil(COLD_BYTES / wbytes)) if device.type == "cuda" else 1
    w0 = (torch.randn(N, K, generator=gen, device=device, dtype=torch.float32) * K ** -0.5).to(dtype)
    weights = [w0] + [w0.clone() for _ in range(copies - 1)]
    x = torch.randn(M, K, generator=gen, device=device, dtype=torch.float32).to(dtype)
    nbytes = wbytes + (M * K + M * N) * dtype.itemsize  # weight + x + y
    est_us = nbytes / 3e12 * 1e6
    ref = sml.small_m_linear_ref(x, w0)
    configs = sweep_configs(N, K, M, dtype, device) if sweep else sweep_configs(N, K, M, dtype, device, limit=1)
    max_split = max(sml.split_ranges(K, c["block_k"], c["split_k"])[1] for _, c in configs)
    ws = sml.small_m_linear_workspace(N, device, max_m=M, max_split_k=max_split)

    def ours(w, **launch):
        return sml.small_m_linear_triton(x, w, workspace=ws, **launch)

    def check(repeats, **launch):
        """Max relative error over `repeats` back-to-back calls, and whether they all gave the same bits (split-K
        sums partials in a fixed order, so any difference would be a race in the fused reduction)."""
        outs = [ours(w0, **launch) for _ in range(repeats if device.type == "cuda" else 1)]
        return max(kb.rel_error(y, ref) for y in outs), all(torch.equal(y, outs[0]) for y in outs)

    row = {"shape": name, "N": N, "K": K, "M": M, "bytes": nbytes, "weight_copies": copies,
           "default_launch": sml.default_launch(N, K, dtype, device)}
    row["cublas_rel_err"] = kb.rel_error(F.linear(x, w0), ref)
    row["rel_err"], row["repeat_identical"] = check(REPEATS_DEFAULT)
    row["cublas_us"] = kb.time_us(lambda: F.linear(x, w0), device)
    row["cublas_graph_us"] = safe_graph_us([lambda w=w: F.linear(x, w) for w in weights], device, est_us)
    row["triton_us"] = kb.time_us(lambda: ours(w0), device)
    row["triton_graph_us"] = safe_graph_us([lambda w=w: ours(w) for w in weights], device, est_us)
    for key in ("cublas_graph", "triton_graph"):
        row[key + "_GBps"], row[key + "_pct_copy_bw"] = bandwidth(nbytes, row[key + "_us"], copy_bw)

    row["configs"] = []
    for cname, c in configs:
        entry = {"name": cname, "launch": c, "rel_err": None, "repeat_identical": None, "graph_us": None,
                 "error": None}
        if time.time() > deadline:
            entry["error"] = "skipped: time budget spent"
        else:
            try:
                entry["rel_err"], entry["repeat_identical"] = check(REPEATS_CONFIG, **c)  # compiles + checks
                entry["graph_us"] = graph_us([lambda w=w, c=c: ours(w, **c) for w in weights], device, est_us)
            except Exception as e:  # noqa: BLE001 - one bad config (e.g. out of shared memory) must not end the run
                entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                if device.type == "cuda":
                    torch.cuda.synchronize()
        entry["GBps"], entry["pct_copy_bw"] = bandwidth(nbytes, entry["graph_us"], copy_bw)
        row["configs"].append(entry)
    good = [c for c in row["configs"] if c["error"] is None and c["rel_err"] < OK_REL_ERR and c["repeat_identical"]]
    if good:
        best = min(good, key=lambda c: c["graph_us"])
        row["best"] = {k: best[k] for k in ("name", "launch", "graph_us", "GBps", "pct_copy_bw", "rel_err")}
        row["best"]["speedup_vs_cublas_graph"] = row["cublas_graph_us"] / best["graph_us"]
    else:
        row["best"] = None
    row["wrong_configs"] = [c["name"] for c in row["configs"] if c["rel_err"] is not None
                            and (c["rel_err"] >= OK_REL_ERR or not c["repeat_identical"])]
    if row["rel_err"] >= OK_REL_ERR or not row["repeat_identical"]:
        row["wrong_configs"].insert(0, "DEFAULT (eager check)")
    return row


def print_row(r):
    best = r["best"] or {}
    print(f"{r['shape']:9s} {r['M']:2d} {r['rel_err']:8.1e} {r['cublas_rel_err']:8.1e} | {r['cublas_us']:7.1f} "
          f"{r['cublas_graph_us']:7.1f} {r['cublas_graph_pct_copy_bw']:5.1f}% | {r['triton_us']:7.1f} "
          f"{r['triton_graph_us']:7.1f} {r['triton_graph_pct_copy_bw']:5.1f}% | "
          f"{best.get('graph_us', float('nan')):7.1f} {best.get('pct_copy_bw', float('nan')):5.1f}% "
          f"{best.get('name', '-')}", flush=True)
    if r["wrong_configs"]:
        print(f"    WRONG RESULTS (rel_err >= {OK_REL_ERR} or repeats differ): {r['wrong_configs']}", flush=True)
    for c in r["configs"]:
        if c["error"]:
            print(f"    {c['name']}: {c['error']}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON results path (rewritten after every case)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--shapes", nargs="+", default=None, help=f"subset of {list(SHAPES)}")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU through the Triton interpreter")
    parser.add_argument("--no-sweep", action="store_true", help="default launch only")
    parser.add_argument("--budget-s", type=float, default=75.0,
                        help="stop sweeping configs after this many seconds (defaults and cuBLAS are still measured)")
    args = parser.parse_args(argv)
    t_start = time.time()
    _lazy_imports(args.dry_run)

    if args.dry_run:
        device, shapes, copy_size = torch.device("cpu"), TINY_SHAPES, 1 << 24
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device; use --dry-run for a CPU smoke test")
        device, copy_size = torch.device("cuda"), 1 << 30
        shapes = {k: SHAPES[k] for k in (args.shapes or SHAPES)}
    dtype = torch.bfloat16
    copy_bw = kb.copy_bandwidth(device, copy_size)
    import triton

    meta = {"device": harness.device_name(device), "torch": torch.__version__,
            "triton": triton.__version__, "dtype": str(dtype), "copy_bandwidth_GBps": copy_bw / 1e9,
            "sm_count": sml.sm_count(device), "dry_run": args.dry_run, "cold_bytes": COLD_BYTES}
    print(f"{meta['device']}  copy bandwidth {copy_bw / 1e9:.0f} GB/s  triton {meta['triton']}  torch {meta['torch']}",
          flush=True)
    print(f"{'shape':9s} {'M':>2s} {'err':>8s} {'cub_err':>8s} | {'cuBLAS':>7s} {'graph':>7s} {'%copy':>6s} | "
          f"{'ours':>7s} {'graph':>7s} {'%copy':>6s} | {'best':>7s} {'%copy':>6s} config    (us)", flush=True)
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    results = harness.ResultFile(args.out, harness.result_meta(
        __file__, f"kernels/small_m_linear (Triton decode GEMV) against cuBLAS at the "
        f"{'tiny (CPU interpreter)' if args.dry_run else '4B'} weight shapes, M = "
        f"{', '.join(map(str, args.batch_sizes))}, bf16: error, eager and CUDA-graph times against the copy bandwidth"
        + ("" if args.no_sweep else ", and the launch sweep's best"), argv, device))
    for name, (N, K) in shapes.items():
        for M in args.batch_sizes:
            row = run_case(name, N, K, M, device, dtype, copy_bw, not args.no_sweep, t_start + args.budget_s, gen)
            rows.append(row)
            print_row(row)
            meta["elapsed_s"] = time.time() - t_start
            results.write({"meta": meta, "rows": rows})
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(f"wrote {args.out} in {time.time() - t_start:.0f} s")
    return rows


if __name__ == "__main__":
    main()
