# fedrun — two commands set up a fresh machine:
#   make run    create .venv, install, run the default experiment
#   make test   create .venv, install, run the tests
PY      ?= python3
VENV    ?= .venv
BIN      = $(VENV)/bin
# Data root: $FEDRUN_DATA if set, else ../shared/data when it exists (this project's workplace).
SHARED_DATA := $(abspath ../shared/data)
ifeq ($(origin FEDRUN_DATA), undefined)
  ifneq ($(wildcard $(SHARED_DATA)/README.md),)
    export FEDRUN_DATA := $(SHARED_DATA)
  endif
endif
PYTEST_ARGS ?=
# make test uses two pytest-xdist workers, each test file on one worker (--dist loadfile), ~3.7 GB for both;
# TEST_WORKERS=0 runs one process (about 2.4 GB)
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: install run test test-slow bench gpu-check ui tables clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]'
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/fedrun $(ARGS)

test: install
	$(BIN)/python -m pytest -q --durations=15 $(XDIST) $(PYTEST_ARGS)

test-slow: install
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

bench: install
	$(BIN)/python scripts/bench_training.py speed --out results/bench/speed.md
	$(BIN)/python scripts/bench_training.py memory --out results/bench/memory.md
	$(BIN)/python scripts/bench_privatizer.py --out results/bench/privatizer.md

# on a CUDA machine (≤ 8 min): CUDA-only tests, speed at 100 and 1,000 clients per round, memory, the default
# experiment on the GPU → results/bench/gpu.md; without CUDA it stops with a one-line error and writes nothing
gpu-check: install
	$(BIN)/python scripts/gpu_check.py --out results/bench/gpu.md

# prints the URL of each experiment's runs table (MLflow 3 otherwise opens its GenAI overview), then serves
ui: install
	@$(BIN)/python -m fedrun.tracking ui-url --uri $${MLFLOW_TRACKING_URI:-sqlite:///mlflow.db} --port $${PORT:-5000}
	$(BIN)/mlflow ui --backend-store-uri $${MLFLOW_TRACKING_URI:-sqlite:///mlflow.db} --port $${PORT:-5000}

clean:
	rm -rf outputs multirun .pytest_cache
