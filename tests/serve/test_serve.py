"""`onnxsample serve` as clients meet it: real servers on 127.0.0.1 (the tiny model), the official
`openai` client, raw HTTP for what the client will not send, and every error in OpenAI's shape."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import shutil
import socket
import threading
import time
from pathlib import Path

import openai
import pytest
from _http import free_port, get, metric, post, served

from onnxsample.composer import compose

KEY = "sk-test-key"


@pytest.fixture(scope="module")
def models(tiny_gqa_export, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("serve")
    for path in tiny_gqa_export.output.iterdir():  # the tokenizer and configs beside the models
        if path.suffix in (".json", ".jinja"):
            shutil.copy(path, folder)
    options = {"top_logprobs": 3, "max_bias": 2, "prompt_logprobs": True}
    return {
        "four": compose(tiny_gqa_export.output, None, folder / "four.onnx", max_slots=4, **options),
        "two": compose(tiny_gqa_export.output, None, folder / "two.onnx", max_slots=2, **options),
        "drafts": compose(
            tiny_gqa_export.output, None, folder / "drafts.onnx", draft_tokens=4, **options
        ),
    }


@pytest.fixture(scope="module")
def port(models):
    with served(models["four"], "--threads", "1", "--served-model-name", "tiny") as server:
        yield server.port


@pytest.fixture(scope="module")
def client(port) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)


CHAT = [{"role": "user", "content": "Tell me about the sea."}]


def _chat(client, **kwargs):
    return client.chat.completions.create(model="tiny", messages=CHAT, **kwargs)


def test_chat_completion(client):
    done = _chat(client, max_tokens=8, seed=3)
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-")
    assert done.model == "tiny" and done.system_fingerprint.startswith("onnxsample-")
    [choice] = done.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = done.usage
    assert (
        usage.completion_tokens <= 8
        and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    )
    assert usage.prompt_tokens_details.cached_tokens >= 0
    assert done.model_extra["timings"]["predicted_n"] == usage.completion_tokens


def test_streamed_chat_equals_the_whole_answer(client):
    whole = _chat(client, max_tokens=12, seed=5, temperature=0.9)
    chunks = list(
        _chat(
            client,
            max_tokens=12,
            seed=5,
            temperature=0.9,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    )


@pytest.mark.parametrize(
    ("prompt", "choices"),
    [
        ("Once upon a time", 1),
        (["Once upon a time", "The weather is"], 2),
        ([9906, 1917], 1),
        ([[9906, 1917], [9906]], 2),
    ],
)
def test_completion_prompt_forms(client, prompt, choices):
    done = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, seed=1, n=1)
    assert done.object == "text_completion" and len(done.choices) == choices
    assert [c.index for c in done.choices] == list(range(choices))


def test_n_choices_are_reproducible_and_distinct(client):
    a = _chat(client, max_tokens=10, seed=11, n=2, temperature=1.0)
    b = _chat(client, max_tokens=10, seed=11, n=2, temperature=1.0)
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices]
    assert texts[0] != texts[1]
    one = _chat(client, max_tokens=10, seed=12, temperature=1.0)  # choice 1 is seed 11 + 1
    assert one.choices[0].message.content == texts[1]


def test_a_seeded_answer_does_not_depend_on_other_requests(client):
    alone = _chat(client, max_tokens=16, seed=77, temperature=0.8).choices[0].message.content
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        noise = [
            pool.submit(_chat, client, max_tokens=20, seed=i, temperature=1.0) for i in range(7)
        ]
        mine = pool.submit(_chat, client, max_tokens=16, seed=77, temperature=0.8)
        assert mine.result().choices[0].message.content == alone
        for f in noise:
            f.result()


def test_chat_logprobs(client):
    done = _chat(client, max_tokens=5, seed=2, logprobs=True, top_logprobs=3, temperature=0)
    content = done.choices[0].logprobs.content
    assert len(content) == done.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)  # greedy
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    text = b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace")
    assert text == done.choices[0].message.content


def test_echo_scores_the_prompt(client):
    prompt = "The cat sat on the mat"
    done = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=2, temperature=0
    )
    [choice] = done.choices
    assert choice.text == prompt and done.usage.completion_tokens == 0
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:]) and len(lp.top_logprobs[1]) == 2
    assert "".join(lp.tokens) == prompt and lp.text_offset[0] == 0
    more = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=3, echo=True, logprobs=1, temperature=0
    )
    assert more.choices[0].text.startswith(prompt)
    assert more.choices[0].logprobs.token_logprobs[: len(lp.tokens)] == pytest.approx(
        [None, *lp.token_logprobs[1:]], abs=1e-4
    )


@pytest.mark.parametrize("echo", [False, True])
def test_streamed_text_offsets_count_from_the_start_of_the_choice(client, echo):
    kw = dict(model="tiny", prompt="The cat sat on", max_tokens=8, logprobs=1, temperature=0)
    whole = client.completions.create(echo=echo, **kw).choices[0].logprobs
    offsets, tokens = [], []
    for part in client.completions.create(echo=echo, stream=True, **kw):
        if part.choices and part.choices[0].logprobs:
            offsets += part.choices[0].logprobs.text_offset
            tokens += part.choices[0].logprobs.tokens
    assert tokens == whole.tokens
    assert offsets == whole.text_offset


def test_stop_strings(client):
    full = client.completions.create(model="tiny", prompt="Once", max_tokens=20, temperature=0)
    text = full.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    for given in (stop, [stop, "\u2603never"]):
        done = client.completions.create(
            model="tiny", prompt="Once", max_tokens=20, temperature=0, stop=given
        )
        assert done.choices[0].text == text[: text.index(stop)]
        assert done.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("kwargs", "param", "message"),
    [
        ({"top_p": 1.5}, "top_p", "top_p must be in (0, 1], got 1.5"),
        ({"temperature": -1}, "temperature", "temperature must be finite and >= 0, got -1"),
        ({"seed": -4}, "seed", "seed must be an integer in [0, 2**64), got -4"),
        ({"max_tokens": 0}, "max_tokens", "max_tokens must be an integer >= 1, got 0"),
        ({"extra_body": {"top_k": -2}}, "top_k", "top_k must be an integer >= 0"),
        ({"logit_bias": {"99999999": 5}}, "logit_bias", "logit_bias token id must be in"),
        ({"top_logprobs": 3}, "top_logprobs", "top_logprobs needs logprobs=true"),
        ({"n": 0}, "n", "n must be in [1, 32], got 0"),
        ({"extra_body": {"temperature": "hot"}}, "temperature", "temperature"),
    ],
)
def test_invalid_values_are_400_naming_the_parameter(client, kwargs, param, message):
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, **{"max_tokens": 4, **kwargs})
    error = info.value.body
    assert error["param"] == param and message in error["message"], error
    assert info.value.status_code == 400 and "Traceback" not in error["message"]


def test_a_prompt_longer_than_the_context(client):
    with pytest.raises(openai.BadRequestError, match=r"\d+ tokens, which does not fit .* 512"):
        client.completions.create(model="tiny", prompt="word " * 600, max_tokens=2)


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


def test_tokenize_detokenize_models_metrics_and_the_page(port, client):
    code, data = post(port, "/tokenize", b'{"content": "Hello world"}')
    assert code == 200 and data["count"] == len(data["tokens"]) and data["max_model_len"] == 512
    code, back = post(port, "/detokenize", json.dumps({"tokens": data["tokens"]}).encode())
    assert code == 200 and back["prompt"] == "Hello world"
    assert post(port, "/detokenize", b'{"tokens": [-1]}')[0] == 400
    assert [m.id for m in client.models.list()] == ["tiny"]
    code, page = get(port, "/")
    assert code == 200 and b"<title>onnxsample chat</title>" in page
    code, text = get(port, "/metrics")
    for name in (
        "onnxsample_requests_running",
        "onnxsample_slots_busy",
        "onnxsample_generation_tokens_total",
        "onnxsample_time_to_first_token_seconds_bucket",
        "onnxsample_inter_token_latency_seconds_count",
        "onnxsample_requests_rejected_total",
    ):
        assert name.encode() in text, name


def _metric(port: int, name: str) -> float:
    return metric(get(port, "/metrics")[1].decode(), name)


def test_a_client_that_goes_away_frees_its_slot(port):
    body = json.dumps(
        {"model": "tiny", "prompt": "Once", "max_tokens": 400, "stream": True, "ignore_eos": True}
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    seen = b""
    while seen.count(b"data:") < 4:  # three tokens after the headers' first chunk
        seen += sock.recv(4096)
    assert _metric(port, "onnxsample_slots_busy") >= 1
    sock.close()
    deadline = time.monotonic() + 30
    while _metric(port, "onnxsample_slots_busy") > 0:
        assert time.monotonic() < deadline, "the slot stayed busy"
        time.sleep(0.1)


def test_64_concurrent_streams_each_get_their_own_answer(client):
    def ask(i: int, stream: bool) -> str:
        kwargs = {"max_tokens": 12, "seed": 1000 + i, "temperature": 0.9}
        if not stream:
            return _chat(client, **kwargs).choices[0].message.content
        return "".join(
            c.choices[0].delta.content or ""
            for c in _chat(client, stream=True, **kwargs)
            if c.choices
        )

    alone = [ask(i, stream=False) for i in range(64)]
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        together = list(pool.map(lambda i: ask(i, stream=True), range(64)))
    assert together == alone


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


def test_speculative_serving_gives_the_same_answers(models, client):
    """serve --speculative ngram: greedy and seeded answers as without it, drafts in /metrics."""
    prompt = "a b c a b c a b c a b c"
    asks = [dict(temperature=0), dict(temperature=0.9, seed=5, frequency_penalty=0.5)]

    def answers(c, model):
        return [
            c.completions.create(model=model, prompt=prompt, max_tokens=24, **kw).choices[0].text
            for kw in asks
        ]

    plain = answers(client, "tiny")
    with served(models["drafts"], "--threads", "1", "--speculative", "ngram") as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        fast = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        assert answers(fast, fast.models.list().data[0].id) == plain
        drafted = _metric(server.port, "onnxsample_spec_decode_draft_tokens_total")
        kept = _metric(server.port, "onnxsample_spec_decode_accepted_tokens_total")
    assert 0 < kept <= drafted


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
    import uvicorn

    from onnxsample.engine import Engine
    from onnxsample.serve import ServeSettings, create_app

    gate = threading.Event()

    def load() -> Engine:
        gate.wait(60)
        return Engine(models["two"], tokenizer=tiny_gqa_export.output, threads=1)

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(load, ServeSettings("tiny")), port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        code, body = get(port, "/health")
        assert code == 503 and json.loads(body)["error"]["message"] == "loading the model"
        status, data = post(port, "/v1/completions", b'{"prompt": "x"}')
        assert status == 503 and data["error"]["type"] == "service_unavailable"
        gate.set()
        while get(port, "/health")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        gate.set()
        server.should_exit = True
        thread.join(30)


def test_the_chat_page_streams_an_answer_in_chromium(port, chromium, tmp_path):
    """Type a question, watch streamed text appear, change the temperature, read the timings."""
    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium
    driver.get(f"http://127.0.0.1:{port}/")
    wait = WebDriverWait(driver, 60)
    wait.until(lambda d: d.find_element(By.ID, "model").text == "tiny")
    lengths = []

    def ask(question: str, answers: int) -> None:
        driver.find_element(By.ID, "input").send_keys(question)
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".message.assistant")) == answers)
        answer = driver.find_elements(By.CSS_SELECTOR, ".message.assistant")[-1]
        wait.until(lambda d: answer.text and lengths.append(len(answer.text)) is None)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".timings")) == answers)

    max_tokens = driver.find_element(By.ID, "max_tokens")
    max_tokens.clear()
    max_tokens.send_keys("48")
    ask("Tell me a story about the sea.", 1)
    temperature = driver.find_element(By.ID, "temperature")
    temperature.clear()
    temperature.send_keys("0")
    ask("And another one?", 2)
    timings = driver.find_elements(By.CSS_SELECTOR, ".timings")[-1].text
    assert "tok" in timings and "first token" in timings
    assert not driver.find_elements(By.CSS_SELECTOR, ".message.error")
    shot = tmp_path / "chat.png"
    driver.save_screenshot(str(shot))
    assert len(set(Image.open(shot).convert("L").getdata())) > 8


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


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
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
