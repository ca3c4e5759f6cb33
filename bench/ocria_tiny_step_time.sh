#!/usr/bin/env bash
# Training-step speed on the H200, arm by arm: each arm times TIME_STEPS steps (after 5 warm-up steps) of the same
# staged checkpoint on the same pages, without the profiler or a sync between steps (jobs.train_tiny --time-steps).
# Arms, "ROPE_POSITIONS/GDN_CHUNK": transformers/64 is the step as session 21 trained (the model computes the rotary
# positions, ~10 device syncs a page), loader/64 takes them from the loader, loader/128 also halves the chunked
# rule's scan. OUT/step_time.json and a table (bench/ocria_tiny_step_time_table.py). Staging and carry as for a
# training run (ocria_tiny_commands.md); carry .synth and the model folder:
#   RECIPE=F2 BATCH=64 TEXT_LINE_CTC=0.5 NOISE=0.1 bash bench/ocria_tiny_step_time.sh $OUT build/ocria-tiny-1536 /tmp/stage/ckpt
set -euo pipefail
out=${1:?out}; model=${2:?model dir}; resume=${3:?staged checkpoint}
arms=(${ARMS:-transformers/64 loader/64 loader/128})
for arm in "${arms[@]}"; do
  ROPE_POSITIONS=${arm%/*} GDN_CHUNK=${arm#*/} TIME_STEPS=${TIME_STEPS:-20} EVAL_PAGES=0 TIMEOUT_S=${TIMEOUT_S:-120} \
    bash bench/ocria_tiny_gpu_run.sh "$out/${arm/\//_}" "$model" "$resume" | tail -n 3
done
folders=(); for arm in "${arms[@]}"; do folders+=("$out/${arm/\//_}"); done
python3 bench/ocria_tiny_step_time_table.py --out "$out/step_time.json" "${folders[@]}"
