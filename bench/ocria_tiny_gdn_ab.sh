#!/usr/bin/env bash
# A/B on the H200 of the gated delta rule's training implementation, train.gated_delta_rule transformers vs chunked
# (jobs/chunked_gdn.py): both arms from the same staged checkpoint on the same pages, RUN_S seconds each, without the
# end-of-run evaluation and without re-staging; then the steady steps/s and pages/s of both (OUT/gdn_ab.json,
# bench/ocria_tiny_ab_table.py). The checkpoint and the wheels are staged by earlier calls, as for a training run
# (ocria_tiny_commands.md, "Next session"); carry .synth and the model folder.
#   RECIPE=F2 BATCH=32 TEXT_LINE_CTC=0.5 TOTAL_S=5400 bash bench/ocria_tiny_gdn_ab.sh $OUT build/ocria-tiny-1536 /tmp/stage/ckpt
set -euo pipefail
out=${1:?out}; model=${2:?model dir}; resume=${3:?staged checkpoint}
start=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['step'])" "$resume/train_state.json")
for gdn in transformers chunked; do
  GDN=$gdn EVAL_PAGES=0 KEEP_STAGE=1 RUN_S=${RUN_S:-60} TIMEOUT_S=${TIMEOUT_S:-180} \
    bash bench/ocria_tiny_gpu_run.sh "$out/$gdn" "$model" "$resume" | tail -n 8
done
python3 bench/ocria_tiny_ab_table.py "$out/transformers" "$out/chunked" --since-step "$start" --out "$out/gdn_ab.json"
