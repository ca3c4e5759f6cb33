#!/usr/bin/env bash
# Train ocria-tiny's drafter on one GPU and measure its tau, in one command (the device tool's machine; CPU for a
# dry run with DEVICE=cpu DTYPE=float32 and small PAGES / TRAIN_S):
#   bash bench/drafter_h200.sh OUT        # carry .drafter/synth and .whl/gen (bench/device_inputs.sh makes them and
#                                         # says what to leave out of the tree for the 64 MiB carry limit)
# 1. jobs/train_drafter.py on PAGES synthetic pages of the train pool, drawn the job's way and cut into blocks by
#    WORKERS processes while the target reads the ones drawn before (--render research.ocria_tiny.drafter_pages:
#    block_images; the PyMuPDF wheel carried in .whl/gen): the target answers them (the engine's normal path), its
#    taps come from packed teacher-forced prefills, the drafter learns its answers for TRAIN_S seconds;
#    COLLECT_BENCH=DIR first times that collection against the eager one on DIR's block images
#    (bench/drafter_collect_bench.py -> OUT/collect_bench.json, rewritten after each phase), within
#    COLLECT_BENCH_TIMEOUT (120 s): it bounds itself 20 s inside it (--seconds: no eager batch starts after it);
# 3. bench/drafter_tau.py: tau at block 16 and 8 (TAU_BLOCKS) on the held-out synthetic blocks and the corpus blocks
#    made here (research/ocria_tiny/drafter_pages.py --split heldout; bench/drafter_block_pages.py), answers checked
#    against plain decoding.
# TRAIN_FLAGS: more jobs/train_drafter.py flags (e.g. --dflash2, --distill 0.5, or --init DRAFTER to continue one;
# then FIRST=N draws pages N .. N + PAGES - 1, new ones). VAL=N keeps N answers out for a validation loss every VAL_EVERY steps
# and writes the best drafter.
# 4. with SPEC_BENCH="<its flags>" (e.g. "--block-sizes 16"), bench/spec_decode_bench.py with the new drafter.
# OUT gets drafter/ (config.json, model.safetensors, train_log.json), tau.json, log.txt [, collect_bench.json,
# h200_spec_decode.json].
# SCALING="N1 N2 ..." (pages, ascending) runs tau against data instead of 1, 3 and 4: bench/drafter_scaling.py draws
# the largest size's pages as 1 does, the target answers them once, then per size a drafter with 1's flags learns the
# answers to the first N pages for SCALING_S seconds and its tau is measured as 3 measures it (TAU_BLOCKS, plain
# decoding checked) -> OUT/drafter_scaling.json (+ .png; drafters in OUT/drafter_scaling/pages_N), with
# collection_speedup from COLLECT_BENCH's collect_bench.json when it ran, and under `collection` where the collection's
# time went (the start until the first answers, the steady images/s and ms an image waiting for pages, preprocessing,
# answering, tapping and other host work; the renderers' capacity; echoed at each size's line too).
# SCALING_FLAGS: more drafter_scaling.py flags
# (e.g. "--set dflash2=true --set distill=0.5"; TRAIN_FLAGS are not passed). Sizes whose answers would not fit its
# memory budget are dropped (its docstring: ~2.7 MB a page in bf16). Rows are written as measured, so a timeout
# keeps the sizes done. E.g., inside one 600 s device call (carry .drafter .whl/gen; ~22 block images/s collected
# on an H100, ~3.5 a page, so 1,200 pages ~190 s, then 4 x 25 s of training and the tau reads):
#   SCALING="200 400 800 1200" SCALING_S=25 COLLECT_BENCH=.drafter/heldout COLLECT_BENCH_TIMEOUT=90 \
#     SCALING_TIMEOUT=440 bash bench/drafter_h200.sh $OUT
set -euo pipefail
OUT=${1:?usage: drafter_h200.sh OUT}
DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16} PAGES=${PAGES:-700} TRAIN_S=${TRAIN_S:-120} WORKERS=${WORKERS:-12}
LAYERS=${LAYERS:-4} FFN=${FFN:-1024} TAPS=${TAPS:-4} PER_STEP=${PER_STEP:-32} LR=${LR:-2e-3} ANCHORS=${ANCHORS:-64} MAX_TOKENS=${MAX_TOKENS:-256}
COLLECT=${COLLECT:-256} FIRST=${FIRST:-0} VAL=${VAL:-0} VAL_EVERY=${VAL_EVERY:-200} PY=${PY:-python3} TAU_DIR=${TAU_DIR:-.drafter}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
source bench/device_env.sh
$PY -c "import torch, pymupdf; print('torch', torch.__version__, 'pymupdf', pymupdf.VersionBind,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
t0=$(date +%s)
if [ -n "${COLLECT_BENCH:-}" ]; then
  COLLECT_BENCH_TIMEOUT=${COLLECT_BENCH_TIMEOUT:-120}
  timeout "$COLLECT_BENCH_TIMEOUT" $PY bench/drafter_collect_bench.py --checkpoint models/ocria-tiny \
    --pages "$COLLECT_BENCH" --device "$DEVICE" --dtype "$DTYPE" --batch "$COLLECT" --max-tokens "$MAX_TOKENS" \
    --num-taps "$TAPS" --kv-cache-memory-gb 8 --seconds $((COLLECT_BENCH_TIMEOUT > 40 ? COLLECT_BENCH_TIMEOUT - 20 : \
    COLLECT_BENCH_TIMEOUT / 2)) --out "$OUT/collect_bench.json" || echo "collect bench stopped (rc $?)"
fi
t1=$(date +%s)
if [ -n "${SCALING:-}" ]; then
  bench_json=()
  if [ -n "${COLLECT_BENCH:-}" ] && [ -f "$OUT/collect_bench.json" ]; then
    bench_json=(--collect-bench "$OUT/collect_bench.json")
  fi
  timeout "${SCALING_TIMEOUT:-3000}" $PY bench/drafter_scaling.py --checkpoint models/ocria-tiny \
    --render research.ocria_tiny.drafter_pages:block_images --render-arg synth=.drafter/synth --render-arg split=train \
    --render-arg checkpoint=models/ocria-tiny --render-first "$FIRST" --render-workers "$WORKERS" --sizes "$SCALING" \
    --blocks "${TAU_BLOCKS:-16 8}" --tau-pages "$TAU_DIR/heldout" --tau-pages "$TAU_DIR/corpus" \
    --train-seconds "${SCALING_S:-60}" --device "$DEVICE" --dtype "$DTYPE" --set collect_batch="$COLLECT" \
    --set kv_cache_memory_gb=8 --set max_tokens="$MAX_TOKENS" --set num_layers="$LAYERS" \
    --set intermediate_size="$FFN" --set num_taps="$TAPS" --set block_size=16 --set gamma=7 --set anchors="$ANCHORS" \
    --set pages_per_step="$PER_STEP" --set lr="$LR" --set val_pages="$VAL" --set val_every="$VAL_EVERY" \
    ${SCALING_FLAGS:-} ${bench_json[@]+"${bench_json[@]}"} \
    --out "$OUT/drafter_scaling.json" || echo "scaling stopped (rc $?)"
  $PY - "$OUT/drafter_scaling.json" <<'EOF' || true
import json, sys
r = json.load(open(sys.argv[1]))
print(f"collection: {r.get('collection_pages')} pages, {r.get('collection_images')} block images in "
      f"{r.get('collection_s')} s ({r.get('collection_pages_per_s')} pages/s; speedup over the eager collection "
      f"{r.get('collection_speedup')}); dropped {r.get('dropped')}")
print(f"collection time: {(r.get('collection') or {}).get('line')}")
print(f"{'pages':>7} {'answers':>8} {'steps':>6} {'split':8} {'block':>5} {'tau':>6} identical")
for x in r["rows"]:
    print(f"{x['pages']:7d} {x['answers']:8d} {x['steps']:6d} {x['split']:8} {x['block_size']:5d} {x['tau']:6.2f} "
          f"{x['identical_to_plain']}")
EOF
  echo "seconds: collect bench $((t1 - t0)), scaling $(($(date +%s) - t1))"
  exit 0
fi
timeout "${TRAIN_TIMEOUT:-900}" $PY jobs/train_drafter.py --checkpoint models/ocria-tiny \
  --render research.ocria_tiny.drafter_pages:block_images --render-arg synth=.drafter/synth --render-arg split=train \
  --render-arg checkpoint=models/ocria-tiny --render-pages "$PAGES" --render-first "$FIRST" --render-workers "$WORKERS" \
  --out "$OUT/drafter" --device "$DEVICE" --dtype "$DTYPE" --collect-batch "$COLLECT" --kv-cache-memory-gb 8 \
  --max-tokens "$MAX_TOKENS" --num-layers "$LAYERS" --intermediate-size "$FFN" --num-taps "$TAPS" --block-size 16 \
  --gamma 7 --anchors "$ANCHORS" --pages-per-step "$PER_STEP" --lr "$LR" --steps 1000000 --max-seconds "$TRAIN_S" \
  --val-pages "$VAL" --val-every "$VAL_EVERY" ${TRAIN_FLAGS:-} || echo "training stopped (rc $?)"
t2=$(date +%s)
timeout "${TAU_TIMEOUT:-600}" $PY bench/drafter_tau.py --checkpoint models/ocria-tiny --drafter "$OUT/drafter" \
  --pages "$TAU_DIR/heldout" --pages "$TAU_DIR/corpus" --device "$DEVICE" --dtype "$DTYPE" --max-tokens "$MAX_TOKENS" \
  $(printf -- '--block %s ' ${TAU_BLOCKS:-16 8}) --check-plain --out "$OUT/tau.json" || echo "tau stopped (rc $?)"
t3=$(date +%s)
$PY - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
log = json.load(open(f"{out}/drafter/train_log.json"))
print(f"train: {log['train_pages']} block images, {log['answer_tokens']} answer tokens, {log['steps']} steps in "
      f"{log['train_seconds']} s, loss {sum(log['losses'][:20]) / 20:.3f} -> {sum(log['losses'][-20:]) / 20:.3f}")
if "val_tau_estimate" in log:
    tau = dict(log["val_tau_estimate"])
    print(f"validation ({log['val_answers']} answers): best loss at step {log['best_step']}, tau estimate there "
          f"{tau[log['best_step']]:.3f}, highest {max(tau.values()):.3f}")
print(f"{'pages':8} {'block':>5} {'tau':>6} {'drafted':>8} {'accepted':>8} identical")
for r in json.load(open(f"{out}/tau.json"))["rows"]:
    print(f"{r['page_set']:8} {r['block_size']:5d} {r['tau']:6.2f} {r['drafted']:8d} {r['accepted']:8d} "
          f"{r['identical_to_plain']}")
EOF
echo "seconds: collect bench $((t1 - t0)), train (pages drawn + collect + steps) $((t2 - t1)), tau $((t3 - t2))"
if [ -n "${SPEC_BENCH:-}" ]; then  # bench/spec_decode_bench.py with this drafter: ocria-tiny, 4B shape
  left=$((${DEADLINE:-100000} - ($(date +%s) - t0)))  # DEADLINE: seconds from the start the whole run must end by
  timeout "$left" $PY bench/spec_decode_bench.py --device "$DEVICE" --drafter "$OUT/drafter" --pages "$TAU_DIR/heldout" \
    --max-tokens "$MAX_TOKENS" $SPEC_BENCH --out "$OUT/h200_spec_decode.json" || echo "spec bench stopped (rc $?)"
  echo "seconds: spec bench $(($(date +%s) - t3))"
fi
