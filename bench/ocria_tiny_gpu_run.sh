#!/usr/bin/env bash
# One ocria-tiny training run on the H200 (device tool), run D's recipe: from scratch or resumed, line pages first
# with the character CTC loss (jobs/train_tiny.LineCTC), then smaller fonts and paragraphs. The checkpoint goes to
# OUT/run/ckpt and is also staged at /tmp/stage/ckpt, where the next call (on the still-warm machine) resumes from.
# Carry: .synth (text pools, fonts), .whl (the pymupdf wheel), MODEL_DIR (`prepare` output: tokenizer, configs).
#   bash bench/ocria_tiny_gpu_run.sh $OUT build/ocria-tiny-next2            # run 1
#   bash bench/ocria_tiny_gpu_run.sh $OUT build/ocria-tiny-next2 /tmp/stage/ckpt   # runs 2, 3
set -euo pipefail
out=${1:?out}; model=${2:?model dir}; resume=${3:-}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
RUN=(--set image.image_mean=1.0 --set model.text.partial_rotary_factor=1.0 --set "model.text.mrope_section=[11,11,10]"
  --set train.batch_size=64 --set train.lr=1e-3 --set train.warmup_steps=100 --set train.total_train_s=${TOTAL_S:-1350}
  --set train.run_train_s=${RUN_S:-450} --set train.ctc_weight=1.0 --set train.ctc_subframes=6 --set train.num_workers=14
  --set train.image_check_every=100 --set train.eval_pages=16)
CURR='data.curriculum=[{until_page: 100000, font_px: [22, 32], max_chars: [8, 40], crop: true, strict_chars: true},
  {until_page: 200000, font_px: [16, 28], max_chars: [20, 120], crop: true, strict_chars: true},
  {until_page: 300000, font_px: [14, 24], max_chars: [60, 400], crop: true},
  {until_page: 100000000, font_px: [12, 20], max_chars: [100, 800]}]'
timeout ${TIMEOUT_S:-565} python3 -m jobs.train_tiny train --model-dir "$model" --out "$out/run" ${resume:+--resume "$resume"} \
  "${RUN[@]}" --set "$CURR" 2>&1 | grep -v -i "warn" | tail -n 70
mkdir -p /tmp/stage && rm -rf /tmp/stage/ckpt && cp -r "$out/run/ckpt" /tmp/stage/ckpt
