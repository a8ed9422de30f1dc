"""The tool-call formats of real chat templates (llama.cpp ships them, from the models' own
repositories): each is recognised, renders OpenAI's tools, and the calls it writes into an
assistant turn are what our grammar for it accepts and what our reader parses back, with the
family's real tokenizer."""

from __future__ import annotations

import json
import random
import shutil

import pytest
from _llama_cpp_vocab import write_tokenizer
from _structured_cases import ADD, ANY_CITY_WEATHER, TIME, WEATHER, streamed_calls

from onnxsample.serve.envelope import EnvelopeStream
from onnxsample.serve.tool_formats import NativeFormat, detect
from onnxsample.text._grammar import GrammarVocabulary
from onnxsample.text.tokenizer import Tokenizer

# (template file in llama.cpp's models/templates, format, tokenizer family, calls it writes a turn)
TEMPLATES = [
    ("Qwen-Qwen2.5-7B-Instruct", "hermes", "qwen2", 2),
    ("Qwen-Qwen3-0.6B", "hermes", "qwen3", 2),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "hermes", "llama3", 1),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes", "llama3", 2),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3", "llama3", 1),
    ("meta-llama-Llama-3.2-3B-Instruct", "llama3", "llama3", 1),
    ("meta-llama-Llama-3.3-70B-Instruct", "llama3", "llama3", 1),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral", "mistral", 2),
]
# no tool syntax, or one not spoken yet (Mistral's later [TOOL_CALLS]name[ARGS]{...})
GENERIC = [
    "google-gemma-2-2b-it",
    "microsoft-Phi-3.5-mini-instruct",
    "Mistral-Small-3.2-24B-Instruct-2506",
    "unsloth-mistral-Devstral-Small-2507",
]
END = {"hermes": "<|im_end|>", "llama3": "<|eot_id|>", "mistral": "</s>"}
TOOLS = [ADD, ANY_CITY_WEATHER]
CALLS = [("add", {"a": 2, "b": 40}), ("get_weather", {"city": "Zürich"})]
ASK = [{"role": "user", "content": "What is 2 plus 40, and the weather in Zürich?"}]


def _template(llama_cpp, name: str) -> str:
    return (llama_cpp.src / "models" / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def family_tokenizers(llama_cpp, tmp_path_factory):
    """family -> a folder with the family's real tokenizer files (no chat template)."""
    root = tmp_path_factory.mktemp("tokenizers")
    folders = {}
    for family in sorted({t[2] for t in TEMPLATES}):
        folders[family] = root / family
        folders[family].mkdir()
        write_tokenizer(family, folders[family], llama_cpp)
    return folders


def _tokenizer(family_tokenizers, llama_cpp, template: str, family: str, tmp_path) -> Tokenizer:
    folder = tmp_path / "tok"
    shutil.copytree(family_tokenizers[family], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(_template(llama_cpp, template), encoding="utf-8")
    return Tokenizer.from_folder(folder)


def _assistant(calls) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"call{k}abcd", "type": "function", "function": {"name": n, "arguments": a}}
            for k, (n, a) in enumerate(calls)
        ],
    }


@pytest.mark.parametrize("template", GENERIC)
def test_templates_without_a_tool_syntax_get_the_envelope(llama_cpp, template):
    assert detect(_template(llama_cpp, template)) is None


@pytest.mark.parametrize("template, name, family, count", TEMPLATES, ids=[t[0] for t in TEMPLATES])
def test_the_template_s_own_calls_match_our_grammar_and_parse_back(
    llama_cpp, family_tokenizers, tmp_path, template, name, family, count
):
    tok = _tokenizer(family_tokenizers, llama_cpp, template, family, tmp_path)
    assert detect(tok.chat_template) == name
    native = NativeFormat(name, tok)
    calls = CALLS[:count]
    asked = tok.render_chat(ASK, tools=TOOLS)
    assert all(t["function"]["name"] in asked for t in TOOLS), "the template lists the tools"
    said = tok.render_chat([*ASK, _assistant(calls)], tools=TOOLS, add_generation_prompt=False)
    assert said.startswith(asked)
    written = said[len(asked) :]
    written = written[: written.index(END[name])]  # what the model writes before its turn ends
    # read back: all at once, and as a stream in pieces
    stream = EnvelopeStream(native.read)
    stream.feed(written)
    content, out, finish = stream.message("stop")
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in out]
    assert got == calls and content is None and finish == "tool_calls"
    rng, stream, deltas, at = random.Random(0), EnvelopeStream(native.read), [], 0
    while at < len(written):
        at = min(len(written), at + rng.randint(1, 5))
        deltas += stream.feed(written[:at])
    assert not any("content" in d for d in deltas), "no text of a call is content"
    assembled: dict[int, list[str]] = {}
    for d in deltas:
        for part in d["tool_calls"]:
            entry = assembled.setdefault(part["index"], ["", ""])
            entry[0] += part["function"].get("name", "")
            entry[1] += part["function"].get("arguments", "")
    assert [(n, json.loads(a)) for n, a in assembled.values()] == calls
    # the grammar of tool_choice "required" accepts the template's text, token by token
    tools = [
        {"name": t["function"]["name"], "parameters": t["function"]["parameters"]} for t in TOOLS
    ]
    grammar = native.grammar(tools, allow_response=False, parallel=True)
    vocab = GrammarVocabulary(tok, tok.vocab_size, [tok.eos_token_id])
    matcher = vocab.matcher(grammar)
    for token in tok.encode(written, add_special_tokens=False):
        assert matcher.consume(token), f"the grammar refused {tok.decode([token])!r} in {written!r}"
    assert matcher._inner.is_accepting(), "the calls are a whole answer"
    # and with "auto" too, where plain text is allowed beside calls
    auto = vocab.matcher(native.grammar(tools, allow_response=True, parallel=True))
    assert all(auto.consume(t) for t in tok.encode(written, add_special_tokens=False))
    text = vocab.matcher(native.grammar(tools, allow_response=True, parallel=True))
    assert all(text.consume(t) for t in tok.encode("It is sunny.", add_special_tokens=False))


@pytest.mark.parametrize("template, name, family, count", TEMPLATES[:1] + TEMPLATES[-1:])
def test_earlier_calls_and_results_go_back_in_the_template_s_words(
    llama_cpp, family_tokenizers, tmp_path, template, name, family, count
):
    from onnxsample.serve.schemas import ChatRequest

    tok = _tokenizer(family_tokenizers, llama_cpp, template, family, tmp_path)
    native = NativeFormat(name, tok)
    body = ChatRequest.model_validate(
        {
            "messages": [
                *ASK,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_0123456789abcdef01234567",
                            "type": "function",
                            "function": {"name": "add", "arguments": '{"a": 2, "b": 40}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_0123456789abcdef01234567", "content": "42"},
            ],
            "tools": TOOLS,
        }
    )
    messages = native.messages(body)
    text = tok.render_chat(messages, tools=TOOLS)
    assert "42" in text and '"a": 2, "b": 40' in text
    if name == "mistral":  # its template takes 9-character ids: the same one in call and result
        short = native.call_id("call_0123456789abcdef01234567")
        assert len(short) == 9 and text.count(short) == 2


# ---- through the server ---------------------------------------------------------------------

SERVED = [
    ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
]


@pytest.fixture(scope="module", params=SERVED, ids=[s[1] for s in SERVED])
def native_client(request, llama_cpp, tiny_gqa_export, tmp_path_factory):
    """The tiny model served with a real template of each native format (its tokenizer is
    SmolLM2's: the format is in the template's text)."""
    import openai
    from _http import served

    from onnxsample.composer import compose

    template, name = request.param
    folder = tmp_path_factory.mktemp(f"served-{name}")
    for path in tiny_gqa_export.output.iterdir():
        if path.suffix == ".json":
            shutil.copy(path, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(_template(llama_cpp, template), encoding="utf-8")
    model = compose(
        tiny_gqa_export.output, None, folder / "model.onnx", max_slots=2, allowed_tokens=True
    )
    with served(model, "--threads", "1", "--served-model-name", "tiny") as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        yield name, openai.OpenAI(base_url=url, api_key="none", max_retries=0)


def _ask(client, **kwargs):
    return client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Weather in Paris for two days?"}],
        tools=[WEATHER, TIME],
        max_tokens=64,
        temperature=0,
        parallel_tool_calls=False,
        **kwargs,
    )


def _valid(name: str, arguments: dict) -> bool:
    if name == "get_weather":
        return arguments["city"] in ("Paris", "Oslo") and 1 <= arguments["days"] <= 7
    return name == "get_time" and arguments["zone"] in ("UTC", "CET")


def test_a_required_call_in_the_model_s_own_format_streamed_and_not(native_client):
    _, client = native_client
    done = _ask(client, tool_choice="required")
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert _valid(call.function.name, json.loads(call.function.arguments))
    [streamed] = streamed_calls(_ask(client, tool_choice="required", stream=True))
    assert streamed["name"] == call.function.name
    assert json.loads(streamed["arguments"]) == json.loads(call.function.arguments)
    named = {"type": "function", "function": {"name": "get_time"}}
    [timed] = _ask(client, tool_choice=named).choices[0].message.tool_calls
    assert timed.function.name == "get_time" and _valid(
        "get_time", json.loads(timed.function.arguments)
    )


def test_a_tool_result_goes_back_and_the_conversation_goes_on(native_client):
    _, client = native_client
    first = _ask(client, tool_choice="required").choices[0].message
    call = first.tool_calls[0]
    turns = [
        {"role": "user", "content": "Weather in Paris for two days?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C."},
    ]
    done = client.chat.completions.create(
        model="tiny", messages=turns, tools=[WEATHER, TIME], max_tokens=16, temperature=0
    )
    choice = done.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.message.tool_calls:
        assert all(
            _valid(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls
        )
    else:
        assert isinstance(choice.message.content, str)
