#!/usr/bin/env bash
# #60's engine measurements in one device call (no carried wheels): the engine alone at page load (1,296 image
# tokens + scaffolding in, 750 out, random 4B weights) per variant and batch, decode step against its roofline, and
# the greedy/logit agreement of each variant with the first over CHECK_TOKENS tokens. Results under $1 (default $OUT).
# Carry .whl/bench (bench/device_inputs.sh): fla's chunked GDN prefill is the product's (pyproject's gpu extra), and
# without it prefill runs the torch fallback, about 2.6x slower a GDN layer (bench/results/h200_gdn_prefill_fla.json).
#   VARIANTS=native,native_bf16_state BATCHES=128,256 bash bench/throughput_gpu.sh $OUT
# Each variant at a batch of 256 takes ~90 s with its 750-token check (H100): four variants at two batches did not fit
# one 600 s call. The next: VARIANTS=native,native_bf16_state_fp8_kv,native_fp8_bf16_state_fp8_kv BATCHES=256.
set -uo pipefail
out=${1:-$OUT}
source bench/device_env.sh
gpu=$(python3 -c "import torch; n=torch.cuda.get_device_name(); print('h200' if 'H200' in n else 'h100')")
t0=$SECONDS
timeout ${ENGINE_S:-540} python3 bench/engine_bench.py --device cuda --scenarios page --skip-transformers \
  --variants ${VARIANTS:-native,native_bf16_state,native_fp8_kv,native_bf16_state_fp8_kv} --batch-sizes ${BATCHES:-128,256} \
  --check-tokens ${CHECK_TOKENS:-750} --out "$out/engine" 2>&1 | grep -v -i warn | tail -n 30
echo "== rc ${PIPESTATUS[0]} in $((SECONDS - t0)) s"
cp "$out/engine/benchmark.json" "$out/${gpu}_engine_page_load.json" 2>/dev/null
cp "$out/engine/benchmark.png" "$out/${gpu}_engine_page_load.png" 2>/dev/null
rm -rf "$out/engine"
