"""The speculative step's kernels at the 4B shape, each launch configuration timed as the engine runs it (inside a
CUDA graph: no host launch cost in the number) and checked against the default configuration's output.

    python3 bench/spec_kernels_bench.py --out bench/results/h200_spec_kernels.json      # GPU
    python bench/spec_kernels_bench.py --smoke --out /tmp/spec_kernels.json              # CPU: toy shapes, interpreter
    python3 bench/spec_kernels_bench.py --short ...   # after a sweep: defaults against a few neighbours, no attention

Kernels (kernels/gdn_verify.py, kernels/paged_attention.py), 32 sequences x a block of 16 unless said:
- A GDN layer's speculative steps as the engine runs them (verify, then the ring's advance), tau tokens accepted a
  step, for fold_after 0, 16 and 48 (the state written back at every step, or once 16 or 48 updates are pending):
  the mean over a run of steps, whose pending counts cycle as the engine's do; the torch reference of the same; and
  the design it replaced, committing every step (a verify with nothing pending, then a fold of tau tokens).
- GDN verify at 1 and 32 sequences with nothing pending, token by token (block_v x num_warps); with a block
  pending and written back (default launch); fla's fused
  recurrent kernel over the same block when fla imports (it writes the final state instead of keeping the block's
  updates).
- GDN verify over the block's first 1, 4 and 16 tokens against the decode kernel stepping the same state through them
  (what a verify's fixed cost is, and each token's).
- GDN fold of all 24 GDN layers in one launch (per layer = the launch / 24), a block pending: what a plain decode
  step pays after speculative ones.
- conv verify / conv commit (block_c x num_warps).
- verify attention (16 query heads, 4 kv heads, head dim 256, context 1,500) at 1 and 32 sequences: every row reading
  its own context (rows_per_seq=1, what a decode kernel does) against a sequence's rows read together (rows_per_seq
  16, tile x num_warps).
Each row: us per call, the roofline (bytes that must move / the measured copy bandwidth) and the largest difference
from the default configuration's output.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if "--smoke" in sys.argv:  # before triton is imported: the CPU check runs every configuration in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("OCRIA_FORCE_TRITON", "1")

import torch  # noqa: E402

from bench import harness  # noqa: E402
from bench.engine_bench import copy_bandwidth  # noqa: E402
from kernels import gdn_verify as gv  # noqa: E402
from kernels.gdn_recurrent import gdn_recurrent_triton  # noqa: E402
from kernels import paged_attention as pa  # noqa: E402


def graph_us(fn, device, iters: int = 20, reps: int = 5) -> tuple[float, str]:
    """(us per call of fn, how it was timed): replayed from a CUDA graph of `iters` calls; a function that cannot be
    captured (e.g. it syncs with the host) launched eagerly; on CPU one timed call."""
    fn()
    if device.type != "cuda":
        t = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - t), "cpu, one call"
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()
        replay = g.replay
    except Exception:  # noqa: BLE001  (not capturable: time it eagerly)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(reps * iters):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return 1e3 * start.elapsed_time(end) / (reps * iters), "eager (not capturable)"
    replay()
    torch.cuda.synchronize(device)
    start.record()
    for _ in range(reps):
        replay()
    end.record()
    torch.cuda.synchronize(device)
    return 1e3 * start.elapsed_time(end) / (reps * iters), "cuda graph"


def timing(measured: tuple[float, str], calls: int = 1) -> dict:
    """A row's time fields from graph_us: us per one of `calls` (e.g. layers) done by the timed call, and how."""
    us, how = measured
    return {"us": round(us / calls, 2), "timed": how}


def max_diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def ring_bytes(S, T, Hk, Hv, dk, dv, rows) -> int:
    """Bytes of `rows` ring rows (k, u, g in fp32) of S sequences' GDN layer."""
    return S * rows * (Hk * dk + Hv * dv + Hv) * 4


def steady_steps(fold_after: int, tau: int, T: int, steps: int) -> tuple[int, int]:
    """(write-backs, pending rows read) over `steps` verify + advance steps from an empty ring, tau accepted a step:
    the cycle the engine's pending counts go through."""
    h = writes = reads = 0
    for _ in range(steps):
        reads += h
        if h > fold_after:
            writes, h = writes + 1, 0
        h += tau
    return writes, reads


def gdn_rows(shape, device, bw, record, smoke: bool, short: bool = False) -> None:
    S, T, Hk, Hv, dk, dv, L = shape
    # inputs drawn on the host: a capture that fails (the torch reference syncs) can leave a CUDA generator unusable
    gen = torch.Generator().manual_seed(0)
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32

    def rnd(*s, dtype=dt):
        return torch.randn(*s, generator=gen).to(device=device, dtype=dtype)

    def new_ring(rows, layers=()):
        """A ring whose slots 0..S-1 each hold T pending tokens from row 0 (normalised keys, small updates)."""
        k_r = torch.nn.functional.normalize(rnd(*layers, S + 1, rows, Hk, dk, dtype=torch.float32), dim=-1)
        pos = torch.zeros(S + 1, 2, dtype=torch.int32, device=device)
        pos[:S, 1] = T
        return (k_r, rnd(*layers, S + 1, rows, Hv, dv, dtype=torch.float32) * 0.1,
                -torch.rand(*layers, S + 1, rows, Hv, generator=gen).to(device), pos)

    def empty(ring):
        ring[3].zero_()
        return ring

    q, k, v = rnd(S, T, Hk, dk), rnd(S, T, Hk, dk), rnd(S, T, Hv, dv)
    a, b = rnd(S, T, Hv), rnd(S, T, Hv)
    raw = (torch.rand(Hv, generator=gen).to(device), torch.zeros(Hv, device=device))
    state = rnd(S + 1, Hv, dk, dv, dtype=torch.float32) * 0.1
    idx = torch.arange(S, device=device)
    state_bytes = S * Hv * dk * dv * 4
    io_bytes = (q.numel() + k.numel() + 2 * v.numel()) * q.element_size()
    block_bytes = ring_bytes(S, T, Hk, Hv, dk, dv, T)
    verify_roof = 1e6 * (state_bytes + io_bytes + block_bytes) / bw  # nothing pending: read the state once

    # a GDN layer's speculative steps: verify + advance, tau accepted a step, averaged over a run of steps
    tau, steps = (2, 4) if smoke else (3, 20)
    n_acc = torch.full((S,), tau, device=device, dtype=torch.int32)
    impls = {"default launches": (gv.gdn_verify_triton, gv.gdn_ring_advance_triton, gv.gdn_fold_triton),
             "torch reference": (gv.gdn_verify_ref, gv._ring_advance_ref, gv.gdn_fold_ref)}
    for name, (verify, advance, fold) in impls.items():
        ref = "reference" in name
        for f in ([0] if smoke or ref else [0, 16] if short else [0, 16, 48]):
            ring, work = empty(new_ring(f + 2 * T)), state.clone()

            def step(verify=verify, advance=advance, ring=ring, work=work, f=f):
                verify(q, k, v, a, b, work, idx, ring, f, raw_gates=raw)
                advance(ring[3], idx, n_acc, f, f + 2 * T)
            t = graph_us(step, device, iters=steps, reps=5)  # the graph replays `steps` steps: their pending cycle
            writes, reads = steady_steps(f, tau, T, steps)
            roof = (state_bytes + io_bytes + block_bytes + writes / steps * state_bytes +
                    ring_bytes(S, T, Hk, Hv, dk, dv, 1) * reads / steps)
            record({"kernel": f"gdn step: verify + advance ({name})", "fold_after": f, "accepted_per_step": tau,
                    "sequences": S, "block": T, **timing(t), "roofline_us": round(1e6 * roof / bw, 2),
                    "write_backs_per_step": round(writes / steps, 3)})
        # the replaced design: verify against a committed state, then commit the accepted tokens (= a fold)
        ring, work = empty(new_ring(2 * T)), state.clone()
        accepted = torch.tensor([0, tau], dtype=torch.int32, device=device).expand(S, 2)  # the block's first tau rows

        def commit_every_step(verify=verify, fold=fold, ring=ring, work=work):
            verify(q, k, v, a, b, work, idx, ring, 0, raw_gates=raw)
            ring[3][:S].copy_(accepted)
            fold(work, idx, ring)
        record({"kernel": f"gdn step: verify + commit every step ({name})", "accepted_per_step": tau,
                "sequences": S, "block": T, **timing(graph_us(commit_every_step, device)),
                "roofline_us": round(1e6 * (3 * state_bytes + io_bytes + block_bytes) / bw, 2)})

    # verify alone: every launch configuration, nothing pending, at one sequence (latency) and S (throughput)
    ring = empty(new_ring(2 * T))
    # wide value tiles too: a program's token steps are latency-bound, so fewer programs (fewer waves) may win
    configs = [(bv, w) for bv in (8, 16, 32) for w in (1, 2, 4)] + [(64, 4), (64, 8), (128, 8)]
    if short:  # the default, the launch it replaced and its neighbours
        configs = [(32, 1), (16, 4), (16, 1), (32, 2), (64, 2)]
    if smoke:
        configs = [(8, 1), (16, 4)]
    for n in sorted({1, S}):
        want = gv.gdn_verify_triton(q[:n], k[:n], v[:n], a[:n], b[:n], state, idx[:n], ring, raw_gates=raw)
        for bv, w in configs:
            def call(bv=bv, w=w, n=n):
                return gv.gdn_verify_triton(q[:n], k[:n], v[:n], a[:n], b[:n], state, idx[:n], ring, raw_gates=raw,
                                            block_v=bv, num_warps=w)
            got = call()
            record({"kernel": "gdn verify (steps)", "block_v": bv, "num_warps": w,
                    "sequences": n, "block": T, "pending": 0, **timing(graph_us(call, device)),
                    "roofline_us": round(verify_roof * n / S, 2), "max_diff_vs_default": max_diff(got, want)})
    # fixed against per-token cost: the default verify over the block's first t tokens, nothing pending, and the
    # decode kernel (kernels/gdn_recurrent) stepping the same state through them, at S sequences
    for t in sorted({1, 4, T}):
        ts = (slice(None), slice(0, t))
        def call_v(ts=ts):
            return gv.gdn_verify_triton(q[ts], k[ts], v[ts], a[ts], b[ts], state, idx, ring, raw_gates=raw)
        record({"kernel": "gdn verify (steps), a block of t tokens", "sequences": S, "block": t, "pending": 0,
                **timing(graph_us(call_v, device)),
                "roofline_us": round(1e6 * (state_bytes + (io_bytes + block_bytes) * t / T) / bw, 2)})
        work = state.clone()
        q_t, k_t, v_t, a_t, b_t = (x[ts].contiguous() for x in (q, k, v, a, b))

        def call_d(q_t=q_t, k_t=k_t, v_t=v_t, a_t=a_t, b_t=b_t, work=work):
            return gdn_recurrent_triton(q_t, k_t, v_t, a_t, b_t, work, idx, raw_gates=raw)
        record({"kernel": "gdn decode kernel over t tokens (writes the state)", "sequences": S, "block": t,
                **timing(graph_us(call_d, device)), "roofline_us": round(1e6 * 2 * state_bytes / bw, 2)})
    # a block pending, folded in and written back (fold_after 0): the verify of every step after the first
    full, work = new_ring(2 * T), state.clone()
    record({"kernel": "gdn verify (steps), a block pending, written back", "sequences": S, "block": T, "pending": T,
            **timing(graph_us(lambda: gv.gdn_verify_triton(q, k, v, a, b, work, idx, full, raw_gates=raw), device)),
            "roofline_us": round(1e6 * (2 * state_bytes + io_bytes + 2 * block_bytes) / bw, 2)})
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_rec

        g, beta = gv.gates_from_raw(a, b, *raw)
        qf, kf = q.repeat_interleave(Hv // Hk, 2), k.repeat_interleave(Hv // Hk, 2)

        def fla_call():
            return fla_rec(qf, kf, v, g, beta.to(v.dtype), initial_state=state[:S], output_final_state=True,
                           use_qk_l2norm_in_kernel=True)
        want = gv.gdn_verify_triton(q, k, v, a, b, state, idx, empty(new_ring(2 * T)), raw_gates=raw)
        record({"kernel": "fla fused_recurrent (writes the final state)", "sequences": S, "block": T,
                **timing(graph_us(fla_call, device)), "roofline_us": round(1e6 * (2 * state_bytes + io_bytes) / bw, 2),
                "max_diff_vs_default": max_diff(fla_call()[0], want)})
    except Exception as e:  # noqa: BLE001  (fla is optional)
        record({"note": f"fla not importable ({type(e).__name__}): no fla row"})

    # fold: every layer in one launch, a block pending in each (the pos reset is undone before each timed call)
    states = rnd(L, S + 1, Hv, dk, dv, dtype=torch.float32) * 0.1
    lring = new_ring(2 * T, layers=(L,))
    pending = lring[3].clone()
    ref, work = states.clone(), states.clone()  # timing folds into `work` again and again
    gv.gdn_fold_triton(ref, idx, lring)
    for bv, w in ([(8, 1), (16, 4)] if smoke else [(32, 2), (16, 4)] if short else
                  [(bv, w) for bv in (8, 16, 32) for w in (1, 2, 4)]):
        s_ = states.clone()
        lring[3].copy_(pending)
        gv.gdn_fold_triton(s_, idx, lring, block_v=bv, num_warps=w)
        diff = max_diff(s_, ref)

        def fold_all(bv=bv, w=w):
            lring[3].copy_(pending)
            gv.gdn_fold_triton(work, idx, lring, block_v=bv, num_warps=w)
        record({"kernel": f"gdn fold, {L} layers in one launch (per layer)", "block_v": bv, "num_warps": w,
                "sequences": S, "pending": T, **timing(graph_us(fold_all, device), L),
                "roofline_us": round(1e6 * (2 * state_bytes + block_bytes) / bw, 2), "max_diff_vs_default": diff})

    n = torch.full((S,), T, device=device, dtype=torch.int64)
    # conv verify / commit (one layer; commit over all layers in one launch)
    C, K = 2 * Hk * dk + Hv * dv, 4
    x = rnd(S, T, C)
    w_conv = rnd(C, K)
    conv = rnd(S + 1, C, K - 1)
    keep = torch.empty_like(x)  # the engine's call: the block's inputs kept for the commit in the same launch
    want_y = gv.causal_conv1d_verify_triton(x, conv, w_conv, idx, keep=keep)
    xs, convs = rnd(L, S, T, C), rnd(L, S + 1, C, K - 1)
    conv_bytes = S * C * (K - 1) * conv.element_size()
    for bc, w in ([(64, 1), (256, 4)] if smoke else [(256, 4)] if short else
                  [(bc, w) for bc in (64, 128, 256) for w in (1, 4)]):
        got = gv.causal_conv1d_verify_triton(x, conv, w_conv, idx, keep=keep, block_c=bc, num_warps=w)
        t = graph_us(lambda bc=bc, w=w: gv.causal_conv1d_verify_triton(x, conv, w_conv, idx, keep=keep, block_c=bc,
                                                                          num_warps=w), device)
        record({"kernel": "conv verify", "block_c": bc, "num_warps": w, "sequences": S, "block": T,
                **timing(t), "roofline_us": round(1e6 * (3 * x.numel() * x.element_size() + conv_bytes) / bw, 2),
                "max_diff_vs_default": max_diff(got, want_y)})
        t = graph_us(lambda bc=bc, w=w: gv.conv_state_commit_triton(xs, convs, idx, n, block_c=bc, num_warps=w),
                     device)
        record({"kernel": f"conv commit, {L} layers in one launch (per layer)", "block_c": bc, "num_warps": w,
                "sequences": S, "block": T, **timing(t, L),
                "roofline_us": round(1e6 * (2 * conv_bytes + S * (K - 1) * C * x.element_size()) / bw, 2)})


def attention_rows(shape, device, bw, record, smoke: bool) -> None:
    T, Hq, Hkv, D, ctx, page = shape
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(1)  # on the host, as in gdn_rows
    for S in ((1, 2) if smoke else (1, 32)):
        per_seq = -(-(ctx + T) // page)
        k_cache = torch.randn(S * per_seq, page, Hkv, D, generator=gen).to(device=device, dtype=dt)
        v_cache = torch.randn(S * per_seq, page, Hkv, D, generator=gen).to(device=device, dtype=dt)
        tables = torch.arange(S * per_seq, device=device, dtype=torch.int32).view(S, per_seq)
        tables = tables.repeat_interleave(T, 0).contiguous()
        lens = (ctx + torch.arange(T, device=device, dtype=torch.int32) + 1).repeat(S)
        q = torch.randn(S * T, Hq, D, generator=gen).to(device=device, dtype=dt)
        kv_bytes = 2 * S * (ctx + T) * Hkv * D * k_cache.element_size()
        want = pa.paged_decode_attention_triton(q, k_cache, v_cache, tables, lens, D ** -0.5)
        configs = [(1, None, None)] + [(T, m, w) for m in (32, 64) for w in (4, 8)]
        if smoke:
            configs = configs[:2]
        for rows, m, w in configs:
            def call(rows=rows, m=m, w=w):
                return pa.paged_decode_attention_triton(q, k_cache, v_cache, tables, lens, D ** -0.5,
                                                        rows_per_seq=rows, max_tile_rows=m, num_warps=w)
            got = call()
            record({"kernel": "verify attention" + (" (each row alone)" if rows == 1 else " (a sequence's rows "
                                                     "together)"), "rows_per_seq": rows, "tile": m,
                    "num_warps": w, "sequences": S, "block": T, "context": ctx,
                    **timing(graph_us(call, device)), "roofline_us": round(1e6 * kv_bytes / bw, 2),
                    "max_diff_vs_default": max_diff(got, want)})


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true", help="CPU: toy shapes, each configuration once in the interpreter")
    p.add_argument("--short", action="store_true", help="each kernel's default launch against a few others; the GDN "
                   "step at fold_after 0 and 16; no attention rows")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "h200_spec_kernels.json"))
    args = p.parse_args(argv)
    device = torch.device("cpu" if args.smoke else args.device)
    results = {"rows": []}
    name = harness.device_name(device)
    out = harness.ResultFile(args.out, harness.result_meta(
        __file__, f"the speculative step's kernels at the {'toy' if args.smoke else '4B'} shape, each launch "
        f"configuration {'run once in the interpreter' if args.smoke else 'timed in a CUDA graph'} and checked "
        f"against the default's output: GDN verify, fold and a layer's step, conv verify / commit"
        + ("" if args.short else ", verify attention")
        + (" (short: defaults against a few neighbours)" if args.short else ""), argv,
        name if device.type == "cuda" else f"{name}, Triton interpreter"))

    def record(row):
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
        out.write(results)

    bw = copy_bandwidth(device, (1 << 30) if device.type == "cuda" else (16 << 20))
    results["copy_bandwidth_gb_s"] = round(bw / 1e9, 1)
    gdn = (3, 4, 2, 4, 16, 16, 2) if args.smoke else (32, 16, 16, 32, 128, 128, 24)  # S, T, Hk, Hv, dk, dv, layers
    attn = (4, 4, 2, 32, 40, 16) if args.smoke else (16, 16, 4, 256, 1500, 16)  # T, Hq, Hkv, D, context, page
    with torch.no_grad():
        gdn_rows(gdn, device, bw, record, args.smoke, args.short)
        if not args.short:
            attention_rows(attn, device, bw, record, args.smoke)
    return results


if __name__ == "__main__":
    main()
