"""An agent loop of the OpenAI Agents SDK (`openai-agents`, its chat-completions model over an
`AsyncOpenAI` client) against a running `onnxsample serve` on 127.0.0.1: two function tools, a task
that needs both, temperature 0, bounded turns. Run by tests/serve/test_agent_framework.py with
.venv-agents' python (the SDK is not in the main .venv; scripts/build_agents_venv.sh builds it):

    .venv-agents/bin/python tests/serve/_agent_loop.py PORT [MODEL]

Prints one JSON object: the versions, every request the SDK sent to /v1/chat/completions (its body,
the status and the body of the answer), the tool calls the model made (name, arguments as the model
wrote them, call id) and the tool results fed back (call id, output) in run order, the kinds of
output items of each model response (the run result's raw_responses), the kinds of the run's new
items in order, and the final answer. A failed run is reported, not raised: ``error`` holds it.

The tool_choice of each model call is set by the hook below (the agent has
``reset_tool_choice=False``): "required" first, so the grammar forces a call; "auto" up to
CALL_TURNS, where the model may call again or answer; then "none", so the run ends with a text
answer within MAX_TURNS whatever the tiny model chooses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import json
import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunHooks,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

TASK = "What is 2 plus 40, and what is the weather in Paris? Use the tools."
WEATHER = "Sunny, 21 degrees Celsius"
CALL_TURNS = 2  # model calls that may call tools; the ones after answer in text
MAX_TURNS = CALL_TURNS + 2


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city.

    Args:
        city: The city's name.
    """
    return f"{WEATHER} in {city}"


class ToolChoiceByTurn(RunHooks):
    """The tool_choice of each model call: "required" for the first, "auto" up to CALL_TURNS, then
    "none" (the agent has ``reset_tool_choice=False``, so this hook alone sets it)."""

    def __init__(self) -> None:
        self.calls = 0

    async def on_llm_end(self, context, agent, response) -> None:
        self.calls += 1
        choice = "auto" if self.calls < CALL_TURNS else "none"
        agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice=choice)


async def main(port: int, model: str) -> dict:
    set_tracing_disabled(True)
    sent: list[dict] = []

    async def on_request(request) -> None:
        if request.url.path.endswith("/chat/completions"):
            sent.append({"body": json.loads(request.content)})

    async def on_response(response) -> None:
        if response.request.url.path.endswith("/chat/completions"):
            await response.aread()
            sent[-1]["status"] = response.status_code
            sent[-1]["response"] = response.json()

    http = DefaultAsyncHttpxClient(event_hooks={"request": [on_request], "response": [on_response]})
    client = AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, http_client=http
    )
    agent = Agent(
        name="assistant",
        instructions="You are a helpful assistant. Call the tools to answer, then answer briefly.",
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=ModelSettings(temperature=0, max_tokens=120, tool_choice="required"),
        tools=[add, get_weather],
        reset_tool_choice=False,
    )
    out: dict = {
        "versions": {n: importlib.metadata.version(n) for n in ("openai-agents", "openai")},
        "requests": sent,
    }
    try:
        result = await Runner.run(agent, TASK, max_turns=MAX_TURNS, hooks=ToolChoiceByTurn())
    except Exception as e:  # reported to the test, which shows it
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    calls, results = [], []
    for item in result.new_items:
        if isinstance(item, ToolCallItem):
            raw = item.raw_item
            calls.append({"name": raw.name, "arguments": raw.arguments, "call_id": raw.call_id})
        elif isinstance(item, ToolCallOutputItem):
            raw = item.raw_item
            call_id = raw["call_id"] if isinstance(raw, dict) else raw.call_id
            results.append({"call_id": call_id, "output": str(item.output)})
    out["tool_calls"] = calls
    out["tool_results"] = results
    out["responses"] = [[o.type for o in response.output] for response in result.raw_responses]
    out["items"] = [item.type for item in result.new_items]
    out["final_output"] = result.final_output
    return out


if __name__ == "__main__":
    port = int(sys.argv[1])
    model = sys.argv[2] if len(sys.argv) > 2 else "smol"
    print(json.dumps(asyncio.run(main(port, model)), indent=1))
