"""Integration: an agent loop through a real agent framework, the OpenAI Agents SDK
(`openai-agents`, its ``OpenAIChatCompletionsModel`` over ``AsyncOpenAI``), against `onnxsample serve`
on the embedded SmolLM2.

The SDK lives in its own venv, .venv-agents (`make agents-venv`, scripts/build_agents_venv.sh), so
tests/serve/_agent_loop.py runs with that venv's python against a server started here: two function
tools (``add``, ``get_weather``), a task that needs both, temperature 0, bounded turns. The asserts
hold whatever the tiny model chooses: every request the SDK sends is accepted, the calls parse (known
names, arguments of the tool's schema), each tool result goes back to the model in a later request,
and the run ends with a text answer.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from _http import served

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-agents"
LOOP = Path(__file__).with_name("_agent_loop.py")
WEATHER = "Sunny, 21 degrees Celsius in {city}"  # what _agent_loop.py's get_weather answers


def _result(name: str, args: dict) -> str:
    """What the loop's tool returns for these arguments, as the SDK feeds it back."""
    return str(args["a"] + args["b"]) if name == "add" else WEATHER.format(city=args["city"])


def _check_arguments(name: str, arguments: str) -> dict:
    """The arguments of a call, parsed and checked against its tool's schema."""
    args = json.loads(arguments)
    if name == "add":
        assert set(args) == {"a", "b"}, arguments
        assert all(type(args[k]) is int for k in "ab"), arguments
    else:
        assert name == "get_weather", name
        assert set(args) == {"city"} and isinstance(args["city"], str), arguments
    return args


@pytest.fixture(scope="module")
def agents_python() -> Path:
    if not (VENV / ".installed-agents").is_file():
        pytest.skip(
            f"the OpenAI Agents SDK's venv {VENV.name} is not built: run `make agents-venv`"
        )
    return VENV / "bin" / "python"


@pytest.fixture(scope="module")
def run(agents_python, embedded_gqa_exports) -> dict:
    """The loop's report (see tests/serve/_agent_loop.py) of one run against a fresh server."""
    model = embedded_gqa_exports["gguf-a4"].output
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    with served(model, "--threads", "2", "--served-model-name", "smol", startup_s=300) as proc:
        done = subprocess.run(
            [str(agents_python), str(LOOP), str(proc.port), "smol"],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    refused = [(r["body"], r.get("response")) for r in report["requests"] if r.get("status") != 200]
    assert "error" not in report and not refused, (report.get("error"), refused)
    return report


def test_the_sdk_sends_tools_and_tool_choice_and_each_request_is_answered(run):
    requests = run["requests"]
    first = requests[0]["body"]
    assert first["model"] == "smol" and first["temperature"] == 0
    assert first["tool_choice"] == "required"
    assert {t["function"]["name"] for t in first["tools"]} == {"add", "get_weather"}
    # one model response of the run per request, the server's answer to it
    assert len(run["responses"]) == len(requests) >= 2
    for request in requests:
        assert request["status"] == 200 and len(request["response"]["choices"]) == 1


def test_tool_calls_parse_and_run(run):
    calls, results = run["tool_calls"], run["tool_results"]
    assert calls, "tool_choice required: the first answer calls a tool"
    assert [r["call_id"] for r in results] == [c["call_id"] for c in calls]
    for call, result in zip(calls, results, strict=True):
        args = _check_arguments(call["name"], call["arguments"])
        assert result["output"] == _result(call["name"], args)
    # the server's own answers: calls end with finish_reason tool_calls and no content
    for request in run["requests"]:
        choice = request["response"]["choices"][0]
        if choice["message"].get("tool_calls"):
            assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None


def test_each_tool_result_goes_back_to_the_model(run):
    requests = [r["body"] for r in run["requests"]]
    answered_by = {}  # call id -> the index of the first request whose messages answer it
    for i, body in enumerate(requests):
        for message in body["messages"]:
            if message["role"] == "tool":
                answered_by.setdefault(message["tool_call_id"], (i, message["content"]))
    for result in run["tool_results"]:
        assert result["call_id"] in answered_by, result
        i, content = answered_by[result["call_id"]]
        assert content == result["output"]
        # the request that carried it also carried the assistant's call, and came after the
        # response that made the call
        assert any(
            c["id"] == result["call_id"]
            for m in requests[i]["messages"]
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or []
        )
        made = next(
            k
            for k, r in enumerate(run["requests"])
            for c in r["response"]["choices"][0]["message"].get("tool_calls") or []
            if c["id"] == result["call_id"]
        )
        assert i == made + 1
    items = run["items"]
    assert items.index("tool_call_output_item") < len(items) - 1, "a model request after results"


def test_a_final_text_answer_arrives(run):
    assert isinstance(run["final_output"], str) and run["final_output"].strip()
    assert run["responses"][-1] == ["message"] and run["items"][-1] == "message_output_item"
    last = run["requests"][-1]
    choice = last["response"]["choices"][0]
    assert not choice["message"].get("tool_calls")
    assert choice["message"]["content"] == run["final_output"]
    assert choice["finish_reason"] in ("stop", "length")
    assert any(m["role"] == "tool" for m in last["body"]["messages"]), "after the tool results"
