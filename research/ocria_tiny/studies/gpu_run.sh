#!/usr/bin/env bash
# One ocria-tiny training run on the H200 (device tool), from scratch or resumed. The checkpoint goes to OUT/run/ckpt
# and is also staged at /tmp/stage/ckpt, where the next call (on the still-warm machine) resumes from.
# Carry: .synth (text pools, fonts), .whl (the pymupdf wheel), MODEL_DIR (`prepare` output: tokenizer, configs).
# RECIPE=D (default): run D of session 10, from scratch: lines first with the character CTC loss, then smaller fonts
#   and paragraphs.
#   bash research/ocria_tiny/studies/gpu_run.sh $OUT build/ocria-tiny-next2                    # run 1
#   bash research/ocria_tiny/studies/gpu_run.sh $OUT build/ocria-tiny-next2 /tmp/stage/ckpt    # runs 2, 3
# RECIPE=E: continues run D (its 264,640 pages) towards the final pages (10-18 px at 768 px): paragraphs, then full
#   pages, each stage with a share of line pages at its own font sizes (`mix`) so the CTC loss keeps teaching glyphs.
#   Stage run D's checkpoint first in a call of its own (it, .synth, .whl and the tree exceed the 64 MiB carry):
#   mkdir -p /tmp/stage && cp -r build/run_d/ckpt3 /tmp/stage/ckpt          # carry build/run_d/ckpt3 only
#   RECIPE=E TOTAL_S=2240 bash research/ocria_tiny/studies/gpu_run.sh $OUT build/ocria-tiny-next2 /tmp/stage/ckpt   # twice
#   (2 x 450 s on top of run D's 1,337 s: the page boundaries below fit that, ~170 pages/s)
# RECIPE=F: continues run E (408,448 pages, 2,243 s) on the final pages only, 20 % line pages mixed in. Stage run E's
#   checkpoint first as above (carry build/run_e/call3/run/ckpt, copy it to /tmp/stage/ckpt), then per 450 s command
#   RECIPE=F TOTAL_S=<2243 + 450 x commands> bash research/ocria_tiny/studies/gpu_run.sh $OUT build/ocria-tiny-next2 /tmp/stage/ckpt
#   Session 12 ran it on run E grown to 12 layers (research.ocria_tiny.grow_tiny, build/grown_e staged instead), BATCH=128. With fla
#   installed it was first killed twice about 110 s into its first step (rc 137, no output), most likely the host's
#   memory: 14 workers x 4 prefetched batches x 128 pages x ~11 MB of fp32 patches ~ 80 GB of the 128 GiB while the
#   first step waited (fla compiling); the prefetch is 2 batches a worker now (train.prefetch_factor, 69 GB peak).
#   Then fla stopped the first backward pass (below).
# PROFILE_STEPS=3: profile that many steps after 5 warm-up steps instead of training (out/run/train_profile.*, no
#   checkpoint). At batch 128 it ran past 120 s without writing its report (session 14).
# TIME_STEPS=N: time that many steps after 5 warm-up steps, without the profiler or a sync between steps
#   (out/run/train_time.json: pages/s and the first step's loss, no checkpoint). GDN_CHUNK=N sets train.gdn_chunk,
#   ROPE_POSITIONS=loader|transformers train.rope_positions: the arms of research/ocria_tiny/studies/step_time.sh.
# VISION_ATTENTION=packed|per_image sets train.vision_attention (default: the config's, packed). Session 14's A/B,
#   from scratch (research/ocria_tiny/results/vision_attention_ab.json):
#   for a in packed per_image; do VISION_ATTENTION=$a RECIPE=F BATCH=128 TOTAL_S=1000 RUN_S=60 TIMEOUT_S=115 \
#     bash research/ocria_tiny/studies/gpu_run.sh $OUT/tp_$a build/ocria-tiny-next2; done
# TEXT_LINE_CTC=W adds jobs/text_line_ctc.TextLineCTC (every text line of every page read from the merged image
#   tokens) with weight W; its head learns at 5x the schedule's learning rate, and a new head first trains alone for
#   80 steps.
# GDN=transformers|chunked sets train.gated_delta_rule (default: the config's, chunked: research/ocria_tiny/chunked_gdn.py, the torch
#   fallback's arithmetic in fewer ops, 1.47x the pages/s at 1,536 px: research/ocria_tiny/results/s16_gdn_ab.json).
# NOISE=S sets train.answer_token_noise (default: the config's, 0): that share of the answer tokens the model reads
#   swapped for random ones, the labels kept, so it learns to go on from its own misreads
#   (research/ocria_tiny/results/s17_error_profile.json: fed the true text it knows where a page ends; reading on its own
#   it stopped early or ran on on 5 of 24 held-out pages).
# LR sets train.lr, the schedule's peak (default 1e-3). The schedule follows wall-clock time from the run's start, so
#   a long run resumed with a larger TOTAL_S restarts near the cosine's tail: LR scales that tail instead (session 20:
#   the shipped model grown by 2 blocks at 8,625 s, LR=3e-3 TOTAL_S=9800 gives 2.5e-4 -> 1.5e-4 over two 470 s runs).
# WARMUP=N sets train.warmup_steps (default 100): every run, a resumed one too, ramps its learning rate up over its
#   first N steps, since a resumed run starts a fresh AdamW (its moments are not saved).
# EVAL_PAGES=0 skips the end-of-run evaluation; KEEP_STAGE=1 leaves /tmp/stage/ckpt as it was (A/B arms from one start:
#   research/ocria_tiny/studies/gdn_ab.sh); SAVE_AS=DIR also keeps the whole checkpoint at DIR on the machine (an A/B arm that a
#   later call may continue: its files come back without the state a resume needs).
# Out: OUT/run/ckpt/model-*.safetensors and OUT/run/meta.tar (the rest of the checkpoint and loss.png): the device
#   tool returns at most 8 files.
set -euo pipefail
out=${1:?out}; model=${2:?model dir}; resume=${3:-}
# Its own site folder, without fla: fla 0.6.0 refuses its gated delta rule backward on Hopper with this image's
# Triton 3.6 ("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated chunk_bwd_dqkwg",
# session 12), so transformers trains the GDN layers with its torch fallback, as runs D and E did. (The benchmark
# scripts install fla into /tmp/site on the same machine: inference only.)
# Without .whl in this call, the wheels must have been installed into /tmp/site_train by an earlier call on the same
# machine: a call carries at most 64 MiB with the working tree, and the tree holds the shipped 30 MB model since
# session 15, so .whl (24 MB) and .synth (18 MB) no longer fit one call.
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_train .whl/*.whl
elif [ ! -d /tmp/site_train/pymupdf ]; then
  echo "no .whl carried and no wheels in /tmp/site_train: carry .whl, or install it there in a call before" >&2; exit 2
fi
export PYTHONPATH=/tmp/site_train PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
RUN=(--set image.image_mean=1.0 --set model.text.partial_rotary_factor=1.0 --set "model.text.mrope_section=[11,11,10]"
  --set train.batch_size=${BATCH:-64} --set train.lr=${LR:-1e-3} --set train.warmup_steps=${WARMUP:-100} --set train.total_train_s=${TOTAL_S:-1350}
  --set train.run_train_s=${RUN_S:-450} --set train.ctc_weight=1.0 --set train.ctc_subframes=6 --set train.num_workers=14
  --set train.image_check_every=100 --set train.eval_pages=${EVAL_PAGES:-16} ${VISION_ATTENTION:+--set train.vision_attention=$VISION_ATTENTION}
  ${TEXT_LINE_CTC:+--set train.text_line_ctc_weight=$TEXT_LINE_CTC --set train.text_line_ctc_head_steps=80
    --set train.text_line_ctc_lr_mult=5} ${GDN:+--set train.gated_delta_rule=$GDN}
  ${NOISE:+--set train.answer_token_noise=$NOISE} ${GDN_CHUNK:+--set train.gdn_chunk=$GDN_CHUNK}
  ${ROPE_POSITIONS:+--set train.rope_positions=$ROPE_POSITIONS})
case ${RECIPE:-D} in
  D) CURR='data.curriculum=[{until_page: 100000, font_px: [22, 32], max_chars: [8, 40], crop: true, strict_chars: true},
       {until_page: 200000, font_px: [16, 28], max_chars: [20, 120], crop: true, strict_chars: true},
       {until_page: 300000, font_px: [14, 24], max_chars: [60, 400], crop: true},
       {until_page: 100000000, font_px: [12, 20], max_chars: [100, 800]}]' ;;
  E) CURR='data.curriculum=[{until_page: 330000, font_px: [14, 24], max_chars: [60, 400], crop: true,
         mix: {share: 0.4, font_px: [14, 24], max_chars: [8, 80], crop: true, strict_chars: true}},
       {until_page: 390000, font_px: [12, 20], max_chars: [100, 800],
         mix: {share: 0.3, font_px: [12, 20], max_chars: [8, 80], crop: true, strict_chars: true}},
       {until_page: 100000000, font_px: [10, 18], max_chars: [150, 1300],
         mix: {share: 0.2, font_px: [10, 18], max_chars: [8, 80], crop: true, strict_chars: true}}]' ;;
  F) CURR='data.curriculum=[{until_page: 100000000, font_px: [10, 18], max_chars: [150, 1300],
         mix: {share: 0.2, font_px: [10, 18], max_chars: [8, 80], crop: true, strict_chars: true}}]' ;;
  # H: the final font sizes on cropped blocks of 60-260 characters (one to a few lines; the line count is not
  # measured), where session 13's evaluation says reading breaks down; 30 % full pages. Run H (session 14, on run F):
  # full pages no better, single lines much worse without line pages in the mix (ocria_tiny_commands.md)
  H) CURR='data.curriculum=[{until_page: 100000000, font_px: [10, 18], max_chars: [60, 260], crop: true,
         mix: {share: 0.3, font_px: [10, 18], max_chars: [150, 1300]}}]' ;;
  # F2: RECIPE=F's pages drawn at twice the resolution (1,536 px, glyphs 20-36 px: about one text line per merged
  # token row instead of two to three). The same layouts as F's (font_pt = px * height / longest), so F2's held-out
  # pages are F's at 2x. MODEL_DIR must allow the pixels: `prepare --image-sizes-only` with image.max_pixels=2359296
  F2) CURR='data.curriculum=[{until_page: 100000000, font_px: [20, 36], max_chars: [150, 1300],
         mix: {share: 0.2, font_px: [20, 36], max_chars: [8, 80], crop: true, strict_chars: true}}]'
      RUN+=(--set image.target_longest_px=1536 --set image.max_pixels=2359296 --set "data.font_px=[20,36]") ;;
  # F2U: F2 with a quarter of the words outside code made up (random letters in the word's case pattern, paths and
  # identifiers of pool words, short letter-digit codes: research.ocria_tiny.synthetic.made_up_word), on line pages too. The
  # shipped model read held-out words absent from its training text far worse than seen ones
  # (research/ocria_tiny/studies/teacher_forced.py): text it cannot guess teaches it to read the glyphs. Answers grow ~16 %
  F2U) CURR='data.curriculum=[{until_page: 100000000, font_px: [20, 36], max_chars: [150, 1300], made_up_words: 0.25,
         mix: {share: 0.2, font_px: [20, 36], max_chars: [8, 80], crop: true, strict_chars: true, made_up_words: 0.25}}]'
      RUN+=(--set image.target_longest_px=1536 --set image.max_pixels=2359296 --set "data.font_px=[20,36]") ;;
  # F2UL: F2U with pages of up to 2,000 characters instead of 1,300, so answers reach the lengths of held-out pages
  # (licences, paths: more tokens per character). Past 640 tokens: 12.5 % of F2UL's pages, 1.8 % of F2U's, 5.5 % of
  # the held-out pages; past 768: 5.2 %, 0 %, 2 %; ~23 % more tokens a page (ocria_tiny_s25_answer_lengths_f2u*.json).
  # Fed the reference, the session-24 model read an answer's tokens 640-767 at top-1 0.64 and 768+ at 0.24, against
  # 0.91 for tokens 0-127 (session 25; its file was lost with it). Session 26's A/B: 640-767 at 0.68 after 504 s of
  # F2U, 0.72 after 504 s of F2UL (0.78 after 424 s more), but F2UL's continuation read free worse, from longer loops
  # at page ends (research/ocria_tiny/results/s26_runs.json)
  F2UL) CURR='data.curriculum=[{until_page: 100000000, font_px: [20, 36], max_chars: [150, 2000], made_up_words: 0.25,
         mix: {share: 0.2, font_px: [20, 36], max_chars: [8, 80], crop: true, strict_chars: true, made_up_words: 0.25}}]'
      RUN+=(--set image.target_longest_px=1536 --set image.max_pixels=2359296 --set "data.font_px=[20,36]"
        --set data.max_answer_tokens=1280) ;;
  # F2UP: F2U with a tenth of the full pages' paragraphs and list items replaced by file-path lists built from the
  # training pool's words (research.ocria_tiny.synthetic.path_list). Held-out pages are 27 % path characters and paths carry half
  # of the errors (CER 0.24 against 0.09 for prose, ocria_tiny_s28_runs.json); the share brings F2U's pages from 18 %
  # to 29 % path characters (ocria_tiny_s28_path_share.json); answers mean 356 tokens, at most 742 in 400 pages
  # (F2U: 338, 678; ocria_tiny_s28_answer_lengths_f2up.json). Line pages as F2U's
  F2UP) CURR='data.curriculum=[{until_page: 100000000, font_px: [20, 36], max_chars: [150, 1300], made_up_words: 0.25,
         path_lists: 0.1,
         mix: {share: 0.2, font_px: [20, 36], max_chars: [8, 80], crop: true, strict_chars: true, made_up_words: 0.25}}]'
      RUN+=(--set image.target_longest_px=1536 --set image.max_pixels=2359296 --set "data.font_px=[20,36]") ;;
  # F2U5: F2U with half the words outside code made up instead of a quarter (session 24's plan, not run before). The
  # training loss goes on falling while held-out pages read no better (session 29: 0.088 -> 0.095 on pages 96-191
  # after 820 s more of F2U): text the model cannot guess makes it read the glyphs instead of the pool's language
  F2U5) CURR='data.curriculum=[{until_page: 100000000, font_px: [20, 36], max_chars: [150, 1300], made_up_words: 0.5,
         mix: {share: 0.2, font_px: [20, 36], max_chars: [8, 80], crop: true, strict_chars: true, made_up_words: 0.5}}]'
      RUN+=(--set image.target_longest_px=1536 --set image.max_pixels=2359296 --set "data.font_px=[20,36]") ;;
  # F2UC: F2U with two columns on 80 % of the pages wide enough for them instead of 35 % (research.ocria_tiny.synthetic.
  # sample_style; the pages' sizes, margins and fonts stay F2U's). Two-column held-out pages read at 0.26 against 0.10,
  # and it is misreading, not order: 44 % of their characters in lines read closely, one-column pages 82 %
  # (ocria_tiny_s28_errors_by_block_ban64_c3.json). Share of two-column pages: ocria_tiny_s29_two_column_share.json
  F2UC) CURR='data.curriculum=[{until_page: 100000000, font_px: [20, 36], max_chars: [150, 1300], made_up_words: 0.25,
         two_columns: 0.8,
         mix: {share: 0.2, font_px: [20, 36], max_chars: [8, 80], crop: true, strict_chars: true, made_up_words: 0.25}}]'
      RUN+=(--set image.target_longest_px=1536 --set image.max_pixels=2359296 --set "data.font_px=[20,36]") ;;
  # F2UG: F2U's full pages drawn again so their body text's em is 29-35 px (research.ocria_tiny.synthetic.SynthConfig.glyph_px),
  # as the job draws pages for a model with a reading size (ocria_info.json glyph_px; pipeline.rasterize.page_scale);
  # line pages stay at 20-36 px, so pages without a text layer (drawn at 1,536 px) still read. At 1,536 px the shipped
  # model reads 20-24 px text at CER 0.13 and 32-36 px at 0.04, but drawn at 33 px without training it reads worse:
  # pages with small text grow to ~2,400 px, larger than any it was trained on (research/ocria_tiny/results/s32_runs.json).
  # ~1.5x the image tokens a page on average, and padded batches up to ~2.5x: BATCH=20 fits the H200 (48 did not).
  # MODEL_DIR's processor must let the pixels through (max_pixels 2,688^2)
  F2UG) CURR='data.curriculum=[{until_page: 100000000, font_px: [20, 36], max_chars: [150, 1300], made_up_words: 0.25,
         glyph_px: [29, 35],
         mix: {share: 0.2, font_px: [20, 36], max_chars: [8, 80], crop: true, strict_chars: true, made_up_words: 0.25}}]'
      RUN+=(--set image.target_longest_px=1536 --set image.max_pixels=7225344 --set "data.font_px=[20,36]") ;;
  # F2UGB: F2UG with a third of its pages cut to their text (crop) and short (60-700 characters, a few lines to a few
  # paragraphs) at the same glyph size: blocks as pipeline.blocks cuts pages for the job's block reading
  # (model.block_lines). Session 33: blocks of 8 lines read held-out pages 288-335 at 0.078 against whole pages'
  # 0.094, but worse on most pages (16 better, 29 worse): the model was trained on whole pages and single lines
  F2UGB) CURR='data.curriculum=[{until_page: 100000000, font_px: [20, 36], max_chars: [150, 1300], made_up_words: 0.25,
         glyph_px: [29, 35],
         mix: [{share: 0.2, font_px: [20, 36], max_chars: [8, 80], crop: true, strict_chars: true, made_up_words: 0.25},
               {share: 0.3, font_px: [20, 36], max_chars: [60, 700], crop: true, made_up_words: 0.25,
                glyph_px: [29, 35]}]}]'
      RUN+=(--set image.target_longest_px=1536 --set image.max_pixels=7225344 --set "data.font_px=[20,36]") ;;
  # F3: F2 with smaller and denser text for real pages: the corpus' median font is 17.4 px when the pipeline draws its
  # pages at 1,536 px, below F2's 20-36 (research/ocria_tiny/results/s16_corpus_glyph_size.json), and its pages hold
  # 2-20 k characters, F2's at most 1,300. Fonts 16-36 px, up to 2,600 characters: answers of up to ~1,200 tokens
  # (research/ocria_tiny/results/s16_answer_lengths_f3.json). Its end-of-run evaluation draws F3's pages: compare runs
  # with research.ocria_tiny.eval_ocr and the 1,536 px configs instead
  F3) CURR='data.curriculum=[{until_page: 100000000, font_px: [16, 36], max_chars: [150, 2600],
         mix: {share: 0.2, font_px: [16, 36], max_chars: [8, 80], crop: true, strict_chars: true}}]'
      RUN+=(--set image.target_longest_px=1536 --set image.max_pixels=2359296 --set "data.font_px=[16,36]"
        --set "data.max_chars=[150,2600]" --set data.max_answer_tokens=1280) ;;
  *) echo "RECIPE must be D, E, F, F2, F2U, F2U5, F2UC, F2UG, F2UGB, F2UL, F2UP, F3 or H" >&2; exit 2 ;;
esac
status=0
timeout ${TIMEOUT_S:-565} python3 -m research.ocria_tiny.train_tiny train --model-dir "$model" --out "$out/run" ${resume:+--resume "$resume"} \
  ${PROFILE_STEPS:+--profile-steps "$PROFILE_STEPS"} ${TIME_STEPS:+--time-steps "$TIME_STEPS"} "${RUN[@]}" --set "$CURR" 2>&1 | grep -v -i "warn" | tail -n 70 || status=$?
if [ -z "${PROFILE_STEPS:-}${TIME_STEPS:-}" ]; then
  # The checkpoint is saved before the end-of-run evaluation, so a TIMEOUT_S that falls in the evaluation or the
  # exit leaves a whole checkpoint: stage it (session 20 lost a run's state and log to that)
  if [ ! -f "$out/run/ckpt/train_state.json" ]; then echo "training exited with status $status before saving a checkpoint" >&2; exit $(( status ? status : 1 )); fi
  if [ "$status" -ne 0 ]; then echo "training exited with status $status after saving its checkpoint: staging it" >&2; fi
  if [ -z "${KEEP_STAGE:-}" ]; then mkdir -p /tmp/stage && rm -rf /tmp/stage/ckpt && cp -r "$out/run/ckpt" /tmp/stage/ckpt; fi
  if [ -n "${SAVE_AS:-}" ]; then rm -rf "$SAVE_AS" && cp -r "$out/run/ckpt" "$SAVE_AS"; fi
  cd "$out/run" && tar -cf meta.tar --exclude='*.safetensors' ckpt $(ls loss.png 2>/dev/null) \
    && find ckpt -type f ! -name '*.safetensors' -delete && rm -f loss.png
fi
exit $status
