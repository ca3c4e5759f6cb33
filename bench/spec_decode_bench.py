"""Speculative decoding on the GPU: what it buys per sequence, against plain decoding in the same run.

    python3 bench/spec_decode_bench.py --pages PAGES --drafter DRAFTER --out bench/results/h200_spec_decode.json
    python bench/spec_decode_bench.py --device cpu --smoke --out /tmp/spec_smoke.json     # CPU, toy shapes

Two parts, each written to the results file as soon as it is done (`rows`, `notes`):
1. ocria-tiny (bf16) reads the PNG block images in PAGES greedily at batch 1, 8, 32, 128 with speculation off and on
   (DRAFTER at --block-sizes): per-sequence decode tok/s (RequestOutput.decode_tokens_per_s, mean), pages/s, tau,
   acceptance by block position; any answer that differs from plain decoding is listed with the top-2 logit margin
   of plain decoding at its first differing token.
2. the Qwen3.5-4B shape with random weights (bench/engine_bench.py's page requests): a random drafter is never right, so
   the real draft and verify passes run and the target is made to accept the first a drafts of each block, a drawn
   per step from an acceptance profile (per block position, the chance a draft is accepted given the ones before it
   were): part 1's measured profile, then each --profile. Method "acceptance drawn from a profile". tok/s per
   sequence and total at batch 1, 8, 32, 64, 128 against plain decode, timed once per batch on the same requests
   that every block size then runs.
Both parts time each GDN write-back threshold of --fold-after (DecodeTuning.spec_fold_after) at each block size.
The step's kernels alone, each launch configuration against the torch reference, fla and the rooflines:
bench/spec_kernels_bench.py.

Rows: {model, batch, block_size, tau, tok_s_per_seq, tok_s_per_seq_plain, speedup, method, ...}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.engine_bench import sync  # noqa: E402
from engine.drafter_training import divergences  # noqa: E402
from engine.interface import SpecStats  # noqa: E402
from engine.interface import SamplingParams  # noqa: E402
from engine.llm_engine import Engine  # noqa: E402
from engine.options import DecodeTuning, EngineOptions  # noqa: E402
from engine.spec_graphs import SpecGraphs  # noqa: E402
from engine.speculative import SpecDecoder  # noqa: E402
from engine.testing import write_random_drafter  # noqa: E402

DEFAULT_PROFILE = [0.9] * 15  # per-position conditional acceptance when no measured profile is given


class ProfiledAcceptance(SpecDecoder):
    """Runs the real draft and verify passes (their cost is what is measured) and makes the target accept the first
    a drafts of each block, a drawn per step from `profile` (conditional acceptance per block position): the verify
    logits get a large bonus on those drafts. Replaying a plain run's greedy continuation instead does not work with
    random weights in bf16: their logits are so flat that the batched verify pass and plain decoding break ties
    differently, and almost nothing is accepted. The drawn counts are written on the host before each step into a
    device buffer the step reads, so a captured step (engine/spec_graphs) follows them too."""

    profile: list = DEFAULT_PROFILE
    rng = np.random.default_rng(0)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.forced = torch.zeros(args[3], 1, dtype=torch.int64, device=self.runner.device)

    def step(self, seqs):
        T, a = self.T, np.full((len(seqs), 1), self.T - 1, dtype=np.int64)
        for r in range(len(seqs)):
            for j in range(T - 1):  # the first rejected position
                if self.rng.random() >= self.profile[min(j, len(self.profile) - 1)]:
                    a[r, 0] = j
                    break
        self.forced[:len(seqs)].copy_(torch.from_numpy(a))
        return super().step(seqs)

    def verify(self, block, d):
        logits = super().verify(block, d)
        S, T = block.shape
        take = torch.arange(T - 1, device=block.device)[None, :] < self.forced[:S]
        bonus = torch.where(take, 1e4, 0.0).to(logits.dtype)[..., None]
        logits[:, :-1].scatter_add_(2, block[:, 1:, None], bonus)
        return logits


def per_seq_tok_s(outs) -> float:
    return float(np.mean([o.decode_tokens_per_s for o in outs if o.output_tokens > 1]))


def acceptance(outs) -> tuple[float, list[float]]:
    spec = SpecStats.total(o.spec for o in outs)
    return spec.tau, [round(x, 4) for x in spec.acceptance_by_position()]


def conditional_profile(by_pos: list[float]) -> list[float]:
    """Unconditional acceptance by position (share of drafts accepted) -> conditional (given the ones before)."""
    out, prev = [], 1.0
    for p in by_pos:
        out.append(min(1.0, p / prev) if prev > 0 else 0.0)
        prev = p
    return out


def timed(engine, reqs, repeats: int = 1):
    """(outputs, seconds): the median of `repeats` runs of the same requests (a small model's run is host-bound and
    varies from run to run; greedy outputs do not)."""
    seconds = []
    for _ in range(repeats):
        sync(engine.device)
        t = time.perf_counter()
        outs = engine.generate(reqs)
        sync(engine.device)
        seconds.append(time.perf_counter() - t)
    return outs, statistics.median(seconds)


def tiny_rows(args, device, dtype, record) -> None:
    from PIL import Image

    files = sorted(Path(args.pages).glob("*.png"))
    if not files:
        raise SystemExit(f"--pages {args.pages}: no PNG block images (bench/drafter_block_pages.py writes them)")
    images = [np.asarray(Image.open(f).convert("RGB")) for f in files]
    max_b = max(args.batches)
    common = dict(device=device, dtype=dtype, max_num_seqs=max_b, enforce_eager=args.device == "cpu")
    plain_engine = Engine.from_checkpoint(args.checkpoint, **common)
    for block, fold_after in ((block, f) for block in args.block_sizes for f in args.fold_after):
        spec_engine = Engine.from_checkpoint(args.checkpoint, speculative=dict(
            drafter=args.drafter, num_speculative_tokens=block - 1, max_batch=None),
                                             tuning=DecodeTuning(spec_fold_after=fold_after), **common)
        for batch in args.batches:
            reqs = [dict(request_id=f"b{batch}-{i}", image=images[i % len(images)], prompt=args.prompt,
                         sampling=SamplingParams(max_tokens=args.max_tokens)) for i in range(batch)]
            warm_up(plain_engine, reqs)
            plain, t_plain = timed(plain_engine, reqs, args.repeats)
            for path in spec_paths(spec_engine.spec, batch, args.eager_batches):
                warm_up(spec_engine, reqs)
                spec, t_spec = timed(spec_engine, reqs, args.repeats)
                tau, by_pos = acceptance(spec)
                tps, tps_plain = per_seq_tok_s(spec), per_seq_tok_s(plain)
                record("rows", {"model": "ocria-tiny", "batch": batch, "block_size": block, "tau": round(tau, 3),
                                "tok_s_per_seq": round(tps, 1), "tok_s_per_seq_plain": round(tps_plain, 1),
                                "speedup": round(tps / tps_plain, 3), "pages_s": round(batch / t_spec, 3),
                                "pages_s_plain": round(batch / t_plain, 3), "acceptance_by_position": by_pos,
                                "identical": [a.output_token_ids == b.output_token_ids
                                              for a, b in zip(plain, spec)].count(True),
                                "divergences": divergences(plain_engine, reqs, plain, spec), "spec_step": path,
                                "spec_fold_after": fold_after,
                                "method": f"ocria-tiny, drafter {Path(args.drafter).name}, greedy, {str(dtype)[6:]}"})
        del spec_engine


def shape_4b_rows(args, device, dtype, record, profiles) -> None:
    from engine.config import parse_config
    from bench import engine_bench as b

    hf_cfg = b.hf_config(tiny=args.smoke)
    cfg = parse_config(hf_cfg.to_dict())
    hf = b.build_hf_model(hf_cfg, device, dtype)
    weights = list(hf.state_dict().items())
    del hf
    bargs = argparse.Namespace(page_image_tokens=args.page_image_tokens, page_gen=args.page_gen, text_prompt=8,
                               text_gen=8)
    max_b = max(args.batches_4b)
    opts = b.engine_options(max_b, args.page_image_tokens + 40 + args.page_gen + max(args.block_sizes), device,
                            enforce_eager=args.device == "cpu")
    plain_engine = Engine(cfg, weights, device=device, dtype=dtype, options=EngineOptions(**opts))
    rng = np.random.default_rng(0)
    # the same requests at every block size, plain decoding timed once per batch
    reqs_of = {batch: [dict(r, request_id=f"4b-{batch}-{i}", ignore_eos=True)
                       for i, r in enumerate(b.make_requests("page", batch, bargs, cfg, rng))]
               for batch in args.batches_4b}
    plain_of = {}
    for batch, reqs in reqs_of.items():
        warm_up(plain_engine, reqs)
        plain_of[batch] = timed(plain_engine, reqs)
    del plain_engine
    drafter_dir = Path(tempfile.mkdtemp(prefix="drafter4b-"))
    for block, fold_after in ((block, f) for block in args.block_sizes for f in args.fold_after):
        write_random_drafter(drafter_dir, cfg.text, num_layers=1 if args.smoke else 5,
                             num_taps=2 if args.smoke else 5, block_size=block, dtype=dtype)
        # built without graphs: the decoder below is the one whose steps are captured
        spec_engine = Engine(cfg, weights, device=device, dtype=dtype,
                             options=EngineOptions(**dict(opts, enforce_eager=True), speculative=dict(
                                 drafter=str(drafter_dir), max_batch=None)),
                             tuning=DecodeTuning(spec_fold_after=fold_after))
        forced = ProfiledAcceptance(spec_engine.runner, spec_engine.spec.drafter, block, max_b)
        forced.graphs = SpecGraphs(forced, max_b, spec_engine.runner.cache.max_blocks_per_seq,
                                   spec_engine.runner.scratch_slot, capture=True)  # captured on CUDA only
        spec_engine.spec = forced
        for batch in args.batches_4b:
            reqs = reqs_of[batch]
            plain, t_plain = plain_of[batch]
            tokens = sum(o.output_tokens for o in plain)
            for name, profile in profiles:
                forced.profile = profile
                for path in spec_paths(forced, batch, args.eager_batches):
                    warm_up(spec_engine, reqs)
                    spec, t_spec = timed(spec_engine, reqs)
                    tau, by_pos = acceptance(spec)
                    tps, tps_plain = per_seq_tok_s(spec), per_seq_tok_s(plain)
                    record("rows", {"model": "4b-shape" if not args.smoke else "tiny-shape", "batch": batch,
                                    "block_size": block, "tau": round(tau, 3), "tok_s_per_seq": round(tps, 1),
                                    "tok_s_per_seq_plain": round(tps_plain, 1), "speedup": round(tps / tps_plain, 3),
                                    "tok_s_total": round(tokens / t_spec, 1),
                                    "tok_s_total_plain": round(tokens / t_plain, 1),
                                    "acceptance_by_position": by_pos, "spec_step": path, "profile": name,
                                    "spec_fold_after": fold_after,
                                    "method": "acceptance drawn from a profile: the target accepts the first a "
                                              "drafts of each block, a drawn per step from the conditional "
                                              f"acceptance {[round(p, 3) for p in profile]} ({name}); random "
                                              f"weights, {str(dtype)[6:]}, real draft and verify passes"})
        del spec_engine


def warm_up(engine, reqs) -> None:
    """The same requests, a few tokens each, first: so that no timed run pays for compiling the prefill shapes of
    its batch or for first-use allocation (one short request left the plain run of a new batch paying for them)."""
    engine.generate([dict(r, request_id=f"warm-up-{i}", sampling=SamplingParams(max_tokens=8))
                     for i, r in enumerate(reqs)])


def spec_paths(decoder, batch: int, eager_batches):
    """Yields the step path to time: 'graphs' (static buffers, CUDA graphs on CUDA) or 'eager' (no static path),
    the second only for batches in eager_batches; the decoder is left as it was."""
    graphs = decoder.graphs
    if graphs is not None:
        yield "graphs"
    if graphs is None or batch in eager_batches:
        decoder.graphs = None
        try:
            yield "eager"
        finally:
            decoder.graphs = graphs


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true", help="toy shapes and sizes (CPU check that everything runs)")
    p.add_argument("--checkpoint", default=str(ROOT / "models" / "ocria-tiny"))
    p.add_argument("--drafter", help="ocria-tiny's drafter folder (part 1; skipped without it)")
    p.add_argument("--pages", help="folder of PNG block images for part 1")
    p.add_argument("--prompt", default="Convert this page to markdown.")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--batches-4b", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    p.add_argument("--block-sizes", type=int, nargs="+", default=[16, 8])
    p.add_argument("--profile", action="append", default=[],
                   help="[NAME=]JSON list (or a file of one): conditional acceptance per block position for part "
                        "2; may be given more than once. Part 2 runs part 1's measured profile first when part 1 ran, "
                        "the given ones after it, 0.9 everywhere when there is neither")
    p.add_argument("--fold-after", type=int, nargs="+", default=[0],
                   help="DecodeTuning.spec_fold_after values to time at each block (accepted GDN updates kept "
                        "pending before a verify writes the state back)")
    p.add_argument("--page-image-tokens", type=int, default=1300)
    p.add_argument("--page-gen", type=int, default=256)
    p.add_argument("--parts", nargs="+", choices=["tiny", "4b"], default=["tiny", "4b"])
    p.add_argument("--repeats", type=int, default=1,
                   help="part 1: each timing is the median of this many runs of the same requests")
    p.add_argument("--eager-batches", type=int, nargs="*", default=[],
                   help="batches also timed with the eager speculative step (no static buffers / CUDA graphs)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "h200_spec_decode.json"))
    args = p.parse_args(argv)
    if args.smoke:
        args.batches, args.batches_4b, args.block_sizes = [1, 2], [1, 2], [4]
        args.max_tokens, args.page_image_tokens, args.page_gen = 6, 16, 8
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    results = {"rows": [], "notes": []}
    out = harness.ResultFile(args.out, harness.result_meta(
        __file__, f"speculative against plain decoding per sequence in the same run, block "
        f"{', '.join(map(str, args.block_sizes))}{' (toy sizes)' if args.smoke else ''}, parts "
        f"{' and '.join(args.parts)}: tiny = ocria-tiny with a drafter on block images (tau, tok/s per sequence, "
        f"answers checked), 4b = the 4B shape with acceptance drawn from a profile", argv, device))

    def record(part, item):
        results[part].append(item)
        print(json.dumps(item), flush=True)
        out.write(results)

    if "tiny" in args.parts:
        if args.drafter and args.pages:
            tiny_rows(args, device, dtype, record)
        else:
            record("notes", "part 1 (ocria-tiny) skipped: give --drafter and --pages")
    profiles = []
    for i, given in enumerate(args.profile):  # [NAME=]JSON list or file
        name, _, value = given.rpartition("=") if "=" in given.split("[")[0] else ("", "", given)
        profiles.append((name or f"given {i}",
                         json.loads(Path(value).read_text() if Path(value).is_file() else value)))
    tiny = [r for r in results["rows"] if r["model"] == "ocria-tiny"]
    if tiny:  # the most pages at the longest block
        profiles.insert(0, ("ocria-tiny measured", conditional_profile(
            max(tiny, key=lambda r: (r["block_size"], r["batch"]))["acceptance_by_position"])))
    if "4b" in args.parts:
        shape_4b_rows(args, device, dtype, record, profiles or [("default 0.9", DEFAULT_PROFILE)])


if __name__ == "__main__":
    main()
