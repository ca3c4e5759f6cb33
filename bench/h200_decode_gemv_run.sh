#!/usr/bin/env bash
# One device command (session 11): the decode GEMV path (kernels/small_m_linear with RMSNorm / SwiGLU fused in, GDN
# gates inside the recurrent kernel) on the H200, checked, then timed against the cuBLAS path in the same run.
#   bash bench/h200_decode_gemv_run.sh $OUT          # carry .gpu/wheels (fla)
# Each step has its own time limit, so a slow one leaves the others' results under $OUT.
set -uo pipefail
out=${1:?out}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
step() { local s=$1; shift; local t0=$SECONDS; timeout "$s" "$@" 2>&1 | grep -v -i warn | tail -n 40; echo "== rc ${PIPESTATUS[0]} in $((SECONDS - t0)) s: $*"; }
# 1. correctness on CUDA: native vs transformers, fp32 token-for-token and bf16 ocria-tiny
step 110 python3 bench/gpu_check.py --out "$out/gpu_check.json"
# 2. the engine at the 4B shape: new default vs the old cuBLAS path, the other candidates, and transformers (text
#    decode at b1 / b8; PDL last: the newest code)
step 280 python3 jobs/benchmark.py --device cuda --out "$out/bench" --scenarios text --batch-sizes 1,8 \
  --variants native,native_cublas,native_norm_unfused,native_fused_attn,native_pdl --hf-max-new 32
# 3. each projection alone: the new launch rule and the fused prologues' cost vs cuBLAS
step 50 python3 bench/small_m_linear_bench.py --out "$out/small_m_linear.json" --budget-s 30
# 4. where a step's time goes now
step 90 python3 bench/decode_profile.py --out "$out/prof" --variants default --batch-sizes 1,8 --steps 10 --graph-steps 30
