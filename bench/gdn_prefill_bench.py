"""The torch GDN prefill (engine/models/gdn_prefill.chunked_delta_rule_torch, the path without fla) at the 4B
layer shape: every sequence of a prefill step in one call vs one call per sequence (how it ran before), timed and
with the number of torch ops each launches (each op is a kernel launch on a GPU), checked against each other; with
fla installed (GPU), its kernel too, timed and compared with the reference.

    python bench/gdn_prefill_bench.py --device cpu --seqs 6 --tokens 1330 --out bench/results/gdn_prefill_cpu.json
    python3 bench/gdn_prefill_bench.py --device cuda --out $OUT/gdn_prefill.json      # also fla's kernel if installed
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from engine.models.gdn_prefill import (
    chunked_delta_rule_torch,
    delta_rule_fla,
    delta_rule_per_sequence,
    fla_available,
)
from engine.step_metadata import chunked_layout

HK, HV, DK, DV = 16, 32, 128, 128  # Qwen3.5-4B linear-attention heads


def inputs(lens: list[int], device: str, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    N = sum(lens)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device)

    q, k = rnd(N, HK, DK).bfloat16(), rnd(N, HK, DK).bfloat16()
    v = rnd(N, HV, DV).bfloat16()
    gate = -torch.rand(N, HV, generator=g, device=device) * 0.3
    beta = torch.rand(N, HV, generator=g, device=device)
    states = rnd(len(lens), HV, DK, DV) * 0.05
    return q, k, v, gate, beta, states


def batched(x, lens):
    rows, n = chunked_layout(lens)
    return chunked_delta_rule_torch(*x, torch.from_numpy(rows).to(x[0].device), n)


def per_sequence(x, lens):
    return delta_rule_per_sequence(*x, lens)


def fla(x, lens):
    cu = torch.tensor([0] + lens, device=x[0].device).cumsum(0)
    return delta_rule_fla(*x, cu, cu.cpu())


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def measure(fn, x, lens, device, repeat):
    fn(x, lens)  # warm-up
    sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(x, lens)
        sync(device)
        times.append(time.perf_counter() - t0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(x, lens)
        sync(device)
    kernels = None
    if device == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as kprof:
            fn(x, lens)
            sync(device)
        kernels = sum(e.count for e in kprof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
    top_ops = sum(e.name.startswith("aten::") and e.cpu_parent is None for e in prof.events())
    return {"ms": 1e3 * min(times), "ms_median": 1e3 * sorted(times)[len(times) // 2], "top_level_torch_ops": top_ops,
            "device_kernels": kernels}


@click.command()
@click.option("--device", default="cuda", type=click.Choice(["cuda", "cpu"]))
@click.option("--seqs", default=6, show_default=True, help="sequences in the step (8192-token steps hold ~6 pages)")
@click.option("--tokens", default=1330, show_default=True, help="tokens per sequence (a page: ~1,330)")
@click.option("--repeat", default=5, show_default=True)
@click.option("--out", default=None)
def main(device, seqs, tokens, repeat, out):
    lens = [tokens - 7 * i for i in range(seqs)]  # not all equal, not powers of two
    x = inputs(lens, device)
    ref_o, ref_s = per_sequence(x, lens)
    o, s = batched(x, lens)
    result = {"lens": lens, "shape": {"Hk": HK, "Hv": HV, "dk": DK, "dv": DV},
              "max_abs_diff_o": (o.float() - ref_o.float()).abs().max().item(),
              "max_abs_diff_state": (s - ref_s).abs().max().item(),
              "gpu": harness.device_name(device) if device == "cuda" else None, "torch": torch.__version__,
              "runs": {}}
    paths = [("per_sequence", per_sequence), ("batched", batched)]
    if device == "cuda" and fla_available():
        paths.append(("fla", fla))
        # fla's kernels run in their own precision and order: compare relative to the reference's size
        fo, fs = fla(x, lens)
        result["fla_vs_reference"] = {
            "max_abs_diff_o_rel": ((fo.float() - ref_o.float()).abs().max() / ref_o.float().abs().max()).item(),
            "max_abs_diff_state_rel": ((fs.float() - ref_s.float()).abs().max() / ref_s.float().abs().max()).item()}
    for name, fn in paths:
        result["runs"][name] = measure(fn, x, lens, device, repeat)
    print(f"{'path':>14} {'ms':>9} {'torch ops':>10} {'kernels':>8}   (one GDN layer, {seqs} x ~{tokens} tokens, "
          f"{device}; |o - o_ref| {result['max_abs_diff_o']:.1e})")
    for name, r in result["runs"].items():
        print(f"{name:>14} {r['ms']:>9.2f} {r['top_level_torch_ops']:>10} {r['device_kernels']!s:>8}")
    if "fla_vs_reference" in result:
        print("fla vs the per-sequence reference (max |diff| / max |ref|):", result["fla_vs_reference"])
    if out:
        harness.write_result(out, result, harness.result_meta(
            __file__, f"the torch GDN prefill (no fla) at the 4B layer shape, {seqs} sequences of ~{tokens} tokens: "
            f"one call per sequence vs the whole step in one call (and fla's kernel where installed): ms, torch ops "
            f"and kernels, outputs compared", device=device), indent=2)


if __name__ == "__main__":
    main()
