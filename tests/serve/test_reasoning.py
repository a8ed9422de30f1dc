"""A thinking model's thought apart from its answer (llama-server's ``reasoning_format``), whole
and streamed, where the answer opens the thought and where the prompt already has: the tiny
model is made to write a thought and an answer by a grammar, under a template that opens one and
under its own."""

from __future__ import annotations

import json
import re

import openai
import pytest
from _http import CHAT, ask_chat_page, get, open_chat_page, post, served

from onnxsample.serve.reasoning import ThoughtStream, split_thought

OPENING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
THOUGHT = 'root ::= [a-z] [a-z] [a-z] "\\n</think>\\n\\nhello"'  # a thought the prompt opened
WHOLE = 'root ::= "<think>" [a-z] [a-z] "</think>" " hi"'  # one the answer opens itself


@pytest.fixture(scope="module")
def ports(models, tmp_path_factory):
    template = tmp_path_factory.mktemp("thinking") / "opening.jinja"
    template.write_text(OPENING)
    args = ("--threads", "1", "--served-model-name", "tiny")
    opening = served(models["two"], *args, "--chat-template", str(template))
    auto = served(models["four"], *args, "--reasoning-format", "auto")
    with opening as thinking, served(models["four"], *args) as plain, auto as split:
        yield {"opening": thinking.port, "plain": plain.port, "auto": split.port}


def _client(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)


@pytest.mark.parametrize(
    ("server", "grammar", "fmt", "thought", "content"),
    [
        ("opening", THOUGHT, "auto", r"[a-z]{3}", "hello"),
        ("opening", THOUGHT, "deepseek", r"[a-z]{3}", "hello"),
        ("opening", THOUGHT, "none", None, r"[a-z]{3}\n</think>\n\nhello"),
        ("opening", THOUGHT, None, None, r"[a-z]{3}\n</think>\n\nhello"),  # as vLLM's default
        ("plain", WHOLE, "auto", r"[a-z]{2}", "hi"),
        ("plain", WHOLE, None, None, r"<think>[a-z]{2}</think> hi"),
        ("auto", WHOLE, None, r"[a-z]{2}", "hi"),  # serve --reasoning-format auto
        ("auto", WHOLE, "none", None, r"<think>[a-z]{2}</think> hi"),
    ],
)
def test_the_thought_goes_apart_whole_and_streamed(ports, server, grammar, fmt, thought, content):
    client = _client(ports[server])
    extra = {"grammar": grammar, **({"reasoning_format": fmt} if fmt else {})}
    whole = client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=40, seed=3, temperature=0.8, extra_body=extra
    )
    message = whole.choices[0].message.model_dump()
    assert re.fullmatch(content, message["content"]), message
    if thought is None:
        assert "reasoning_content" not in message, message
    else:
        assert re.fullmatch(thought, message["reasoning_content"]), message
    stream = client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=40, seed=3, temperature=0.8, extra_body=extra,
        stream=True,
    )  # fmt: skip
    said = {"content": "", "reasoning_content": ""}
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            for key in said:
                said[key] += delta.get(key) or ""
    assert said == {"content": message["content"],
                    "reasoning_content": message.get("reasoning_content") or ""}  # fmt: skip


def test_props_say_the_servers_reasoning_format(ports):
    for server, fmt in (("plain", "none"), ("auto", "auto")):
        code, raw = get(ports[server], "/props")
        assert code == 200
        assert json.loads(raw)["default_generation_settings"]["params"]["reasoning_format"] == fmt


def test_a_thought_cut_by_max_tokens_is_all_reasoning(ports):
    body = {"messages": CHAT, "max_tokens": 3, "reasoning_format": "auto", "ignore_eos": True}
    code, data = post(ports["opening"], "/v1/chat/completions", json.dumps(body).encode())
    message = data["choices"][0]["message"]
    assert code == 200 and message["content"] == "" and message["reasoning_content"], data
    assert data["choices"][0]["finish_reason"] == "length"


def test_a_format_this_server_does_not_write_is_refused(ports):
    body = {"messages": CHAT, "max_tokens": 2, "reasoning_format": "deepseek-legacy"}
    code, data = post(ports["plain"], "/v1/chat/completions", json.dumps(body).encode())
    assert code == 400 and data["error"]["param"] == "reasoning_format", data


@pytest.mark.parametrize(
    ("text", "opened", "want"),
    [
        ("<think>\nabc\n</think>\n\nHello", False, ("abc", "Hello")),
        ("abc</think>\n\nHi", True, ("abc", "Hi")),
        ("Hello", False, (None, "Hello")),
        ("  <think> x </think>y", False, ("x", "y")),
        ("<think>cut off", False, ("cut off", "")),
        ("cut off", True, ("cut off", "")),
        ("x</think>", False, (None, "x</think>")),  # a thought starts the answer or is none
        ("", False, (None, "")),
    ],
)
def test_a_streamed_thought_and_answer_add_up_to_the_whole(text, opened, want):
    """Fed one character at a time, the thought's parts add up to the whole answer's thought and
    the answer so far only grows, however the markers fall between the parts."""
    assert split_thought(text, opened) == want
    stream, thought, answer = ThoughtStream(opened), "", ""
    for end in range(1, len(text) + 1):
        new, now = stream.feed(text[:end])
        assert now.startswith(answer), (answer, now)
        thought, answer = thought + new, now
    new, answer = stream.feed(text, final=True)
    assert (thought + new or None, answer) == want


def test_the_chat_page_shows_a_thought_apart(ports, chromium):
    """The chat page asks for the thought apart and shows it above the answer, which stays empty
    here: the opening template puts the whole answer of the tiny model inside the thought."""
    from selenium.webdriver.common.by import By

    wait = open_chat_page(chromium, ports["opening"])
    limit = chromium.find_element(By.ID, "max_tokens")
    limit.clear()
    limit.send_keys("12")
    answer = ask_chat_page(chromium, wait, "Think about the sea.")
    thought = chromium.find_element(By.CSS_SELECTOR, ".thought div").text
    assert thought.strip() and not answer, (thought, answer)
    assert not chromium.find_elements(By.CSS_SELECTOR, ".message.error")
