#!/usr/bin/env bash
# #59's GPU measurements in one device call (carried wheels, if any, installed by bench/device_env.sh): the decode step profiled per precision, the
# small-M quantized GEMV sweep, then (PARTS has "bench") the quantized decode benchmark. Results under $1 (default $OUT).
#   PARTS="profile gemv bench" bash bench/quant_gpu.sh $OUT
set -uo pipefail
out=${1:-$OUT}; PARTS=${PARTS:-profile gemv}
source bench/device_env.sh
gpu=$(python3 -c "import torch; n=torch.cuda.get_device_name(); print('h200' if 'H200' in n else 'h100')")
[[ " $PARTS " == *" profile "* ]] && TAIL=60 step ${PROFILE_S:-240} python3 bench/decode_profile.py --variants default \
  --precisions ${PRECISIONS:-bf16,fp8,nvfp4} --batch-sizes ${PROFILE_BATCHES:-1,8} --steps 5 --graph-steps 20 --top 8 \
  --out "$out/prof" && cp "$out/prof/decode_profile.json" "$out/${gpu}_quant_decode_profile.json"
[[ " $PARTS " == *" gemv "* ]] && step ${GEMV_S:-300} python3 bench/quant_gemv_bench.py --budget-s ${GEMV_BUDGET:-200} \
  ${GEMV_FLAGS:-} --out "$out/${gpu}_quant_gemv.json"
[[ " $PARTS " == *" bench "* ]] && step ${BENCH_S:-400} python3 bench/quantized_decode_bench.py \
  --batch-sizes ${BATCHES:-1,8,32,64,128,256} ${BENCH_FLAGS:-} --out "$out/${gpu}_quantized_decode.json"
rm -rf "$out/prof"
