#!/usr/bin/env bash
# #60's whole job on one GPU machine: jobs/benchmark_job.py at configs/gpu.yaml on a generated corpus (PAGES pages,
# 750 output tokens each), the 4B shape with random weights (engine.testing.write_random_checkpoint, as
# bench/scale_out.py writes it), its report and the headline <gpu>_job_throughput.json under $1.
# The device image lacks Ray, PyMuPDF, pydantic and boto3: ../shared/tools/gpu-wheels.sh packs them into parts of
# 48 MB, and a call carries one part beside a working tree trimmed to the code (~2 MB):
#   ../shared/tools/gpu-wheels.sh .gpu/job [pyarrow click ...]      # here, once: .gpu/job/p1, p2, ... (name what
#                                                                   # the import check below found missing)
#   rm -rf models bench/results docs tests research samples         # here, before the calls (git checkout -- . after)
#   STAGE=1 bash bench/job_gpu.sh        # device call per part but the last, carrying .gpu/job/pN: kept in .gpu/stage
#   bash bench/job_gpu.sh $OUT           # the last part's call: joins the parts, installs, writes the checkpoint, runs
# The calls must follow each other within the machine's idle time (30 s): .gpu/stage lives on the warm machine only.
# SETTINGS: more jobs/benchmark_job.py flags (e.g. "--engine-option kv_cache_dtype=fp8").
set -uo pipefail
out=${1:-${OUT:-}}
mkdir -p .gpu/stage
for part in .gpu/job/p*/wheels.tar.part*; do
  [ -e "$part" ] && cp "$part" .gpu/stage/ && echo "staged $(basename "$part") ($(du -h "$part" | cut -f1))"
done
[ -n "${STAGE:-}" ] && { ls .gpu/stage; exit 0; }
[ -n "$out" ] || { echo "usage: bash bench/job_gpu.sh OUT (or STAGE=1 to stage a part)" >&2; exit 2; }
cat .gpu/stage/wheels.tar.part* | tar -x -C .gpu/stage || { echo "the staged parts do not make one tar" >&2; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/stage/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -c "import ray, fitz, pydantic, boto3, pyarrow, click; print('ray', ray.__version__, 'pymupdf', fitz.VersionBind)" \
  || { echo "a job dependency is missing from the image and the wheels" >&2; exit 1; }
gpu=$(python3 -c "import torch; n=torch.cuda.get_device_name(); print('h200' if 'H200' in n else 'h100')")
t0=$SECONDS
python3 -c "
from pathlib import Path
from bench.scale_out import build_checkpoint
print(build_checkpoint(Path('/tmp/ckpt4b'), tiny=False))" || exit 1
echo "== checkpoint in $((SECONDS - t0)) s"
timeout ${JOB_S:-480} python3 jobs/benchmark_job.py --config configs/gpu.yaml --checkpoint /tmp/ckpt4b \
  --pages ${PAGES:-1500} --max-tokens 750 --engine-option ignore_eos=true ${SETTINGS:-} \
  --out "$out/job" --results "$out" 2>&1 | grep -v -i warn | tail -n 40
echo "== rc ${PIPESTATUS[0]} in $((SECONDS - t0)) s"
cp "$out/job/report.json" "$out/${gpu}_job_report.json" 2>/dev/null
cp "$out/job/report.png" "$out/${gpu}_job_report.png" 2>/dev/null
rm -rf "$out/job"
