# Two commands for a new user: `make run` and `make test`. Everything else is set up on demand.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export RAY_USAGE_STATS_ENABLED := 0
export AWS_EC2_METADATA_DISABLED := true
export TOKENIZERS_PARALLELISM := false

.PHONY: run test setup samples checkpoint clean test-fast research-test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
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

test: $(STAMP)
	TRITON_INTERPRET=1 timeout 2400 $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# ocria-tiny's training and evaluation code (research/): its own tests, apart from the product's
research-test: $(STAMP)
	TRITON_INTERPRET=1 timeout 2400 $(PY) -m pytest -q -p no:cacheprovider research/tests $(PYTEST_ARGS)

test-fast: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q -m "not ray and not slow" $(PYTEST_ARGS)

clean:
	rm -rf out $(VENV) models/tiny-random
