"""Correctness of the GPU path: the native engine on CUDA (Triton kernels, CUDA graphs, fla prefill when
installed) against transformers on the same tiny real-format checkpoint, greedy, page requests end to end.

    python3 bench/gpu_check.py --out $OUT/gpu_check.json

fp32 (TF32 off on both sides, the tiny random checkpoint): token-for-token equality is required.
bf16 (the trained ocria-tiny, whose distributions are peaked, unlike a random model's): the share of identical
outputs is reported, since rounding can flip near-tied tokens in either implementation.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from engine.backend_transformers import TransformersBackend  # noqa: E402
from engine.interface import PageRequest, SamplingParams  # noqa: E402
from engine.native_backend import NativeBackend  # noqa: E402
from engine.testing import build_tiny_checkpoint  # noqa: E402


def pages(n: int, seed: int) -> list[PageRequest]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = int(rng.integers(90, 400)), int(rng.integers(90, 400))  # mixed sizes -> mixed prompt lengths
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        out.append(PageRequest(f"p{i}", img, sampling=SamplingParams(max_tokens=int(rng.integers(8, 48)))))
    return out


def compare(ckpt: Path, dtype: str, n: int, seed: int) -> dict:
    reqs = pages(n, seed)
    t = time.perf_counter()
    native = NativeBackend(ckpt, device="cuda", dtype=dtype).parse(reqs)
    native_s = time.perf_counter() - t
    ref = TransformersBackend(ckpt, device="cuda", dtype=dtype, max_batch_size=1).parse(reqs)
    same = [a.text == b.text and a.output_tokens == b.output_tokens for a, b in zip(native, ref)]
    errors = [r.error for r in native if r.finish_reason == "error"]
    return {"dtype": dtype, "requests": n, "identical": sum(same), "native_errors": errors, "native_s": native_s,
            "first_mismatch": next(({"native": a.text[:80], "transformers": b.text[:80]}
                                    for a, b, s in zip(native, ref, same) if not s), None)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--dtypes", default="float32,bfloat16",
                    help="float32: the tiny random checkpoint; bfloat16: the shipped models/ocria-tiny")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    torch.backends.cuda.matmul.allow_tf32 = False  # cuDNN's default TF32 would make the reference the imprecise side
    torch.backends.cudnn.allow_tf32 = False
    results = []
    out = args.out and harness.ResultFile(args.out, harness.result_meta(
        __file__, f"the native engine on CUDA against transformers, greedy page requests token for token, "
        f"{args.requests} requests per dtype ({args.dtypes}): float32 on the tiny random checkpoint, bfloat16 on "
        f"models/ocria-tiny", device="cuda"))
    trained = Path(__file__).resolve().parents[1] / "models" / "ocria-tiny"
    print(f"{'dtype':<10}{'identical':>12}{'errors':>8}{'native s':>10}{'total s':>10}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes.split(","):
            t = time.perf_counter()
            if dtype == "float32":
                r = compare(build_tiny_checkpoint(Path(tmp) / "tiny-float32", seed=0, dtype="float32"), dtype,
                            args.requests, seed=1)
            elif (trained / "model.safetensors").exists():
                r = compare(trained, dtype, args.requests, seed=2)
            else:
                continue
            r["total_s"] = time.perf_counter() - t
            results.append(r)
            print(f"{r['dtype']:<10}{r['identical']:>5} / {r['requests']:<4}{len(r['native_errors']):>8}"
                  f"{r['native_s']:>10.2f}{r['total_s']:>10.2f}", flush=True)
            if out:  # after each comparison, so a time limit keeps what was checked
                out.write({"results": results}, indent=2)
    fp32 = next((r for r in results if r["dtype"] == "float32"), None)
    if fp32 is not None and (fp32["identical"] != fp32["requests"] or fp32["native_errors"]):
        sys.exit("fp32 outputs differ from transformers")


if __name__ == "__main__":
    main()
