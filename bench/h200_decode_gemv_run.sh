#!/usr/bin/env bash
# One device command: the engine's decode path on the H200: the GEMV prologues and PDL modes checked against their
# references, the engine's options timed against the default, the default checked against transformers on CUDA.
# (Where a step's time goes: python3 bench/decode_profile.py --out $OUT/prof --variants default,<winner>
#  --batch-sizes 1 --steps 10 --graph-steps 30, ~90 s, in a call of its own.)
#   bash bench/h200_decode_gemv_run.sh $OUT          # carry .gpu/wheels (fla)
# Each step has its own time limit, so a slow one leaves the others' results under $OUT; the timing comes first
# (on a cold machine the correctness check has taken over 150 s).
# (bench/results/h200_decode_gemv_variants.json came from this script at commit d8e8a65, with other variants;
#  session 12 timed the output epilogues at commit 27ae302: h200_decode_epilogues.json; session 13 PDL at 3befff7:
#  h200_decode_pdl.json and h200_decode_profile_pdl.json, with the variants then named native / native_pdl.)
set -uo pipefail
out=${1:?out}
source bench/device_env.sh
# 0. the reworked prologues and PDL mode 2 on the GPU, before timing them (the kernel tests run them in the CPU
#    interpreter only)
step 60 python3 bench/gemv_prologue_check.py --out "$out/gemv_prologue_check.json"
# 1. the engine at the 4B shape, default vs its alternatives: text decode at b1 / b8 (transformers: measured in
#    h200_engine_benchmark.json). Next: the RMSNorms applied by the GEMVs that read them, in one pass
#    (native_norm_fused), and that with the GDN gated norm in out_proj's prologue too (native_gemv_fused), both now
#    computing the prologue on next_pow2(M) rows instead of the MMA's 16. They round the GEMV inputs differently, so
#    their bf16 greedy tokens may part from the default's after some tokens, as the epilogues' did. And PDL with each
#    kernel letting the next launch before it waits (native_pdl_early): scheduling only, so its output check against
#    the default must show identical tokens and a logit difference of 0.
step 330 python3 jobs/benchmark.py --device cuda --out "$out/bench" --scenarios text --batch-sizes 1,8 \
  --variants native,native_pdl_early,native_norm_fused,native_gemv_fused --skip-transformers
# 2. correctness on CUDA: native vs transformers, fp32 token-for-token (112 s in session 12 and 147 s in session 13,
#    where the cold machine's first try ran past 150 s; with the bf16 ocria-tiny comparison too it ran past 180 s)
step 160 python3 bench/gpu_check.py --dtypes float32 --requests 8 --out "$out/gpu_check.json"
