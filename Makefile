# The two set-up commands: `make demo` (the main job) and `make test` (formatter and linter check, then the tests).
# Each creates or updates .venv by itself on a fresh machine. `make demo` resumes: a second
# run re-renders the report from the finished runs (make clean starts afresh).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all venv clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first: an open range would pull a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test]"
	# torchrec for the real-model tests (optional: they skip, naming it, when it is missing). torchrec 1.8.0
	# names the CUDA fbgemm-gpu; the CPU build of the same version is installed instead.
	$(PY) -m pip install -q --no-deps "torchrec==1.8.0" "fbgemm-gpu-cpu==1.8.0" \
	  && $(PY) -m pip install -q pyre-extensions "tensordict==0.15.3" "torchmetrics==1.0.3" tqdm \
	  || echo "torchrec not installed: the torchrec models of tests/recipe/test_real_models.py are skipped"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mxlab run experiments/quickstart.toml --device cpu --resume

test: $(STAMP)
	$(VENV)/bin/ruff format --check --quiet . || (echo "ruff format: run '$(VENV)/bin/ruff format .'" && false)
	$(VENV)/bin/ruff check --quiet .
	$(PY) -m pytest -q -n auto -m "not slow" tests

# Every case: the slow ones too (each interpreted Triton kernel sweep whole, compile sweeps on every backend).
test-all: $(STAMP)
	$(PY) -m pytest -q -n auto tests

clean:
	rm -rf $(VENV) reports/quickstart
