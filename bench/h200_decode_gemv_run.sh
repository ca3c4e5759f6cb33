#!/usr/bin/env bash
# One device command: the engine's decode path on the H200: a chain of decode GEMVs checked bit-identical with PDL
# off and on, the default decode path timed against the options it keeps off, the default checked against
# transformers on CUDA.
# (Where a step's time goes: python3 bench/decode_profile.py --out $OUT/prof --variants default,<other>
#  --batch-sizes 1 --steps 10 --graph-steps 30, ~90 s, in a call of its own.)
#   bash bench/h200_decode_gemv_run.sh $OUT          # carry .gpu/wheels (fla)
# Each step has its own time limit, so a slow one leaves the others' results under $OUT; the timing comes before the
# CUDA correctness check (on a cold machine that check has taken over 150 s).
# (bench/results/h200_decode_gemv_variants.json came from this script at commit d8e8a65, with other variants;
#  session 12 timed the output epilogues at commit 27ae302: h200_decode_epilogues.json; session 13 PDL at 3befff7:
#  h200_decode_pdl.json and h200_decode_profile_pdl.json, with the variants then named native / native_pdl;
#  session 14 at d85c0f7: h200_decode_norm_fused.json, h200_gemv_prologue_check.json and h200_gpu_check_pdl.json,
#  timing and checking the GEMV input prologues, the RMSNorms fused into the GEMVs and PDL's early trigger, all
#  slower than the default and removed since.)
set -uo pipefail
out=${1:?out}
source bench/device_env.sh
# 0. PDL on the GPU (the kernel tests run in the CPU interpreter, which has no griddepcontrol)
step 60 python3 bench/gemv_pdl_check.py --out "$out/gemv_pdl_check.json"
# 1. the engine at the 4B shape, the default against PDL off and the SwiGLU as its own kernel: text decode at b1 / b8
#    (transformers: measured in h200_engine_benchmark.json). PDL only changes when kernels start, so native_no_pdl's
#    output check against the default must show identical tokens and a logit difference of 0.
step 330 python3 bench/engine_bench.py --device cuda --out "$out/bench" --scenarios text --batch-sizes 1,8 \
  --variants native,native_no_pdl,native_swiglu_unfused --skip-transformers
# 2. correctness on CUDA: native vs transformers, fp32 token-for-token (112 s in session 12 and 147 s in session 13,
#    where the cold machine's first try ran past 150 s; with the bf16 ocria-tiny comparison too it ran past 180 s)
step 160 python3 bench/gpu_check.py --dtypes float32 --requests 8 --out "$out/gpu_check.json"
