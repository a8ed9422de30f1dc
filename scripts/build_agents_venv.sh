#!/usr/bin/env bash
# Build .venv-agents, the virtual environment of the OpenAI Agents SDK (`openai-agents`), for the test
# that runs an agent loop through a real agent framework against `onnxsample serve`
# (tests/serve/test_agent_framework.py starts tests/serve/_agent_loop.py with .venv-agents/bin/python).
#
# The SDK pulls in its own openai, httpx2, mcp, starlette and uvicorn releases, so it lives in its own
# virtual environment (git-ignored); the main .venv is never touched.
#
# Steps (skipped when already done; rerunning the script is cheap):
#   `python3 -m venv .venv-agents`, then `pip install` the pins below; a stamp file holding the pins
#   (.venv-agents/.installed-agents) marks a finished install, and changing a pin reinstalls. The test
#   skips while the stamp is missing.
#
# Measured here (2 shared cores): ~25 s, 120 MB.
#
# Environment: PYTHON (interpreter for the new venv, default python3), AGENTS_VENV (default
# .venv-agents).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
AGENTS_VENV="${AGENTS_VENV:-$ROOT/.venv-agents}"

# openai-agents and everything it resolves to, checked working together on Python 3.11.
PINS=(
  "openai-agents==0.24.0"
  "openai==3.57.0"
  "annotated-types==0.8.0"
  "anyio==4.16.0"
  "attrs==26.1.0"
  "certifi==2026.10.19.post1"
  "cffi==2.1.1"
  "charset-normalizer==3.5.3"
  "click==8.5.1"
  "cryptography==50.0.2"
  "griffelib==2.4.1"
  "h11==0.16.0"
  "httpcore2==2.16.2"
  "httpx2==2.16.2"
  "idna==3.20"
  "jiter==0.19.0"
  "jsonschema==4.26.0"
  "jsonschema-specifications==2025.9.1"
  "mcp==2.3.0"
  "mcp-types==2.3.0"
  "opentelemetry-api==1.45.2"
  "pycparser==3.12"
  "pydantic==2.14.4"
  "pydantic-core==2.50.5"
  "pyjwt==2.15.1"
  "python-multipart==0.0.34"
  "referencing==0.37.0"
  "requests==2.34.2"
  "rpds-py==2026.9.1"
  "sniffio==1.3.1"
  "sse-starlette==3.7.0"
  "starlette==1.10.0"
  "truststore==0.10.5"
  "typing-extensions==4.16.0"
  "typing-inspection==0.4.5"
  "urllib3==2.8.0"
  "uvicorn==0.54.0"
  "websockets==16.1.1"
)

say() { printf 'build_agents_venv: %s\n' "$*"; }

STAMP="$AGENTS_VENV/.installed-agents"
WANT="$(printf '%s\n' "${PINS[@]}")"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  say "up to date: $AGENTS_VENV (delete it to rebuild)"
  exit 0
fi

# Another `make test` may be building the same thing: wait for it instead of racing it.
mkdir -p "$ROOT/artifacts/cache"
exec 9>"$ROOT/artifacts/cache/.venv-agents.lock"
flock 9
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  say "up to date: built by a concurrent run ($AGENTS_VENV)"
  exit 0
fi

t0=$SECONDS
if [[ ! -x "$AGENTS_VENV/bin/python" ]]; then
  say "creating $AGENTS_VENV with $PYTHON"
  "$PYTHON" -m venv "$AGENTS_VENV"
fi
say "installing into $AGENTS_VENV: ${PINS[*]}"
rm -f "$STAMP"
"$AGENTS_VENV/bin/python" -m pip install -q --upgrade pip
"$AGENTS_VENV/bin/python" -m pip install -q "${PINS[@]}"
# What the agent loop imports: fails here, not in the test.
"$AGENTS_VENV/bin/python" -c \
  "from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled"
printf '%s\n' "$WANT" >"$STAMP"
say "installed in $((SECONDS - t0)) s ($(du -sh "$AGENTS_VENV" | cut -f1))"
