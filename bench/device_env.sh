# Sourced by the H200 benchmark scripts (bench/h200_*.sh): fla into /tmp/site (carry .gpu/wheels), the environment,
# and step LIMIT_S CMD...: runs CMD under its own time limit, prints its last 40 lines without warnings and its exit
# status, so a slow step leaves the others' results under $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
step() {
  local s=$1; shift; local t0=$SECONDS
  timeout "$s" "$@" 2>&1 | grep -v -i warn | grep -v "^\[transformers\]" | tail -n 40
  echo "== rc ${PIPESTATUS[0]} in $((SECONDS - t0)) s: $*"
}
