#!/usr/bin/env bash
# One device command: the full benchmark (text and page scenarios, b1/8/32/64) with today's default and
# the same without programmatic dependent launch against transformers + fla, then the CUDA correctness check.
#   bash bench/h200_benchmark_refresh.sh $OUT          # carry .gpu/wheels (fla)
# bench/results/h200_engine_benchmark.json came from it at commit 3befff7 (before PDL was the default, so with
# --variants native,native_pdl): 551 s in all, and transformers' page b64 run did not fit the first step's 380 s.
set -uo pipefail
out=${1:?out}
source bench/device_env.sh
step 420 python3 bench/engine_bench.py --device cuda --out "$out/bench" --variants native,native_no_pdl --hf-max-new 64
step 150 python3 bench/gpu_check.py --dtypes float32 --requests 8 --out "$out/gpu_check.json"
