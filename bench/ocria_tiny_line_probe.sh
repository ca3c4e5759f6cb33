#!/usr/bin/env bash
# CPU probe: does a byte-level (character) tokenizer let a miniature ocria-tiny learn glyphs faster than the 4,096-token
# BPE? Same miniature model, same single-line pages (strict_chars, 22-32 px, 8-40 characters, cropped), same wall-clock
# budget; then greedy CER on 24 held-out lines (licence text, not seen in training) with jobs.eval_ocr.
#   bash bench/ocria_tiny_line_probe.sh OUT_DIR SECONDS [VOCAB ...]
# EXTRA="--set train.ctc_weight=1.0" adds training overrides (the same probe with the line CTC loss); FONT_PX="56, 72"
# renders bigger glyphs (about one character per merged image token).
set -euo pipefail
out=${1:?out dir}; secs=${2:-600}; shift 2 || true
vocabs=${*:-4096 266}
py=${PYTHON:-.venv/bin/python}
MINI="--set model.text.hidden_size=128 --set model.text.intermediate_size=256 --set model.text.num_hidden_layers=4
 --set model.text.num_attention_heads=2 --set model.text.num_key_value_heads=1 --set model.text.linear_num_key_heads=1
 --set model.text.linear_num_value_heads=2 --set model.text.partial_rotary_factor=1.0 --set model.text.mrope_section=[11,11,10]
 --set model.vision.depth=3 --set model.vision.hidden_size=96 --set model.vision.intermediate_size=288
 --set model.vision.num_heads=2 --set image.image_mean=1.0"
FONT_PX=${FONT_PX:-22, 32}  # glyph size: at 22-32 px one merged image token (32 px) spans 2-3 characters
CANVAS=${CANVAS_PX:+, canvas_px: $CANVAS_PX}  # CANVAS_PX=2560: lay lines out wide enough that big fonts do not wrap
LINES="data.curriculum=[{until_page: 100000000, font_px: [$FONT_PX], max_chars: [8, 40], crop: true, strict_chars: true$CANVAS}]"
mkdir -p "$out"
"$py" - "$out/eval_lines.yaml" "$FONT_PX" "${CANVAS_PX:-}" <<'PY'
import sys, yaml
c = yaml.safe_load(open("configs/train_tiny.yaml"))
c["data"].update(font_px=[float(v) for v in sys.argv[2].split(",")], max_chars=[8, 40], crop=True, strict_chars=True)
if sys.argv[3]:
    c["data"]["canvas_px"] = int(sys.argv[3])
yaml.safe_dump(c, open(sys.argv[1], "w"), sort_keys=False)
PY
for v in $vocabs; do
  d="$out/v$v"
  "$py" -m jobs.train_tiny prepare $MINI --set model.vocab_size=$v --model-dir "$d/model"
  "$py" -m jobs.train_tiny train --device cpu --model-dir "$d/model" --out "$d/train" $MINI --set model.vocab_size=$v \
    --set train.batch_size=16 --set train.lr=2e-3 --set train.warmup_steps=50 --set train.total_train_s=$secs \
    --set train.run_train_s=$secs --set train.num_workers=1 --set train.eval_pages=0 --set train.image_check_every=100 \
    --set "$LINES" ${EXTRA:-} > "$d/train.log" 2>&1
  cp "$d/train/ckpt/"*.safetensors "$d/train/ckpt/config.json" "$d/model/"  # the trained weights beside the tokenizer
  "$py" -m jobs.eval_ocr --model "$d/model" --config "$out/eval_lines.yaml" --heldout 24 --corpus-pages 0 \
    --out "$d/eval_lines.json" > "$d/eval.log" 2>&1
  "$py" -c "import json,sys; d=json.load(open(sys.argv[1]))['heldout_synthetic']; print(sys.argv[2], d['model_text'], d['tesseract_text'])" \
    "$d/eval_lines.json" "vocab $v"
done
