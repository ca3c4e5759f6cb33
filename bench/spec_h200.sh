#!/usr/bin/env bash
# Speculative decoding on one GPU, in one command (the device tool's machine; carry .whl/bench for pydantic and fla,
# made with .drafter by bench/device_inputs.sh):
#   PARTS="kernels profile gemv" bash bench/spec_h200.sh OUT # ~6 min
#   PARTS="4b tiny" bash bench/spec_h200.sh OUT              # ~6 min (tiny: carry .drafter/heldout too)
# kernels: bench/spec_kernels_bench.py (every launch configuration of the step's kernels, graph-timed; ~4.5 min);
# kernels-short: the same with --short (each default launch against a few others, no attention rows; ~1 min);
# decode-kernels: bench/kernels_bench.py at batch 1-256 (plain decode's kernels and their launch sweeps: the GDN
#          decode kernel's tiles and warps);
# profile: bench/decode_profile.py --spec 16 at batch 1 and 32 (where a speculative step's device time goes, against
#          a plain step of the same engine build);
# 4b:      bench/spec_decode_bench.py part 2, the 4B shape at ocria-tiny's measured acceptance and at 0.9, blocks of
#          16, 8 and 4 at batch 1, 8 and 64 (BLOCKS_4B, BATCHES_4B; a long block costs most at batch 64), at
#          each GDN write-back threshold of FOLD_AFTER (default 0; e.g. "0 8": also with 8 accepted tokens pending
#          before a write-back);
# gemv:    bench/small_m_linear_bench.py at M = 16 (a verify block's rows at batch 1 go through the decode GEMV,
#          which was only measured at M = 1 and 8 against cuBLAS);
# tiny:    part 1, ocria-tiny with models/ocria-tiny-drafter on the held-out blocks, speculation on vs off, blocks of
#          16 and 8 (TINY_BLOCKS), each timing the median of 3 runs, at each threshold of FOLD_AFTER.
# OUT gets one JSON per part and log.txt; a summary table is printed at the end.
set -euo pipefail
OUT=${1:?usage: spec_h200.sh OUT}
PARTS=${PARTS:-kernels profile} PY=${PY:-python3} BLOCKS_4B=${BLOCKS_4B:-16 8 4} BATCHES_4B=${BATCHES_4B:-1 8 64}
FOLD_AFTER=${FOLD_AFTER:-0} TINY_BLOCKS=${TINY_BLOCKS:-16 8}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
source bench/device_env.sh
# ocria-tiny's conditional acceptance by block position with its shipped drafter, measured at block 16 on the 85
# held-out blocks in bf16 on the GPU (bench/results/h100_drafter_dflash2_tau_e.json; the drafter before it:
# [0.692,0.659,0.658,0.633,...], h100_drafter_dflash2_tau_d.json)
MEASURED='ocria-tiny measured=[0.718,0.681,0.701,0.668,0.695,0.714,0.745,0.714,0.699,0.763,0.752,0.686,0.801,0.624,0.639]'
for part in $PARTS; do
  t=$(date +%s)
  case $part in
    kernels) timeout 300 $PY bench/spec_kernels_bench.py --out "$OUT/h200_spec_kernels.json" ;;
    kernels-short) timeout 150 $PY bench/spec_kernels_bench.py --short --out "$OUT/h200_spec_kernels.json" ;;
    decode-kernels) timeout 240 $PY bench/kernels_bench.py --batch-sizes 1 8 32 64 256 --out "$OUT/h200_kernels.json" ;;
    profile) timeout 300 $PY bench/decode_profile.py --spec 16 --variants default --batch-sizes 1,32 --steps 10 \
               --graph-steps 20 --out "$OUT/profile_spec" ;;
    gemv) timeout 150 $PY bench/small_m_linear_bench.py --batch-sizes 16 --budget-s 60 \
            --out "$OUT/h200_small_m_linear_m16.json" ;;
    4b) timeout 480 $PY bench/spec_decode_bench.py --parts 4b --block-sizes $BLOCKS_4B --batches-4b $BATCHES_4B \
          --fold-after $FOLD_AFTER \
          --profile "$MEASURED" --profile "uniform 0.9=[$(printf '0.9,%.0s' {1..14})0.9]" \
          --out "$OUT/h200_spec_decode_4b.json" ;;
    tiny) timeout 420 $PY bench/spec_decode_bench.py --parts tiny --drafter models/ocria-tiny-drafter \
            --pages .drafter/heldout --max-tokens 256 --block-sizes $TINY_BLOCKS --batches 1 8 32 128 --repeats 3 \
            --fold-after $FOLD_AFTER \
            --out "$OUT/h200_spec_decode_tiny.json" ;;
    *) echo "unknown part $part" && exit 2 ;;
  esac || echo "$part stopped (rc $?)"
  echo "seconds: $part $(($(date +%s) - t))"
done
$PY - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
if (f := out / "h200_spec_kernels.json").exists():
    rows = [r for r in json.loads(f.read_text())["rows"] if "us" in r]
    best = {}
    for r in rows:
        key = (r["kernel"].split(",")[0], r["sequences"], r.get("fold_after", -1), r.get("pending", -1),
               "reference" in r["kernel"])  # the best tile / warps of each form
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    print(f"{'kernel (best configuration)':80} {'seqs':>4} {'us':>8} {'roof':>7}")
    for (k, n, *_), r in sorted(best.items()):
        cfg = ", ".join(f"{c}={r[c]}" for c in ("fold_after", "pending", "block_v", "block_c", "num_warps",
                                                 "rows_per_seq", "tile")
                        if r.get(c) is not None)
        print(f"{r['kernel'] + ' ' + cfg:80.80} {n:4d} {r['us']:8.1f} {r['roofline_us']:7.1f}")
if (f := out / "profile_spec" / "decode_profile.json").exists():
    for r in json.loads(f.read_text())["runs"]:
        print(f"spec step b{r['batch']}: graph {r['graph_step_ms']:.2f} ms, kernels {r['kernels_per_step']:.0f}, "
              f"eager kernel sum {r['kernel_sum_ms']:.2f} ms")
        for s, v in list(r["scopes"].items())[:8]:
            print(f"   {s:28} {v['us_per_step'] / 1e3:7.3f} ms  {v['per_step']:6.1f} kernels")
for name in ("h200_spec_decode_4b.json", "h200_spec_decode_tiny.json"):
    if (f := out / name).exists():
        for r in json.loads(f.read_text())["rows"]:
            print(f"{r['model']:10} b{r['batch']:<4} T{r['block_size']:<3} {r.get('profile', ''):22} "
                  f"{r.get('spec_step', ''):7} fold_after {r.get('spec_fold_after', ''):<3} tau "
                  f"{r['tau']:5.2f} {r['tok_s_per_seq']:8.1f} vs {r['tok_s_per_seq_plain']:8.1f} tok/s/seq "
                  f"-> {r['speedup']:.2f}x" + (f"; total {r['tok_s_total']:.0f} vs {r['tok_s_total_plain']:.0f} tok/s"
                                               if "tok_s_total" in r else ""))
EOF
