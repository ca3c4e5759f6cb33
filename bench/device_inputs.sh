#!/usr/bin/env bash
# The ignored inputs that the device scripts carry to the GPU machine, made again from the repository, this machine's
# text sources and ../shared (CPU, about a minute; PyPI for the wheels). A fresh checkout has none of them.
#   .whl/gen          PyMuPDF 1.24.14 (the 2.0 wheel is over the carry limit), pydantic and fla: bench/drafter_h200.sh
#                     draws its training pages on the GPU machine and prefills through fla's chunked GDN
#   .whl/bench        pydantic and fla: bench/spec_h200.sh, bench/drafter_tau.py, bench/engine_bench.py
#   .drafter/synth    fonts and a sample of the train text pool (POOL_PROSE paragraphs, POOL_CODE code runs)
#   .drafter/heldout  24 held-out synthetic pages cut into the blocks the job reads (85 block images)
#   .drafter/corpus   the first page of 9 born-digital corpus documents, at most 4 blocks each (35 block images)
# and, last, what each device script's call would send against the 64 MiB limit.
#     bash bench/device_inputs.sh            # PARTS="wheels drafter sizes" by default
set -euo pipefail
PY=${PY:-.venv/bin/python} PARTS=${PARTS:-wheels drafter sizes}
CORPUS=${CORPUS:-../shared/corpus}
if [[ " $PARTS " == *" wheels "* ]]; then
  plat="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
  rm -rf .whl/gen .whl/bench
  # pydantic with what it needs (its core's version is pinned by it; typing_extensions is in the GPU image, beside
  # torch); PyMuPDF and fla alone (their other needs are in the GPU image: torch, numpy)
  $PY -m pip download -q $plat -d .whl/gen "pydantic==2.14.4" 2> >(grep -v "is ignored" >&2)
  rm -f .whl/gen/typing_extensions-*.whl
  cp -r .whl/gen .whl/bench
  $PY -m pip download -q --no-deps $plat -d .whl/gen "pymupdf==1.24.14" 2> >(grep -v "is ignored" >&2)
  $PY -m pip download -q --no-deps $plat -d .whl/bench "fla-core==0.6.0" "flash-linear-attention==0.6.0" einops \
    2> >(grep -v "is ignored" >&2)
  # the drafter run's collection prefills (answers and taps) through fla's chunked GDN too: without it the torch form
  # launches ~2,000 kernels a prefill step, the likely cap of its ~51 block images a second (docs/decisions.md)
  cp .whl/bench/fla_core-*.whl .whl/bench/flash_linear_attention-*.whl .whl/bench/einops-*.whl .whl/gen/
  du -sh .whl/gen .whl/bench
fi
if [[ " $PARTS " == *" drafter "* ]]; then
  [ -f .synth/pool_train.json.gz ] || $PY -m research.ocria_tiny.make_synthetic_pages --out .synth
  rm -rf .drafter && mkdir -p .drafter/synth
  cp -r .synth/fonts .drafter/synth/fonts
  POOL_PROSE=${POOL_PROSE:-18000} POOL_CODE=${POOL_CODE:-1500} $PY -c '
import os, random
from research.ocria_tiny.synthetic import TextPool
pool = TextPool.from_json_gz(".synth/pool_train.json.gz")
rng = random.Random(0)
TextPool(rng.sample(pool.prose, min(int(os.environ["POOL_PROSE"]), len(pool.prose))),
         rng.sample(pool.code, min(int(os.environ["POOL_CODE"]), len(pool.code)))).to_json_gz(
    ".drafter/synth/pool_train.json.gz")'
  $PY -m research.ocria_tiny.drafter_pages --synth .synth --split heldout --pages 24 --out .drafter/heldout
  tmp=$(mktemp -d)
  $PY bench/drafter_block_pages.py --checkpoint models/ocria-tiny --max-pages 1 --out "$tmp" \
    $(printf "$CORPUS/%s.pdf " olmocr__bws_book_ch2 olmocr__dolma-page-1 olmocr__edgar-rotated90 \
      olmocr__math_2503_04086 olmocr__olmo-page-1 pymupdf__v110-changes pypdf__crazyones pysf__google-doc-document \
      pysf__pdflatex-4-pages)
  mkdir -p .drafter/corpus && cp "$tmp"/*-b0[0-3].png .drafter/corpus/ && rm -rf "$tmp"
  echo "block images: heldout $(ls .drafter/heldout | wc -l), corpus $(ls .drafter/corpus | wc -l)"
  du -sh .drafter/*
fi
if [[ " $PARTS " == *" sizes "* ]]; then
  $PY -c '
import subprocess
from pathlib import Path

LIMIT = 64 * 2 ** 20
tracked = [p for p in subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout.decode()
           .split("\0") if p]


def size(paths):
    files = [f for p in paths for f in ([Path(p)] if Path(p).is_file() else Path(p).rglob("*"))]
    return sum(f.stat().st_size for f in files if f.is_file())


# not read on the device by the speculative-decoding scripts: quantized checkpoints, results, tests, notes
spare = ("models/ocria-tiny-fp8/", "models/ocria-tiny-nvfp4/", "bench/results/", "research/ocria_tiny/results/",
         "research/ocria_tiny/commands.md", "tests/", "research/tests/", "samples/", "docs/")
tree = size(p for p in tracked if not p.startswith(spare))
print(f"tree {size(tracked) / 2**20:.1f} MiB; {tree / 2**20:.1f} MiB without: rm -rf {chr(32).join(spare)}"
      " (git checkout -- . after)")
# the drafter runs train their own drafters: the shipped one may stay behind too (not to --init from it)
drafter = size(p for p in tracked if p.startswith("models/ocria-tiny-drafter/"))
for script, carry, less in (("drafter_h200.sh", [".drafter/synth", ".whl/gen"], drafter),
                            ("drafter_h200.sh SCALING",
                             [".drafter/synth", ".drafter/heldout", ".drafter/corpus", ".whl/gen"], drafter),
                            ("spec_h200.sh", [".drafter/heldout", ".whl/bench"], 0),
                            ("drafter_tau.py", [".drafter/heldout", ".drafter/corpus", ".whl/bench"], 0)):
    total = tree - less + size(carry)
    verdict = "fits" if total <= LIMIT else "OVER"
    print(f"{script:16} carry {chr(32).join(carry):45} {total / 2**20:5.1f} MiB of 64: {verdict}"
          + (" (without models/ocria-tiny-drafter too)" if less else ""))
'
fi
