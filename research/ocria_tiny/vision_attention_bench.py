"""The training vision attention on the GPU: flash attention's variable-length kernel against the padded, masked SDPA
call (research/ocria_tiny/packed_vision_attention.py), forward and backward, at a 1,536 px training batch's shape.

    python3 -m research.ocria_tiny.vision_attention_bench --out $OUT/vision_attention.json

Checks: both bf16 paths against an fp32 reference (the padded call in fp32, TF32 off) on small odd lengths and at the
batch shape; then times forward + backward of each. The roofline is the attention's matmul FLOPs (forward 4 * L^2 * d
per image and head, backward 2.5x that) at the H200's dense bf16 rate.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from bench.kernels_bench import rel_error
from research.ocria_tiny.packed_vision_attention import padded_attention, varlen_flash_attention

DENSE_BF16_TFLOPS = 989.0  # H200 SXM datasheet, dense


def inputs(lengths: list[int], heads: int, dim: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(1, heads, total, dim, device="cuda", generator=g) for _ in range(3))
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0)
    probe = torch.randn(total, heads, dim, device="cuda", generator=g)
    return q, k, v, cu, probe


def run(path: str, q, k, v, cu, probe, dtype):
    """Output [T, heads, d] and the gradients of sum(out * probe) w.r.t. q, k, v, in fp32."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    longest = int((cu[1:] - cu[:-1]).max())
    out = (varlen_flash_attention(q, k, v, cu, longest) if path == "varlen"
           else padded_attention(q, k, v, cu, longest))
    (out.float() * probe).sum().backward()
    return [t.float() for t in (out.detach(), q.grad, k.grad, v.grad)]


def check(lengths, heads, dim, seed) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v, cu, probe = inputs(lengths, heads, dim, seed)
    want = run("padded", q, k, v, cu, probe, torch.float32)
    res = {"images": len(lengths), "tokens": sum(lengths)}
    for path in ("padded", "varlen"):
        got = run(path, q, k, v, cu, probe, torch.bfloat16)  # out, dq, dk, dv: each max |error| / max |want|
        res[f"{path}_bf16_rel_err"] = [rel_error(a, b) for a, b in zip(got, want)]
    return res


def time_ms(fn, reps: int = 5) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[reps // 2]


def timing(lengths, heads, dim) -> dict:
    q, k, v, cu, probe = inputs(lengths, heads, dim, seed=3)
    flops = sum(4 * n * n * dim * heads for n in lengths) * 3.5  # forward + 2.5x backward
    res = {"images": len(lengths), "tokens": sum(lengths), "roofline_ms": flops / (DENSE_BF16_TFLOPS * 1e12) * 1e3}
    for path in ("padded", "varlen"):
        res[f"{path}_fwd_bwd_ms"] = time_ms(lambda: run(path, q, k, v, cu, probe, torch.bfloat16))
        res[f"{path}_tflops"] = flops / res[f"{path}_fwd_bwd_ms"] / 1e9
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--images", type=int, default=64, help="pages per training batch")
    args = ap.parse_args()
    heads, dim = 3, 64  # ocria-tiny's vision tower: width 192, 3 heads
    # 1,536 px pages of 1,066-1,256 px width: 96 x 67-78 patches of 16 px (lengths are multiples of 4: 2x2 merge)
    gen = torch.Generator().manual_seed(0)
    batch = [96 * int(w) for w in torch.randint(67, 79, (args.images,), generator=gen)]
    checks = [check([37, 1, 250, 99, 1023], heads, dim, seed=1), check(batch[:8], heads, dim, seed=2)]
    timed = timing(batch, heads, dim)
    res = {"command": "python3 -m research.ocria_tiny.vision_attention_bench " + " ".join(sys.argv[1:]),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "heads": heads, "head_dim": dim,
           "checks": checks, "timing": timed}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"{'images':>6} {'tokens':>8}  rel. error vs fp32 (out, dq, dk, dv): padded bf16 | varlen bf16")
    for c in checks:
        fmt = lambda xs: " ".join(f"{x:.1e}" for x in xs)  # noqa: E731
        print(f"{c['images']:>6} {c['tokens']:>8}  {fmt(c['padded_bf16_rel_err'])} | {fmt(c['varlen_bf16_rel_err'])}")
    t = timed
    print(f"fwd+bwd at {t['images']} images / {t['tokens']} tokens: padded {t['padded_fwd_bwd_ms']:.1f} ms "
          f"({t['padded_tflops']:.0f} TFLOP/s), varlen {t['varlen_fwd_bwd_ms']:.1f} ms ({t['varlen_tflops']:.0f} "
          f"TFLOP/s), roofline {t['roofline_ms']:.1f} ms")


if __name__ == "__main__":
    main()
