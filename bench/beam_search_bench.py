"""Beam search in the native engine on the GPU: what it costs at Qwen3.5-4B's shape.

    python3 bench/beam_search_bench.py run --out $OUT/beam4b    # H200: the beam step against greedy steps
    python3 bench/beam_search_bench.py copy --out $OUT/copy     # H200: the per-step cache copy alone, two ways

`run`: Qwen3.5-4B's shape with random weights (bench/engine_bench.py's page requests, ignore_eos): decode step time of
greedy and beam requests at the same number of sequences per step, so the difference is what beam search adds (its
selection and the state and KV copies); next to it, the copies timed alone at the mean number of blocks each member
copies per step, and the decode memory roofline.
`copy`: ModelRunner.copy_caches' work without a model, by index_copy and by kernels/copy_rows.

What beam search buys in reading quality, and the engine's beam search against transformers', are ocria-tiny
research: research/ocria_tiny/beam_quality.py.
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
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.engine_bench import sync  # noqa: E402

def empty_cache() -> None:
    gc.collect()  # a closed engine's sequences and beam groups refer to each other: free its caches now
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def copy_cost(engine, rows: int, blocks_per_member: int, iters: int = 20) -> float:
    """Seconds per call of ModelRunner.copy_caches for `rows` state rows and `blocks_per_member` KV blocks each
    (random sources, as beams pick their parents)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    dev = engine.device
    slots = torch.arange(rows, device=dev)
    src_slots = slots[torch.randint(rows, (rows,), generator=g).to(dev)]
    blocks = torch.randperm(engine.runner.cache.num_blocks - 1, generator=g)[:rows * blocks_per_member].to(dev) + 1
    src_blocks = blocks.view(rows, -1)[torch.randint(rows, (rows,), generator=g).to(dev)].flatten()
    for _ in range(3):
        engine.runner.copy_caches(src_slots, slots, src_blocks, blocks)
    sync(dev)
    t = time.perf_counter()
    for _ in range(iters):
        engine.runner.copy_caches(src_slots, slots, src_blocks, blocks)
    sync(dev)
    return (time.perf_counter() - t) / iters


def shape_4b(args) -> list[dict]:
    from engine.config import parse_config
    from engine.llm_engine import Engine, EngineOptions
    from bench import engine_bench as b

    torch._dynamo.reset()  # glue compiled for other engines in this process would count against the recompile limit
    bargs = argparse.Namespace(page_image_tokens=args.page_image_tokens, page_gen=args.page_gen, text_prompt=8,
                               text_gen=8)
    device = torch.device(args.device)
    hf_cfg = b.hf_config(tiny=args.tiny_shapes)
    cfg = parse_config(hf_cfg.to_dict())
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hf = b.build_hf_model(hf_cfg, device, dtype)
    max_rows = max(args.batches_4b) * max(args.beams)
    opts = b.engine_options(max_rows, args.page_image_tokens + 24 + args.page_gen, device)
    engine = Engine(cfg, hf.state_dict().items(), device=device, dtype=dtype, options=EngineOptions(**opts))
    del hf
    empty_cache()
    bw = b.copy_bandwidth(device, (2 << 30) if device.type == "cuda" else (64 << 20))
    rng = np.random.default_rng(0)
    engine.generate([dict(r, ignore_eos=True) for r in b.make_requests("page", 2, b.dict_args(bargs, page_gen=4),
                                                                     cfg, rng)])
    rows = []
    # greedy also at batch * k, so each beam run has a greedy run with as many sequences per step
    runs = [(1, n) for n in sorted({n * k for n in args.batches_4b for k in [1] + args.beams})]
    for k, batch in runs + [(k, n) for k in args.beams for n in args.batches_4b]:
        r = b.run_native(engine, "page", batch, bargs, rng, bw, cfg, dtype, num_beams=k)
        r["part"] = f"{'tiny' if args.tiny_shapes else '4B'} shape, random, {str(dtype)[6:]}"
        r.pop("roofline_bytes")
        if k > 1:  # ModelRunner.copy_caches alone: at mid-answer a member copies the blocks written so far
            mean_blocks = max(1, round(args.page_gen / 2 / opts["block_size"]))
            r["copy_caches_ms_mid_answer"] = 1e3 * copy_cost(engine, batch * k, mean_blocks)
        rows.append(r)
        print(json.dumps(r), flush=True)
    by = {(r["num_beams"], r["batch"] * r["num_beams"]): r for r in rows}
    for r in rows:  # against greedy with as many sequences per step
        g = by.get((1, r["batch"] * r["num_beams"]))
        if r["num_beams"] > 1 and g is not None:
            r["step_ms_over_greedy_same_rows"] = r["decode_step_ms"] - g["decode_step_ms"]
    return rows


def copy_variants(args, argv=None) -> None:
    """ModelRunner.copy_caches' work at the 4B shape without a model: each member's GDN state (conv + fp32
    recurrent) and its KV blocks since the prompt, copied by index_select + index_copy (every row) and by
    kernels/copy_rows (moved rows only), for shares of members that continue themselves; next to each, the time the
    moved bytes take at the measured copy bandwidth (each moved row is read and written twice: buffer, then place)."""
    from engine.config import parse_config
    from bench import engine_bench as b
    from kernels.copy_rows import copy_rows_ref, copy_rows_triton

    cfg = parse_config(b.hf_config(tiny=args.tiny_shapes).to_dict()).text
    dev, rows, nb = torch.device(args.device), args.rows, args.blocks_per_member
    gdn, attn = len(cfg.linear_attention_layers), len(cfg.full_attention_layers)
    block = b.engine_options(1, 1, dev)["block_size"]  # the benchmark engine's KV block
    caches = {  # ModelRunner's layouts, bf16 but the fp32 recurrent state
        "conv": torch.zeros(gdn, rows, cfg.gdn_conv_dim, cfg.linear_conv_kernel_dim - 1, dtype=torch.bfloat16,
                            device=dev),
        "ssm": torch.zeros(gdn, rows, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                           cfg.linear_value_head_dim, dtype=torch.float32, device=dev),
        "k": torch.zeros(attn, rows * nb + 1, block, cfg.num_key_value_heads, cfg.head_dim, dtype=torch.bfloat16,
                         device=dev),
    }
    caches["v"] = torch.zeros_like(caches["k"])
    bw = b.copy_bandwidth(dev, (2 << 30) if dev.type == "cuda" else (64 << 20))
    g = torch.Generator().manual_seed(0)
    result = {"rows": rows,
              "blocks_per_member": nb, "copy_bandwidth_GBps": bw / 1e9,
              "row_bytes": {k: c[:, 0].numel() * c.element_size() for k, c in caches.items()}, "results": []}
    print(f"{'stay':>6}{'same':>6}{'index_copy ms':>15}{'copy_rows ms':>14}{'moved-bytes ms':>16}")
    for stay in args.stay_shares:
        slots = torch.arange(rows)
        moved = torch.rand(rows, generator=g) >= stay
        src_slots = torch.where(moved, torch.randint(rows, (rows,), generator=g), slots)
        blocks = torch.arange(1, rows * nb + 1).view(rows, nb)
        src_blocks = blocks[src_slots].flatten()
        idx = {"conv": (src_slots, slots), "ssm": (src_slots, slots), "k": (src_blocks, blocks.flatten()),
               "v": (src_blocks, blocks.flatten())}
        idx = {k: (a.to(dev), d.to(dev)) for k, (a, d) in idx.items()}
        identical = True  # both ways give the same caches (filled with distinct values first)
        for k, c in caches.items():
            c.copy_(torch.randn(c.shape, device=dev, dtype=torch.float32).to(c.dtype))
            ref = copy_rows_ref(c.clone(), *idx[k])
            identical &= bool(torch.equal(copy_rows_triton(c.clone(), *idx[k]), ref))
            del ref
        times = {}
        for name, fn in (("index_copy", copy_rows_ref), ("copy_rows", copy_rows_triton)):
            def once():
                for k, c in caches.items():
                    fn(c, *idx[k])
            for _ in range(2):
                once()
            sync(dev)
            t = time.perf_counter()
            for _ in range(args.iters):
                once()
            sync(dev)
            times[name] = 1e3 * (time.perf_counter() - t) / args.iters
        really = int((src_slots != slots).sum())
        moved_bytes = really * sum(result["row_bytes"][k] * (nb if k in "kv" else 1) for k in caches)
        r = {"stay_share": stay, "identical": identical, "members_moved": really,
             "index_copy_ms": times["index_copy"], "copy_rows_ms": times["copy_rows"], "moved_bytes": moved_bytes,
             "moved_bytes_ms": 1e3 * 4 * moved_bytes / bw}
        result["results"].append(r)
        print(f"{stay:>6.2f}{str(identical):>6}{r['index_copy_ms']:>15.2f}{r['copy_rows_ms']:>14.2f}"
              f"{r['moved_bytes_ms']:>16.2f}", flush=True)
    harness.write_result(args.out / "beam_copy.json", result, harness.result_meta(
        __file__, "ModelRunner.copy_caches' work without a model: each beam member's GDN state and KV blocks copied by "
        "index_copy and by kernels/copy_rows, at shares of members that stay, with the moved bytes' time at the copy "
        "bandwidth", argv, dev))
    if not all(r["identical"] for r in result["results"]):
        sys.exit("copy_rows and index_copy disagree")


def table(rows: list[dict]) -> str:
    lines = [f"{'part':<34}{'beams':>6}{'batch':>6}{'pages/s':>9}{'CER':>7}{'ident.':>8}{'step ms':>9}"
             f"{'+ms':>7}{'copy ms':>8}{'roof ms':>8}"]
    for r in rows:
        f = lambda key, fmt: format(r[key], fmt) if r.get(key) is not None else "-"  # noqa: E731
        ident = f"{r['identical']}/{r['pages']}" if "identical" in r else "-"
        rate = r.get("pages_per_s", r.get("requests_per_s"))
        lines.append(f"{r['part']:<34}{r['num_beams']:>6}{r.get('batch', r.get('pages', '-')):>6}"
                     f"{format(rate, '.2f') if rate else '-':>9}{f('text_cer', '.3f'):>7}{ident:>8}"
                     f"{f('decode_step_ms', '.2f'):>9}{f('step_ms_over_greedy_same_rows', '.2f'):>7}"
                     f"{f('copy_caches_ms_mid_answer', '.2f'):>8}{f('roofline_ms', '.2f'):>8}")
    return "\n".join(lines)


def run(args, argv=None) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    meta = harness.result_meta(
        __file__, "beam search at the 4B shape (random weights, page requests): decode step time of greedy and beam "
        "requests at the same sequences per step, the cache copies alone, the decode roofline", argv, args.device)
    result = {"torch": torch.__version__, "rows": shape_4b(args)}
    harness.write_result(args.out / "beam_search.json", result, meta)
    print("\n" + table(result["rows"]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rn = sub.add_parser("run", help="the beam step against greedy steps, at the 4B shape")
    rn.add_argument("--out", type=Path, required=True)
    rn.add_argument("--beams", default="4", type=lambda s: [int(x) for x in s.split(",")])
    rn.add_argument("--skip-tiny", action="store_true",
                    help="accepted so the recorded commands run as written: the ocria-tiny parts are "
                         "research/ocria_tiny/beam_quality.py's")
    rn.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (with --tiny-shapes)")
    rn.add_argument("--tiny-shapes", action="store_true", help="bench/engine_bench.py's tiny shapes")
    rn.add_argument("--batches-4b", default="8,32", type=lambda s: [int(x) for x in s.split(",") if x])
    rn.add_argument("--page-image-tokens", type=int, default=1296)
    rn.add_argument("--page-gen", type=int, default=750)
    cp = sub.add_parser("copy", help="the per-step cache copy alone, at the 4B shape")
    cp.add_argument("--out", type=Path, required=True)
    cp.add_argument("--device", default="cuda")
    cp.add_argument("--tiny-shapes", action="store_true")
    cp.add_argument("--rows", type=int, default=128, help="beam members (32 requests x 4 beams)")
    cp.add_argument("--blocks-per-member", type=int, default=12, help="KV blocks since the prompt (mid-answer)")
    cp.add_argument("--stay-shares", default="0,0.5,0.8,1", type=lambda s: [float(x) for x in s.split(",")])
    cp.add_argument("--iters", type=int, default=10)
    args = ap.parse_args(argv)
    {"run": run, "copy": copy_variants}[args.cmd](args, argv)


if __name__ == "__main__":
    main()
