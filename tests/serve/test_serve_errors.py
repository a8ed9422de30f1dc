"""`onnxsample serve`'s errors and limits: every error in OpenAI's shape (invalid values naming the
parameter, a prompt over the context, an unknown model, raw bodies the client will not send, and
generated bodies that must never get a 5xx), the API key, a full queue (429), health before the model
is loaded (503), and a client that goes away freeing its slot."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import openai
import pytest
from _http import CHAT, chat, get, in_process, metric_value, post, served

KEY = "sk-test-key"
_HI = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _nested(depth: int, leaf) -> list:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


@pytest.mark.parametrize(
    ("kwargs", "param", "message"),
    [
        ({"top_p": 1.5}, "top_p", "top_p must be in (0, 1], got 1.5"),
        ({"temperature": -1}, "temperature", "temperature must be a finite float32 >= 0, got -1"),
        ({"seed": -4}, "seed", "seed must be an integer in [0, 2**64), got -4"),
        ({"max_tokens": 0}, "max_tokens", "max_tokens must be an integer >= 1, got 0"),
        ({"extra_body": {"top_k": -2}}, "top_k", "top_k must be an integer >= 0"),
        ({"logit_bias": {"99999999": 5}}, "logit_bias", "logit_bias token id must be in"),
        ({"top_logprobs": 3}, "top_logprobs", "top_logprobs needs logprobs=true"),
        ({"n": 0}, "n", "n must be in [1, 32], got 0"),
        ({"extra_body": {"temperature": "hot"}}, "temperature", "temperature"),
        ({"extra_body": {"min_tokens": 5}}, "min_tokens", "must be at most the new tokens asked"),
        ({"stop": ""}, "stop", "stop must not contain an empty string"),  # vLLM's 400
        ({"stop": ["x", ""]}, "stop", "stop must not contain an empty string"),
    ],
)
def test_invalid_values_are_400_naming_the_parameter(client, kwargs, param, message):
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, **{"max_tokens": 4, **kwargs})
    error = info.value.body
    assert error["param"] == param and message in error["message"], error
    assert info.value.status_code == 400 and "Traceback" not in error["message"]


@pytest.mark.parametrize("route", ["completions", "chat", "native"])
def test_a_prompt_longer_than_the_context(client, port, route):
    """OpenAI's code and llama-server's type and numbers (its web UI reads the type), on every
    route."""
    long = "word " * 600
    if route == "native":
        status, body = post(port, "/completion", json.dumps({"prompt": long}).encode())
        assert status == 400, body
        error = body["error"]
    else:
        with pytest.raises(openai.BadRequestError, match=r"\d+ tokens, which does not fit") as info:
            if route == "completions":
                client.completions.create(model="tiny", prompt=long, max_tokens=2)
            else:
                messages = [{"role": "user", "content": long}]
                client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
        error = info.value.body
    assert error["type"] == "exceed_context_size_error", error
    assert error["code"] == "context_length_exceeded", error
    assert error["n_ctx"] == 512 and error["n_prompt_tokens"] > 512, error


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError, match="'gpt-9' does not exist"):
        client.chat.completions.create(model="gpt-9", messages=CHAT)


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"messages": "hi"}', 400, "messages"),
        (b'{"messages": []}', 400, "messages"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "role"),
        (b'{"messages": [{"role": "user"}]}', 400, "messages.0: a message needs content or"),
        (b'{"messages": [{"role": "user", "content": [{"type": "text"}]}]}', 400, "needs its text"),
        # OpenAI's booleans, strictly; a boolean is no number
        (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', 400, "stream"),
        (b'{"messages": [{"role": "user", "content": "x"}], "logprobs": 1}', 400, "logprobs"),
        (b'{"messages": [{"role": "user", "content": "x"}], "top_p": true}', 400, "top_p"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "stream_options": {}}',
            400,
            "stream_options: only allowed with stream=true",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "stream": true, "stream_options": '
            b'{"include_usage": true, "continuous_usage_stats": true}}',
            400,
            "stream_options.continuous_usage_stats: not supported",
        ),
        # a union's members are named by what they take, not by pydantic's tags
        (
            b'{"messages": [{"role": "user", "content": 5}]}',
            400,
            "messages.0.content: Input should be a valid string; or Input should be a valid list",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "x"}}',
            400,
            "tool_choice: Input should be 'none', 'auto' or 'required'; or type: Input should",
        ),
        (b"", 400, "the request body is empty: send a JSON object"),
        (b"[1]", 400, "the request body must be a JSON object"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}' + b" " * 5_000_000,
            413,
            "over",
        ),
    ],
)
def test_raw_bodies_get_openai_errors(port, body, status, fragment):
    code, data = post(port, "/v1/chat/completions", body)
    assert code == status and fragment in data["error"]["message"], data
    assert set(data["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**_HI, "n": None, "stream": None, "logprobs": None}),
        # a message's content null (llama-server's and vLLM's), a number as its text (vLLM's)
        (
            "/v1/chat/completions",
            {**_HI, "messages": [{"role": "user", "content": None}], "temperature": "0.5"},
        ),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "n": None, "echo": None}),
        ("/completion", {"prompt": "hi", "n_predict": 2, "stream": None, "min_tokens": None}),
    ],
)
def test_null_is_the_fields_default(port, path, body):
    """As OpenAI's API reads it (and the openai client sends `logprobs=None` as null)."""
    code, data = post(port, path, json.dumps(body).encode())
    assert code == 200, data
    assert len(data["choices"]) == 1 if "choices" in data else data["content"] is not None


def test_a_client_that_goes_away_frees_its_slot(port):
    body = json.dumps(
        {"model": "tiny", "prompt": "Once", "max_tokens": 400, "stream": True, "ignore_eos": True}
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    seen = b""
    while seen.count(b"data:") < 4:  # three tokens after the headers' first chunk
        seen += sock.recv(4096)
    assert metric_value(port, "onnxsample_slots_busy") >= 1
    sock.close()
    deadline = time.monotonic() + 30
    while metric_value(port, "onnxsample_slots_busy") > 0:
        assert time.monotonic() < deadline, "the slot stayed busy"
        time.sleep(0.1)


def test_api_key(models):
    with served(models["two"], "--threads", "1", "--api-key", KEY) as server:
        p = server.port
        url = f"http://127.0.0.1:{p}/v1"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        ok = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        assert ok.chat.completions.create(
            model=ok.models.list().data[0].id, messages=CHAT, max_tokens=2
        ).choices
        assert get(p, "/health")[0] == 200  # health stays open


def test_a_full_queue_is_429_with_retry_after(models):
    with served(models["two"], "--threads", "1", "--max-queue", "0") as server:
        p = server.port
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{p}/v1", api_key="x", max_retries=0)
        long = {"max_tokens": 400, "extra_body": {"ignore_eos": True}}
        streams = [
            client.completions.create(
                model=client.models.list().data[0].id, prompt="Once", stream=True, **long
            )
            for _ in range(2)
        ]
        for s in streams:
            next(iter(s))
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(
                model=client.models.list().data[0].id, prompt="x", max_tokens=2
            )
        assert info.value.response.headers["retry-after"] == "1"
        for s in streams:
            s.close()


def test_health_is_503_until_the_model_is_loaded(models, tiny_gqa_export):
    """An in-process server whose engine loads only when the test says so."""
    from onnxsample.engine import Engine
    from onnxsample.serve import ServeSettings, create_app

    gate = threading.Event()

    def load() -> Engine:
        gate.wait(60)
        return Engine(models["two"], tokenizer=tiny_gqa_export.output, threads=1)

    try:
        with in_process(create_app(load, ServeSettings("tiny"))) as (port, _):
            code, body = get(port, "/health")
            assert code == 503 and json.loads(body)["error"]["message"] == "loading the model"
            status, data = post(port, "/v1/completions", b'{"prompt": "x"}')
            assert status == 503 and data["error"]["type"] == "service_unavailable"
            gate.set()
            deadline = time.monotonic() + 30
            while get(port, "/health")[0] != 200:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        gate.set()


FUZZ_FIELDS = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "n", "seed", "stop", "stream", "stream_options", "logprobs", "top_logprobs", "echo",
    "logit_bias", "presence_penalty", "frequency_penalty", "user", "top_k", "min_p", "typical_p",
    "repetition_penalty", "ignore_eos", "min_tokens", "unknown_field",
]  # fmt: skip


def _fuzz_bodies():
    from hypothesis import strategies as st

    scalar = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=20),
    )
    value = st.recursive(
        scalar,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=8,
    )
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "bot"]), "content": value}
    )
    plausible = {
        "messages": st.lists(message, min_size=0, max_size=3) | value,
        "prompt": st.text(max_size=30) | st.lists(st.integers(-5, 60000), max_size=5) | value,
        "max_tokens": st.integers(-2, 40) | value,
        "n": st.integers(-1, 3) | value,
    }
    return st.dictionaries(
        st.sampled_from(FUZZ_FIELDS),
        st.deferred(lambda: value),
        max_size=8,
    ).flatmap(
        lambda body: st.fixed_dictionaries(
            {k: plausible.get(k, st.just(v)) for k, v in body.items()}
        )
    )


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/apply-template"])
def test_no_generated_body_gets_a_5xx(port, path):
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_fuzz_bodies())
    def check(body):
        body.setdefault("max_tokens", 3) if isinstance(body, dict) else None
        data = json.dumps(body, allow_nan=True).encode()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request("POST", path, data, {"Content-Type": "application/json"})
            response = conn.getresponse()
            text = response.read()
        finally:
            conn.close()
        assert response.status < 500, (body, text)
        if response.status >= 400:
            assert set(json.loads(text)["error"]) == {"message", "type", "param", "code"}
            assert b"Traceback" not in text

    check()


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "ab\ud800c", "max_tokens": 2}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages"),
        ("/tokenize", {"content": "x\udfff"}, "content"),
        ("/apply-template", {"messages": [{"role": "user", "content": "\udfff"}]}, "messages"),
        ("/v1/chat/completions", {**_HI, "guided_regex": "\ud800"}, "guided_regex"),
        (
            "/v1/completions",
            {"prompt": "hi", "structured_outputs": {"regex": "a\ud800"}},
            "structured_outputs",
        ),
        ("/completion", {"prompt": "hi", "n_predict": 2, "stop": ["\ud800"]}, "stop"),
        (
            "/completion",
            {"prompt": "hi", "n_predict": 2, "stream": True, "stop": ["\ud800"]},
            "stop",
        ),
        ("/v1/chat/completions", {**_HI, "metadata": {"k": ["\udfff"]}}, None),
        ("/v1/chat/completions", {**_HI, "metadata": _nested(900, "\ud800")}, None),
        ("/completion", b'{"prompt": "hi", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", None),
        (
            "/v1/chat/completions",
            {
                **_HI,
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "object", "$defs": ["x"]}},
                    }
                ],
            },
            "tools",
        ),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "top_k": 2**63}, None),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "top_k": 2**70}, None),
    ],
    ids=[
        "surrogate-prompt",
        "surrogate-chat",
        "surrogate-tokenize",
        "surrogate-apply-template",
        "surrogate-regex",
        "surrogate-structured-outputs",
        "surrogate-stop-native",
        "surrogate-stop-native-streamed",
        "surrogate-in-an-extra",
        "surrogate-deep-in-an-extra",
        "nested-too-deeply-native",
        "tool-defs-not-an-object",
        "top_k-2**63",
        "top_k-2**70",
    ],
)
def test_inputs_that_once_reached_a_500(port, path, body, param):
    """A lone surrogate is a client's bad input (400 naming it); a top_k past int64 keeps every
    token, as any top_k past the vocabulary does (200). A surrogate in a field the server does not
    know is refused too: no string the answer could echo may be other than text. A body nested
    deeper than the JSON parser goes, and a tool whose $defs is not an object, are 400s too."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()  # "\ud800": an escape
    code, data = post(port, path, raw)
    if isinstance(body, dict) and "top_k" in body:
        assert code == 200, data
        return
    assert code == 400 and data["error"]["param"] == param, data
    if isinstance(body, bytes):
        assert "nested too deeply" in data["error"]["message"], data
    else:
        why = "$defs must be an object" if "tools" in body else "lone surrogate"
        assert why in data["error"]["message"], data


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/chat/completions"])
def test_a_body_sent_as_another_content_type_is_told_so(port, path):
    """The OpenAI routes read JSON bodies (llama-server's read any body as JSON), their aliases
    without /v1 too."""
    body = json.dumps({"messages": CHAT, "max_tokens": 2}).encode()
    code, data = post(port, path, body, {"Content-Type": "text/plain"})
    assert code == 400, data
    assert data["error"]["message"] == (
        "the request body must be a JSON object (Content-Type: application/json; got 'text/plain')"
    )


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embeddings", "/embedding"])
def test_embeddings_are_501_saying_so(port, path):
    code, data = post(port, path, json.dumps({"input": "Hi"}).encode())
    assert code == 501 and "does not compute embeddings" in data["error"]["message"], data
    assert data["error"]["type"] == "not_supported_error"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": ["x"] * 300}, "prompt"),
        ("/v1/completions", {"prompt": ["x"] * 100, "n": 3}, "n"),
        ("/completion", {"prompt": ["x"] * 300}, "prompt"),
        ("/completion", {"prompt": ["x"] * 100, "n": 3}, "n"),
    ],
    ids=["prompts", "prompts-times-n", "native-prompts", "native-prompts-times-n"],
)
def test_a_request_that_can_never_fit_is_400_not_429(port, path, body, param):
    """More choices than the slots and the queue hold together (the test server: 4 slots,
    max_queue 256): no retry can help, and the error names the field that asked for them."""
    code, data = post(port, path, json.dumps({**body, "max_tokens": 1}).encode())
    assert code == 400 and "can never be queued" in data["error"]["message"], data
    assert data["error"]["param"] == param, data


def test_a_huge_prompt_is_refused_before_it_is_tokenised(port):
    """4 MB of text against a 512-token context: a length check, not seconds of tokenising."""
    body = json.dumps({"prompt": "word " * 800_000, "max_tokens": 2}).encode()
    code, data = post(port, "/v1/completions", body)
    assert code == 400 and "characters" in data["error"]["message"], data
    assert data["error"]["param"] == "prompt"


def test_tokenising_never_runs_on_the_event_loop(models, tiny_gqa_export):
    """While one request's prompt is being tokenised (held here until the test lets it go),
    the server answers others: tokenising runs in a worker thread, not on the event loop."""
    from onnxsample.engine import Engine
    from onnxsample.serve import ServeSettings, create_app

    engine = Engine(models["two"], tokenizer=tiny_gqa_export.output, threads=1)
    entered, release, threads = threading.Event(), threading.Event(), []
    encode = engine.tokenizer.encode

    def held(text, **kwargs):
        threads.append(threading.current_thread())
        entered.set()
        release.wait(60)
        return encode(text, **kwargs)

    engine.tokenizer.encode = held
    try:
        with in_process(create_app(engine, ServeSettings("tiny"))) as (port, serving):
            body = json.dumps({"prompt": "Once upon a time", "max_tokens": 2}).encode()
            slow = threading.Thread(target=post, args=(port, "/v1/completions", body), daemon=True)
            slow.start()
            assert entered.wait(60)
            assert get(port, "/health")[0] == 200  # answered while the prompt is held
            assert slow.is_alive()
            release.set()
            slow.join(60)
            assert threads and serving not in threads
    finally:
        release.set()


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (None, "this model has no chat template"),
        ("{{ raise_exception('no system role') }}", "refused the messages: no system role"),
    ],
    ids=["no-template", "template-refuses"],
)
def test_a_chat_the_template_cannot_render_is_400_naming_the_messages(
    models, tiny_gqa_export, tmp_path, template, message
):
    """A model without a chat template (a base model's GGUF) or a template that refuses the chat:
    400 on `messages`, and the message says what to do."""
    import shutil

    from onnxsample.engine import Engine
    from onnxsample.serve import ServeSettings, create_app

    folder = tmp_path / "no-template"
    folder.mkdir()
    for path in tiny_gqa_export.output.glob("*.json"):
        shutil.copy(path, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with Engine(models["two"], tokenizer=folder, threads=1, chat_template=template) as engine:
        assert engine.tokenizer.chat_template == template
        with in_process(create_app(engine, ServeSettings("tiny"))) as (port, _):
            body = {"model": "tiny", "messages": CHAT, "max_tokens": 2}
            code, data = post(port, "/v1/chat/completions", json.dumps(body).encode())
            plain = {"model": "tiny", "prompt": "Hi", "max_tokens": 2}
            assert post(port, "/v1/completions", json.dumps(plain).encode())[0] == 200
    assert code == 400 and message in data["error"]["message"], data
    assert data["error"]["param"] == "messages"
    if template is None:
        assert "--chat-template" in data["error"]["message"]


# Fields of OpenAI, vLLM and llama-server that would change the answer: (field, a value that asks
# for what this server does not do, its neutral value as clients send it by default).
PEER_FIELDS = [
    ("best_of", 3, 1),
    ("functions", [{"name": "f", "parameters": {}}], None),
    ("modalities", ["text", "audio"], ["text"]),
    ("use_beam_search", True, False),
    ("length_penalty", 0.5, 1.0),
    ("stop_token_ids", [42], []),
    ("bad_words", ["cat"], None),
    ("allowed_token_ids", [1, 2], None),
    ("include_stop_str_in_output", True, False),
    ("skip_special_tokens", False, True),
    ("truncate_prompt_tokens", 8, None),
    ("prompt_logprobs", 1, None),
    ("return_token_ids", True, False),
    ("structural_tag", '{"type": "structural_tag"}', None),
    ("vllm_xargs", {"k": 1}, None),
    ("prompt_embeds", "AAAA", None),
    ("priority", 5, 0),  # vLLM's first-come scheduler refuses it too
    ("mirostat", 2, 0),
    ("dry_multiplier", 0.8, 0),
    ("xtc_probability", 0.5, 0),
    ("top_n_sigma", 1.0, -1),
    ("n_probs", 5, 0),
    ("min_keep", 5, 1),
    ("return_tokens", True, False),
    ("response_fields", ["content"], None),
    ("lora", [{"id": 0, "scale": 1.0}], []),
    ("grammar_lazy", True, False),
    ("grammar_triggers", [{"type": 0, "value": "{"}], None),
    ("reasoning_budget_tokens", 100, -1),
    ("adaptive_target", 0.5, -1),
    ("web_search_options", {}, None),  # OpenAI searches the web with {} too
]
# /v1/completions' own: its prompt's special tokens, and logprobs in OpenAI's lists only.
COMPLETION_FIELDS = [
    ("add_special_tokens", False, True),
    ("post_sampling_probs", True, False),
    ("suffix", "return x", None),
    ("max_completion_tokens", 2, None),  # a chat's name: a text completion's is max_tokens
]
TEMPLATE_FIELD = ("chat_template", "{{ messages }}", None)
CHAT_FIELDS = [("add_special_tokens", True, False), ("echo", True, False), TEMPLATE_FIELD]


# /tokenize: llama-server's text option, and a chat's (vLLM's) as on the chat route.
TOKENIZE_FIELDS: list = []  # parse_special is read (test_native_llama_server.py)
TOKENIZE_CHAT_FIELDS = [
    CHAT_FIELDS[0], ("add_special", True, False), TEMPLATE_FIELD, ("parse_special", False, True)
]  # fmt: skip
# /apply-template: what would change the chat's text (its sampling fields are left alone).
APPLY_TEMPLATE_FIELDS = [TEMPLATE_FIELD]


@pytest.mark.parametrize(("path", "field", "value"), [
    *[("/v1/chat/completions", f, v) for f, v, _ in PEER_FIELDS + CHAT_FIELDS],
    *[("/v1/completions", f, v) for f, v, _ in [*PEER_FIELDS, *COMPLETION_FIELDS]],
    *[("/tokenize", f, v) for f, v, _ in TOKENIZE_FIELDS],
    *[("/tokenize chat", f, v) for f, v, _ in TOKENIZE_CHAT_FIELDS],
    *[("/apply-template chat", f, v) for f, v, _ in APPLY_TEMPLATE_FIELDS],
])  # fmt: skip
def test_a_peers_field_that_would_change_the_answer_is_refused_by_name(port, path, field, value):
    """Never ignored: a vLLM or llama-server client would get another answer than it asked for."""
    body = {"messages": CHAT} if "chat" in path else {"prompt": "Hi"}
    body |= {} if path.startswith("/tokenize") else {"max_tokens": 2}
    path = path.split()[0]
    code, data = post(port, path, json.dumps({**body, field: value}).encode())
    assert code == 400 and data["error"]["param"] == field, data
    assert data["error"]["message"].startswith(f"{field} is not supported ("), data


@pytest.mark.parametrize(("body", "param"), [
    ({"content": "Hi", "prompt": "Hi"}, "prompt"),
    ({"messages": CHAT, "content": "Hi"}, "content"),
    ({"content": "Hi", "chat_template_kwargs": {"x": 1}}, "chat_template_kwargs"),
    ({"prompt": "Hi", "tools": [{"type": "function"}]}, "tools"),
    ({"content": "Hi", "reasoning_effort": "high"}, "reasoning_effort"),
])  # fmt: skip
def test_tokenize_refuses_what_its_prompt_would_leave_unread(port, body, param):
    """Two prompts, or a chat's fields with text: one of them would be ignored."""
    code, data = post(port, "/tokenize", json.dumps(body).encode())
    assert code == 400 and data["error"]["param"] == param, data


def test_the_peers_fields_at_their_neutral_values_are_accepted(port):
    """What clients send by default (vLLM's skip_special_tokens true, llama-server's mirostat 0)
    changes nothing, so it passes, as do fields this server does not know."""
    neutral = {f: n for f, _, n in PEER_FIELDS} | {"store": False, "metadata": {"k": "v"}}
    chat = {"messages": CHAT, **neutral, **{f: n for f, _, n in CHAT_FIELDS}}
    text = {"prompt": "Hi", **neutral, **{f: n for f, _, n in COMPLETION_FIELDS}}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", text)):
        code, data = post(port, path, json.dumps({**body, "max_tokens": 2}).encode())
        assert code == 200, data
    tokenize_text = {"content": "Hi", **{f: n for f, _, n in TOKENIZE_FIELDS}}
    tokenize_chat = {"messages": CHAT, **{f: n for f, _, n in TOKENIZE_CHAT_FIELDS}}
    for body in (tokenize_text, tokenize_chat):
        code, data = post(port, "/tokenize", json.dumps(body).encode())
        assert code == 200, data


# llama-server's fields read with the request's own: (fields, the field refused, None when they
# change nothing here, or LAST when they give temperature_last's answer). The web UI sends
# repeat_last_n 64 and its sampler order with every request.
WEB_UI_ORDER = ["top_k", "typ_p", "top_p", "min_p", "temperature"]
LAST = "temperature_last"
BY_REQUEST = [
    ({"repeat_last_n": 64}, None),  # no penalty on: the window changes nothing
    ({"repeat_last_n": 0, "repeat_penalty": 1.0, "presence_penalty": 0}, None),
    ({"repeat_last_n": -1, "repetition_penalty": 1.3}, None),  # the whole sequence, as here
    ({"repeat_last_n": 512, "repetition_penalty": 1.3}, None),  # the context: the whole too
    ({"repeat_last_n": 511, "repetition_penalty": 1.3}, "repeat_last_n"),
    ({"repeat_last_n": 64, "presence_penalty": 0.5}, "repeat_last_n"),
    ({"penalty_last_n": 0, "repetition_penalty": 1.3}, "penalty_last_n"),
    ({"samplers": WEB_UI_ORDER, "top_k": 40}, None),  # temperature 1: its place changes nothing
    ({"samplers": "kypmt", "top_k": 3, "temperature": 0.7}, None),  # top-k commutes with it
    ({"samplers": WEB_UI_ORDER, "top_k": 40, "top_p": 0.9, "temperature": 0}, None),  # greedy
    (
        {"samplers": ["TEMP", "Top-K", "nucleus"], "top_k": 5, "top_p": 0.9, "temperature": 0.5},
        None,
    ),
    ({"samplers": ["top_k", "bogus", "temperature"], "top_k": 4, "temperature": 0.5}, None),
    ({"samplers": WEB_UI_ORDER, "top_k": 40, "min_p": 0.05, "temperature": 0.8}, LAST),
    (  # the web UI's defaults
        {"samplers": WEB_UI_ORDER, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 0.8},
        LAST,
    ),
    ({"samplers": "kpmt", "top_p": 0.9, "temperature": 0.7, "temperature_last": True}, LAST),
    ({"samplers": "kpmt", "top_p": 0.9, "temperature": 0.7, "temperature_last": False}, "samplers"),
    ({"samplers": "tkp", "top_p": 0.9, "temperature": 0.7, "temperature_last": True}, "samplers"),
    ({"samplers": "kptm", "top_p": 0.9, "min_p": 0.1, "temperature": 0.7}, "samplers"),
    ({"samplers": ["top_p", "top_k"], "top_p": 0.9, "top_k": 40}, "samplers"),
    ({"samplers": ["top_k", "top_k"], "top_k": 40}, "samplers"),
    ({"samplers": ["top_k", "adaptive_p"]}, "samplers"),
    ({"samplers": 3}, "samplers"),
    ({"n_cmpl": 2, "n": 2}, None),
    ({"n_cmpl": 2}, "n_cmpl"),
    ({"best_of": 2, "n": 2}, None),  # all n of n samples: vLLM's answer
    ({"best_of": 2}, "best_of"),
    ({"repeat_penalty": 1.0}, None),
    ({"repeat_penalty": 1.3}, "repeat_penalty"),  # llama-server's window of 64 by default
    ({"repeat_penalty": 1.3, "repeat_last_n": 64}, "repeat_penalty"),
]


@pytest.mark.parametrize(("fields", "refused"), BY_REQUEST)
def test_llama_servers_order_and_window_are_read_with_the_request(port, fields, refused):
    """Honoured where they give the answer this server gives without them (the same text for the
    same seed), refused by name where llama-server's answer would differ."""
    body = {"prompt": "Once upon a time", "max_tokens": 6, "seed": 7, **fields}
    code, data = post(port, "/v1/completions", json.dumps(body).encode())
    if refused not in (None, LAST):
        assert code == 400 and data["error"]["param"] == refused, data
        assert data["error"]["message"].startswith(f"{refused} is not supported ("), data
        return
    assert code == 200, data
    llama = ("samplers", "repeat_last_n", "n_cmpl", "repeat_penalty", "best_of")
    plain = {k: v for k, v in body.items() if k not in llama}
    if refused == LAST:
        plain[LAST] = True
    code, alone = post(port, "/v1/completions", json.dumps(plain).encode())
    assert code == 200 and [c["text"] for c in data["choices"]] == [
        c["text"] for c in alone["choices"]
    ]


@pytest.mark.parametrize(("fields", "message"), [
    ({"repeat_penalty": 1.3}, "send repeat_last_n -1 or at least the context, 512, or "),
    ({"repeat_last_n": 64, "presence_penalty": 0.5}, "send -1 or at least the context, 512)"),
])  # fmt: skip
def test_a_refused_window_says_what_gives_the_same_answer_on_both_servers(port, fields, message):
    """A window as long as the context counts whole sequences here, and llama-server (which
    refuses -1 on its own routes' schema) takes it too: one request for both."""
    body = {"prompt": "Once upon a time", "max_tokens": 2, **fields}
    code, data = post(port, "/v1/completions", json.dumps(body).encode())
    assert code == 400 and message in data["error"]["message"], data


@pytest.mark.parametrize(("fields", "skipped"), [
    ({"samplers": ["temperature"], "top_k": 40, "temperature": 0.7}, ["top_k"]),
    ({"samplers": ["top_k"], "top_k": 3, "temperature": 0.5}, ["temperature"]),  # drawn at 1
    ({"samplers": [], "temperature": 0, "top_p": 0.5}, ["temperature", "top_p"]),  # llama.vim's
    ({"samplers": "kt", "top_k": 5, "temperature": 0.8, "repeat_penalty": 1.3},
     ["repeat_penalty"]),  # left out: neither its window nor its rule matters
])  # fmt: skip
def test_a_sampler_the_list_leaves_out_is_skipped_as_llama_server_skips_it(port, fields, skipped):
    """llama-server builds its chain from `samplers` alone: the same answer for the same seed as
    the request without the samplers it leaves out (a 400 refused llama.vim's warm-up)."""
    body = {"prompt": "Once upon a time", "max_tokens": 6, "seed": 7, **fields}
    code, data = post(port, "/v1/completions", json.dumps(body).encode())
    assert code == 200, data
    plain = {k: v for k, v in body.items() if k != "samplers" and k not in skipped}
    code, alone = post(port, "/v1/completions", json.dumps(plain).encode())
    assert code == 200 and data["choices"][0]["text"] == alone["choices"][0]["text"]


@pytest.mark.parametrize(("fields", "pair"), [
    # the temperature could go last; typical_p before top_p is what no order of ours gives
    ({"samplers": "kypmt", "typical_p": 0.9, "top_p": 0.95, "temperature": 0.7},
     "typical_p before top_p"),
    ({"samplers": "tkp", "top_p": 0.9, "temperature": 0.7, "temperature_last": True},
     "temperature before top_p"),
    ({"samplers": "tpym", "top_p": 0.9, "typical_p": 0.9, "min_p": 0.05, "temperature": 0.7},
     "typical_p before min_p"),  # the temperature first is this server's order already
])  # fmt: skip
def test_a_refused_order_names_the_pair_no_order_here_gives(port, fields, pair):
    body = {"prompt": "Once upon a time", "max_tokens": 2, **fields}
    code, data = post(port, "/v1/completions", json.dumps(body).encode())
    assert code == 400 and f"it runs {pair};" in data["error"]["message"], data


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_max_tokens_minus_one_is_llama_servers_no_limit(port, path):
    """llama.cpp's web UI sends -1 for "no limit": the answer runs to its end or the context's
    (past a text completion's default of 16 here), where any other value below 1 is a 400."""
    body = {"messages": CHAT} if "chat" in path else {"prompt": "Once upon a time"}
    code, data = post(
        port, path, json.dumps({**body, "max_tokens": -1, "ignore_eos": True}).encode()
    )
    assert code == 200, data
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["prompt_tokens"] + data["usage"]["completion_tokens"] == 512, data
    code, data = post(port, path, json.dumps({**body, "max_tokens": -2}).encode())
    assert code == 400 and data["error"]["param"] == "max_tokens", data


@pytest.mark.parametrize(("llama", "ours"), [
    ({"n_predict": 5}, {"max_tokens": 5}),
    ({"n_predict": -1}, {"max_tokens": -1}),
    ({"repeat_penalty": 1.5, "repeat_last_n": -1, "max_tokens": 12},
     {"repetition_penalty": 1.5, "max_tokens": 12}),
    ({"repeat_penalty": 1.5, "repeat_last_n": 4096, "max_tokens": 12},
     {"repetition_penalty": 1.5, "max_tokens": 12}),
    ({"repeat_penalty": 1.5, "penalty_last_n": -1, "max_tokens": 12, "temperature": 0.7,
      "samplers": ["penalties", "temperature"]},
     {"repetition_penalty": 1.5, "max_tokens": 12, "temperature": 0.7}),
])  # fmt: skip
def test_llama_servers_names_give_their_fields_answers(port, llama, ours):
    """n_predict is max_tokens; repeat_penalty over the whole sequence (llama-server's window -1,
    the prompt included) is repetition_penalty's rule: the same answers for the same seed."""
    base = {"prompt": "Once upon a time", "seed": 7, "ignore_eos": True}
    texts = []
    for fields in (llama, ours, {k: v for k, v in ours.items() if k != "repetition_penalty"}):
        code, data = post(port, "/v1/completions", json.dumps({**base, **fields}).encode())
        assert code == 200, data
        texts.append(data["choices"][0]["text"])
    assert texts[0] == texts[1]
    assert (texts[1] != texts[2]) == ("repetition_penalty" in ours)  # the penalty told


@pytest.mark.parametrize(("fields", "message"), [
    ({"n_predict": 6, "max_tokens": 5}, "n_predict is 6 but max_tokens is 5"),
    ({"messages": CHAT, "n_predict": 6, "max_completion_tokens": 5}, "max_completion_tokens is 5"),
    ({"n_predict": "six"}, "n_predict must be an integer"),
    ({"repeat_penalty": 1.2, "repetition_penalty": 1.1, "repeat_last_n": -1}, "send one"),
])  # fmt: skip
def test_a_llama_server_name_that_contradicts_its_field_is_refused(port, fields, message):
    path = "/v1/chat/completions" if "messages" in fields else "/v1/completions"
    body = {"prompt": "Hi"} if "messages" not in fields else {}
    code, data = post(port, path, json.dumps({**body, **fields}).encode())
    assert code == 400 and message in data["error"]["message"], data
    assert data["error"]["param"] == next(iter(k for k in fields if k != "messages")), data
