# Two commands for a new user: `make run` and `make test`. Everything else is set up on demand.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export RAY_USAGE_STATS_ENABLED := 0
export AWS_EC2_METADATA_DISABLED := true
export TOKENIZERS_PARALLELISM := false

.PHONY: run test test-system setup checkpoint clean research-test deps-check

# torch's CPU build, for `make run` and `make test` on a machine without a GPU (docs/install.md). Where the index cannot
# be reached in 5 s, torch comes from PyPI (its CUDA build, which runs on CPU too) or your pip configuration.
# `make setup TORCH_INDEX=` skips it.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	extra=""; if [ -n "$(TORCH_INDEX)" ]; then \
	  if $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_INDEX)/', timeout=5)" 2>/dev/null; then \
	    extra="--extra-index-url $(TORCH_INDEX)"; \
	  else echo "note: $(TORCH_INDEX) cannot be reached: torch comes from PyPI or your pip configuration"; fi; \
	fi; \
	$(PY) -m pip install -q $$extra -e '.[dev,interop]'
	touch $@

setup: $(STAMP)

# The random-weight fallback checkpoint (used by tests; `make run` uses models/ocria-tiny when it is present).
models/tiny-random/config.json: $(STAMP) jobs/make_tiny_checkpoint.py engine/hf_format.py
	$(PY) jobs/make_tiny_checkpoint.py --out models/tiny-random --seed 0

checkpoint: models/tiny-random/config.json

# The best local model: the trained ocria-tiny when it is in the checkout, else the random-weight fallback.
MODEL ?= $(if $(wildcard models/ocria-tiny/model.safetensors),models/ocria-tiny,models/tiny-random)

run: $(STAMP) $(if $(filter models/tiny-random,$(MODEL)),models/tiny-random/config.json)
	$(PY) jobs/parse_corpus.py --config configs/default.yaml --checkpoint $(MODEL) $(ARGS)

# The dependency set (every extra too) must resolve from PyPI alone: pip in isolated mode ignores this machine's pip
# configuration and local wheels. Needs network access to PyPI; about a minute. The requirements are read from
# pyproject.toml, so no build environment is set up for the check.
deps-check: $(STAMP)
	$(PY) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
	print('\n'.join(p['dependencies'] + [d for e in p['optional-dependencies'].values() for d in e]))" | \
	timeout 600 $(PY) -m pip install --isolated --dry-run --ignore-installed --quiet --report /dev/null -r /dev/stdin
	@echo "dependencies resolve from PyPI alone"

# The product's tests but the whole-system runs (a real job on Ray, a drafter's training, a whole benchmark)
test: $(STAMP) deps-check
	TRITON_INTERPRET=1 timeout 1800 $(PY) -m pytest -q --durations=10 -p no:cacheprovider -m "not system" $(PYTEST_ARGS)

# The whole-system runs (pytest marker "system": every test marked ray or slow), CI's second step
test-system: $(STAMP)
	TRITON_INTERPRET=1 timeout 2400 $(PY) -m pytest -q --durations=10 -p no:cacheprovider -m system $(PYTEST_ARGS)

# ocria-tiny's training and evaluation code (research/): its own tests, apart from the product's
research-test: $(STAMP)
	TRITON_INTERPRET=1 timeout 2400 $(PY) -m pytest -q -p no:cacheprovider research/tests $(PYTEST_ARGS)

# bench/results/README.md written from the result files themselves (stdlib only, so no setup first)
.PHONY: results-index
results-index:
	$(PYTHON) bench/results_index.py

clean:
	rm -rf out $(VENV) models/tiny-random
