# Sourced by every GPU run script (bench/*_gpu.sh, bench/*_h200.sh): the one place that installs the wheels a device
# call carried (.whl/*/ from bench/device_inputs.sh, .gpu/wheels/) into /tmp/site, since the device image has none of
# them; puts the checkout and /tmp/site on PYTHONPATH; and defines step LIMIT_S CMD...: CMD under its own time limit,
# its last TAIL (40) lines without warnings and its exit status, so a slow step leaves the others' results under $OUT.
# DEVICE=cpu (a dry run here) installs nothing: this machine has its own environment.
# one path per wheel file name: .whl/gen and .whl/bench share pydantic's, and a warm machine keeps an earlier call's
wheels=$( ( (compgen -G ".whl/*/*.whl"; compgen -G ".gpu/wheels/*.whl") || true) | awk -F/ '!seen[$NF]++')
if [ -n "$wheels" ] && [ "${DEVICE:-cuda}" = cuda ]; then
  # shellcheck disable=SC2086  # one path per word
  ${PY:-python3} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
step() {
  local s=$1; shift; local t0=$SECONDS
  timeout "$s" "$@" 2>&1 | grep -v -i warn | grep -v "^\[transformers\]" | tail -n "${TAIL:-40}"
  echo "== rc ${PIPESTATUS[0]} in $((SECONDS - t0)) s: $*"
}
