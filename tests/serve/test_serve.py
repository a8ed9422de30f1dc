"""`onnxsample serve` as clients meet it: a real server on 127.0.0.1 (the tiny model) and the
official `openai` client. Chat and text completions (streamed and whole, prompt forms, n choices,
seeds, logprobs, echo, stop strings), 64 concurrent streams, speculative serving, the other endpoints
(tokenize, detokenize, models, metrics) and the chat page in Chromium. Errors and limits:
test_serve_errors.py."""

from __future__ import annotations

import concurrent.futures
import json

import openai
import pytest
from _http import chat, get, metric_value, open_chat_page, post, served

import onnxsample
from onnxsample.text import Tokenizer


def test_chat_completion(client):
    done = chat(client, max_tokens=8, seed=3)
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


@pytest.mark.parametrize("cache_prompt", [True, False])
def test_cache_prompt_false_computes_the_whole_prompt(client, cache_prompt):
    """llama-server's ``cache_prompt``: false computes the prompt anew though a slot holds it."""
    prompt = "The same long prompt, asked twice, " * 4
    kw = dict(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
    client.completions.create(**kw)
    again = client.completions.create(**kw, extra_body={"cache_prompt": cache_prompt})
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert (cached == again.usage.prompt_tokens - 2) if cache_prompt else cached == 0, again.usage


def test_streamed_chat_equals_the_whole_answer(client):
    whole = chat(client, max_tokens=12, seed=5, temperature=0.9)
    chunks = list(
        chat(
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
    a = chat(client, max_tokens=10, seed=11, n=2, temperature=1.0)
    b = chat(client, max_tokens=10, seed=11, n=2, temperature=1.0)
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices]
    assert texts[0] != texts[1]
    one = chat(client, max_tokens=10, seed=12, temperature=1.0)  # choice 1 is seed 11 + 1
    assert one.choices[0].message.content == texts[1]


def test_a_seeded_answer_does_not_depend_on_other_requests(client):
    alone = chat(client, max_tokens=16, seed=77, temperature=0.8).choices[0].message.content
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        noise = [
            pool.submit(chat, client, max_tokens=20, seed=i, temperature=1.0) for i in range(7)
        ]
        mine = pool.submit(chat, client, max_tokens=16, seed=77, temperature=0.8)
        assert mine.result().choices[0].message.content == alone
        for f in noise:
            f.result()


def test_chat_logprobs(client):
    done = chat(client, max_tokens=5, seed=2, logprobs=True, top_logprobs=3, temperature=0)
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
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    prompt_positions = zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True)
    for token, logprob, top in prompt_positions:
        assert len(top) in (2, 3) and top[token] == logprob  # the 2 likeliest and the prompt's
    assert "".join(lp.tokens) == prompt and lp.text_offset[0] == 0
    assert done.model_extra["timings"]["predicted_n"] == 0  # as usage: nothing was generated
    more = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=3, echo=True, logprobs=1, temperature=0
    )
    assert more.choices[0].text.startswith(prompt)
    assert more.choices[0].logprobs.token_logprobs[: len(lp.tokens)] == pytest.approx(
        [None, *lp.token_logprobs[1:]], abs=1e-4
    )


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_0_gives_each_chosen_token_alone(client, stream):
    """OpenAI's legacy logprobs: top_logprobs always holds the chosen token, so up to logprobs + 1
    entries; logprobs 0 gives the chosen token alone, for the echoed prompt and the answer."""
    kw = dict(model="tiny", prompt="The cat sat on", max_tokens=4, echo=True, logprobs=0)
    if stream:
        parts = [p.choices[0].logprobs for p in client.completions.create(stream=True, **kw)]
        parts = [p for p in parts if p is not None]
        tokens = [t for p in parts for t in p.tokens]
        logprobs = [v for p in parts for v in p.token_logprobs]
        tops = [top for p in parts for top in p.top_logprobs]
    else:
        lp = client.completions.create(**kw).choices[0].logprobs
        tokens, logprobs, tops = lp.tokens, lp.token_logprobs, lp.top_logprobs
    assert tops[0] is None and logprobs[0] is None  # the prompt's first token
    chosen = [{t: v} for t, v in zip(tokens[1:], logprobs[1:], strict=True)]
    assert len(tokens) > 4 and tops[1:] == chosen


@pytest.mark.parametrize("prompt", ["Hi<|im_end|> there", [1, 2, 3, 504, 2135]])
def test_echo_text_offsets_point_into_the_text(client, prompt):
    """Each token's text_offset is where its text is in the choice's text, special tokens of a
    prompt of token ids included (they were left out of the echoed text, not of the offsets)."""
    done = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=2, echo=True, logprobs=1, temperature=0
    )
    text, lp = done.choices[0].text, done.choices[0].logprobs
    assert text.startswith("".join(lp.tokens[: done.usage.prompt_tokens])), (text, lp.tokens)
    for token, offset in zip(lp.tokens, lp.text_offset, strict=True):
        assert text[offset : offset + len(token)] == token, (text, lp.tokens, lp.text_offset)


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


def _answer(client, route: str, stream: bool, stop: str | None) -> tuple[str, list[str]]:
    """A greedy answer's text and the texts of the tokens it has logprobs for."""
    kw = dict(model="tiny", max_tokens=12, temperature=0, stop=stop, stream=stream)
    if route == "completions":
        answer = client.completions.create(prompt="Hi there", logprobs=0, **kw)
    else:
        messages = [{"role": "user", "content": "Hi there"}]
        answer = client.chat.completions.create(messages=messages, logprobs=True, **kw)
    text, tokens = "", []
    for choice in [p.choices[0] for p in (answer if stream else [answer]) if p.choices]:
        if route == "completions":
            text += choice.text
            tokens += choice.logprobs.tokens if choice.logprobs else []
        else:
            text += (choice.delta.content if stream else choice.message.content) or ""
            entries = choice.logprobs.content or [] if choice.logprobs else []
            tokens += [bytes(e.bytes).decode("utf-8", "replace") for e in entries]
    return text, tokens


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_stop_strings_tokens_have_no_logprobs(client, route, stream):
    """The tokens that come back with logprobs wrote the text: up to the one the stop string
    begins in, streamed or not, as llama-server cuts them (the stop string's tokens wrote none)."""
    text, tokens = _answer(client, route, False, None)
    # the first stop string that begins inside a token (after its first character) and ends in
    # the next one, found nowhere before
    start, i = next(
        (at, i)
        for i in range(1, len(tokens) - 1)
        if len(tokens[i]) > 1
        and "\ufffd" not in "".join(tokens[: i + 2])
        and text.find(text[(at := len("".join(tokens[:i])) + 1) :][: len(tokens[i])]) == at
    )
    stop = text[start:][: len(tokens[i])]
    assert _answer(client, route, stream, stop) == (text[:start], tokens[: i + 1]), stop


@pytest.mark.parametrize("stream", [False, True])
def test_text_offsets_count_characters_where_tokens_split_them(client, port, stream):
    """A token that ends a character the one before began begins where that character does."""
    prompt = "ab🙂c𝔘d ünï"
    body = json.dumps({"content": prompt, "with_pieces": True}).encode()
    pieces = [t["piece"] for t in post(port, "/tokenize", body)[1]["tokens"]]
    raw = [bytes(p) if isinstance(p, list) else p.encode() for p in pieces]
    assert any(isinstance(p, list) for p in pieces), pieces  # a token holds part of a character
    want = [len(b"".join(raw[:i]).decode("utf-8", "ignore")) for i in range(len(raw))]
    kw = dict(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=0, stream=stream)
    answer = client.completions.create(**kw)
    parts = [p.choices[0].logprobs for p in (answer if stream else [answer]) if p.choices]
    offsets = [o for p in parts if p is not None for o in p.text_offset]
    assert offsets == want and want[-1] < len(prompt), (offsets, want)


@pytest.mark.parametrize("route", ["chat", "completions"])
@pytest.mark.parametrize("per_token", [False, True])
def test_streamed_timings_sit_beside_the_choices(client, route, per_token):
    """llama-server's place for a stream's timings: beside the choices, on the last chunk, and
    with ``timings_per_token`` (llama.cpp's web UI sends it) on every chunk of a token, counting
    its tokens so far."""
    extra = {"extra_body": {"timings_per_token": per_token}}
    kw = dict(max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True})
    if route == "chat":
        chunks = list(chat(client, **kw, **extra))[1:]  # the role's chunk comes first
    else:
        chunks = list(client.completions.create(model="tiny", prompt="The sea", **kw, **extra))
    *pieces, last, usage = chunks
    assert last.choices[0].finish_reason and usage.choices == []
    assert not any("timings" in c.choices[0].model_extra for c in [*pieces, last])
    final = last.model_extra["timings"]
    assert final["predicted_n"] == usage.usage.completion_tokens
    timed = [c.model_extra.get("timings") for c in pieces]
    if not per_token:
        assert timed == [None] * len(pieces)
        return
    assert all(t.keys() == final.keys() for t in timed)
    counts = [t["predicted_n"] for t in timed]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] <= final["predicted_n"]


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_return_progress_streams_the_prompts_progress_first(client, route):
    """llama-server's ``return_progress`` (llama.cpp's web UI sends it): chunks without text, the
    prompt's progress beside their choice, before the first token (a chat's repeat the role)."""
    kw = dict(max_tokens=4, temperature=0, stream=True, extra_body={"return_progress": True})
    if route == "chat":
        chunks = list(chat(client, **kw))[1:]  # the role's chunk comes first
    else:
        chunks = list(client.completions.create(model="tiny", prompt="The sea", **kw))
    progress = [
        c.model_extra["prompt_progress"] for c in chunks if "prompt_progress" in c.model_extra
    ]
    assert progress and all("prompt_progress" in c.model_extra for c in chunks[: len(progress)])
    assert progress[-1]["processed"] == progress[-1]["total"] > 0
    for c in chunks[: len(progress)]:
        if route == "chat":
            assert c.choices[0].delta.role == "assistant" and c.choices[0].delta.content is None
        else:
            assert c.choices[0].text == ""
    text = [c.choices[0].delta.content if route == "chat" else c.choices[0].text
            for c in chunks[len(progress) :]]  # fmt: skip
    assert "".join(t or "" for t in text)


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


def test_tokenize_detokenize_models_metrics_and_the_page(port, client):
    code, data = post(port, "/tokenize", b'{"content": "Hello world"}')
    assert code == 200 and data["count"] == len(data["tokens"]) and data["max_model_len"] == 512
    code, back = post(port, "/detokenize", json.dumps({"tokens": data["tokens"]}).encode())
    assert code == 200 and back["prompt"] == back["content"] == "Hello world"
    special = "<|im_start|>user\nHi<|im_end|>"  # special tokens' text is kept, as by the peers
    code, data = post(port, "/tokenize", json.dumps({"content": special}).encode())
    assert code == 200 and len(data["tokens"]) < len(special) // 2, data
    code, back = post(port, "/detokenize", json.dumps({"tokens": data["tokens"]}).encode())
    assert code == 200 and back["content"] == special, back
    assert post(port, "/detokenize", b'{"tokens": [-1]}')[0] == 400
    code, error = post(port, "/tokenize", b'{"content": [1000000000, "Hi"]}')  # llama-server's mix
    assert code == 400 and "token ids must be in [0, " in error["error"]["message"], error
    for path, body in (("/tokenize", {"content": "Hi"}), ("/detokenize", {"tokens": [5]})):
        assert post(port, path, json.dumps({**body, "model": "tiny"}).encode())[0] == 200
        code, error = post(port, path, json.dumps({**body, "model": "gpt-9"}).encode())
        assert code == 404 and error["error"]["param"] == "model", error  # as vLLM's
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert (
        client.models.retrieve("tiny").max_model_len == client.models.list().data[0].max_model_len
    )
    card = client.models.retrieve("tiny")  # vLLM's fields: the file served, no parent
    assert card.root.endswith(".onnx") and card.parent is None
    code, version = get(port, "/version")
    assert code == 200 and json.loads(version) == {"version": onnxsample.__version__}
    with pytest.raises(openai.NotFoundError, match="'gpt-9' does not exist"):
        client.models.retrieve("gpt-9")
    assert get(port, "/health", "HEAD") == (200, b"")  # a load balancer's probe
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


def test_props_default_sampling_is_what_a_request_gets_without_it(port):
    """llama.cpp's web UI reads /props and sends its default sampling back with each request
    (llama-server's names, its samplers order): the answer /completion gives without them, which
    are llama-server's defaults; OpenAI's route keeps OpenAI's (temperature 1, no cut)."""
    code, raw = get(port, "/props")
    assert code == 200
    props = json.loads(raw)
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 4
    params = props["default_generation_settings"]["params"]
    assert {k: params[k] for k in ("temperature", "top_k", "top_p", "min_p")} == {
        "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
    }  # fmt: skip
    assert params["samplers"][-1] == "temperature"
    base = {"prompt": "Once upon a time", "n_predict": 8, "seed": 3, "ignore_eos": True}
    answers = []
    for body in ({**params, **base, "max_tokens": 8}, base):
        code, data = post(port, "/completion", json.dumps(body).encode())
        assert code == 200, data
        answers.append(data["content"])
    assert answers[0] == answers[1]
    mine = post(port, "/completion", json.dumps(base).encode())[1]["generation_settings"]
    assert {k: mine[k] for k in ("temperature", "top_k", "samplers")} == {
        k: params[k] for k in ("temperature", "top_k", "samplers")
    }
    openai_route = {"prompt": "Once upon a time", "max_tokens": 8, "seed": 3}
    neutral = {**openai_route, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    texts = [
        post(port, "/v1/completions", json.dumps(b).encode())[1]["choices"][0]["text"]
        for b in (openai_route, neutral)
    ]
    assert texts[0] == texts[1]


@pytest.mark.parametrize("path", ["/v1/completions", "/completion"])
def test_top_k_minus_1_is_no_top_k_as_vllm_and_llama_server_read_it(port, path):
    base = {"prompt": "Once upon a time", "max_tokens": 8, "seed": 4, "temperature": 1.0}
    texts = []
    for top_k in (-1, 0):
        code, data = post(port, path, json.dumps({**base, "top_k": top_k}).encode())
        assert code == 200, data
        texts.append(data["content"] if path == "/completion" else data["choices"][0]["text"])
        if path == "/completion":
            assert data["generation_settings"]["top_k"] == 0
    assert texts[0] == texts[1]


def test_tokenize_takes_llama_servers_and_vllms_text_options(port, models):
    """llama-server's `content` gets no special tokens unless `add_special`, vLLM's `prompt` gets
    them unless `add_special_tokens` is false; `with_pieces` gives each token's text, or its bytes
    where it holds part of a character; `return_token_strs` the vocabulary's own strings."""
    tokenizer = Tokenizer.from_folder(models["four"].parent)
    vocab = {i: s for s, i in tokenizer._backend.get_vocab(with_added_tokens=True).items()}
    text = "Hello wörld 🦙 <|im_start|>"
    cases = [
        ({"content": text}, False),
        ({"prompt": text}, True),
        ({"content": text, "add_special": True}, True),
        ({"prompt": text, "add_special_tokens": False}, False),
    ]
    for body, special in cases:
        code, data = post(port, "/tokenize", json.dumps(body).encode())
        assert code == 200 and data["tokens"] == tokenizer.encode(text, add_special_tokens=special)
    body = {"content": text, "with_pieces": True, "return_token_strs": True}
    code, data = post(port, "/tokenize", json.dumps(body).encode())
    ids = [t["id"] for t in data["tokens"]]
    assert code == 200 and ids == tokenizer.encode(text, add_special_tokens=False)
    pieces = [t["piece"] for t in data["tokens"]]
    assert b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in pieces) == text.encode()
    assert any(isinstance(p, list) for p in pieces)  # the llama's four bytes span tokens
    assert data["token_strs"] == [vocab[i] for i in ids]
    body = {"content": text, "add_special": True, "add_special_tokens": False}
    code, data = post(port, "/tokenize", json.dumps(body).encode())
    assert code == 400 and data["error"]["param"] == "add_special", data
    literal = tokenizer.encode(text, add_special_tokens=False, parse_special=False)
    assert len(literal) > len(tokenizer.encode(text, add_special_tokens=False))
    code, data = post(
        port, "/tokenize", json.dumps({"content": text, "parse_special": False}).encode()
    )
    assert code == 200 and data["tokens"] == literal  # llama-server's: the text as text
    code, data = post(port, "/tokenize", json.dumps({"content": text, "parse_special": 0}).encode())
    assert code == 400 and data["error"]["param"] == "parse_special", data


WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize("tools", [None, [WEATHER]], ids=["plain", "tools"])
def test_tokenize_counts_a_chat_as_the_chat_route_does(port, client, tools):
    """vLLM's `/tokenize` of `messages`: the ids the chat route gives the engine, tools included,
    so `count` is the chat's `prompt_tokens`."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Is it raining in Paris?"},
    ]
    extra = {"tools": tools} if tools else {}
    done = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, **extra)
    code, data = post(port, "/tokenize", json.dumps({"messages": messages, **extra}).encode())
    assert code == 200 and data["count"] == done.usage.prompt_tokens, data
    if tools:
        plain = post(port, "/tokenize", json.dumps({"messages": messages}).encode())[1]
        assert plain["count"] < data["count"]


@pytest.mark.parametrize("tools", [None, [WEATHER]], ids=["plain", "tools"])
def test_apply_template_gives_the_text_the_chat_route_tokenises(port, tools):
    """llama-server's `/apply-template`: the chat's text, which tokenised as a text prompt is the
    chat route's ids (this vocabulary adds no BOS). The rest of a chat request's fields are read
    and left alone; one that would change the text is refused by name."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Is it raining in Paris?"},
    ]
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    code, data = post(port, "/apply-template", json.dumps(body).encode())
    assert code == 200 and list(data) == ["prompt"] and "Is it raining in Paris?" in data["prompt"]
    assert ("weather" in data["prompt"]) == bool(tools)
    ids = post(port, "/tokenize", json.dumps({"prompt": data["prompt"]}).encode())[1]["tokens"]
    assert ids == post(port, "/tokenize", json.dumps(body).encode())[1]["tokens"]
    sampled = {**body, "temperature": 0.5, "stream": True, "max_tokens": 3, "best_of": 2}
    assert post(port, "/apply-template", json.dumps(sampled).encode()) == (200, data)
    code, error = post(port, "/apply-template", json.dumps({**body, "chat_template": "x"}).encode())
    assert code == 400 and error["error"]["param"] == "chat_template", error


def test_the_chat_templates_options_as_vllm_and_llama_server_give_them(port, client):
    """vLLM's add_generation_prompt and continue_final_message on /apply-template, /tokenize and
    the chat route; text parts joined by a newline, as both peers join them."""
    start = [{"role": "user", "content": "Name a fruit."}]
    partial = [*start, {"role": "assistant", "content": "My favourite is the"}]

    def text(messages, **options) -> str:
        code, data = post(
            port, "/apply-template", json.dumps({"messages": messages, **options}).encode()
        )
        assert code == 200, data
        return data["prompt"]

    opened = text(start)
    closed = text(start, add_generation_prompt=False)
    assert opened.startswith(closed) and len(opened) > len(closed)
    continued = text(partial, add_generation_prompt=False, continue_final_message=True)
    assert continued == opened + "My favourite is the"
    ids = post(port, "/tokenize", json.dumps({"prompt": continued}).encode())[1]["tokens"]
    chat_ids = {"messages": partial, "add_generation_prompt": False, "continue_final_message": True}
    assert post(port, "/tokenize", json.dumps(chat_ids).encode())[1]["tokens"] == ids
    done = client.chat.completions.create(
        model="tiny", messages=partial, max_tokens=3, temperature=0,
        extra_body={"add_generation_prompt": False, "continue_final_message": True},
    )  # fmt: skip
    assert done.usage.prompt_tokens == len(ids)
    code, error = post(
        port, "/apply-template", json.dumps({**chat_ids, "add_generation_prompt": True}).encode()
    )
    assert code == 400 and "cannot both be true" in error["error"]["message"], error
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}
    ]
    assert text(parts) == text([{"role": "user", "content": "A\nB"}])


def test_64_concurrent_streams_each_get_their_own_answer(client):
    def ask(i: int, stream: bool) -> str:
        kwargs = {"max_tokens": 12, "seed": 1000 + i, "temperature": 0.9}
        if not stream:
            return chat(client, **kwargs).choices[0].message.content
        return "".join(
            c.choices[0].delta.content or ""
            for c in chat(client, stream=True, **kwargs)
            if c.choices
        )

    alone = [ask(i, stream=False) for i in range(64)]
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        together = list(pool.map(lambda i: ask(i, stream=True), range(64)))
    assert together == alone


def test_speculative_serving_gives_the_same_answers(models, client):
    """serve --speculative ngram: greedy and seeded answers as without it, drafts in /metrics."""
    prompt = "a b c a b c a b c a b c"
    asks = [dict(temperature=0), dict(temperature=0.9, seed=5, frequency_penalty=0.5)]

    def answers(c, model):
        return [
            c.completions.create(model=model, prompt=prompt, max_tokens=24, **kw) for kw in asks
        ]

    plain = answers(client, "tiny")
    with served(models["drafts"], "--threads", "1", "--speculative", "ngram") as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        fast = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        drafts = answers(fast, fast.models.list().data[0].id)
        drafted = metric_value(server.port, "onnxsample_spec_decode_draft_tokens_total")
        kept = metric_value(server.port, "onnxsample_spec_decode_accepted_tokens_total")
    assert [a.choices[0].text for a in drafts] == [a.choices[0].text for a in plain]
    assert 0 < kept <= drafted
    # llama-server's timings say what was drafted and kept, and only where drafting ran
    timings = [a.model_extra["timings"] for a in drafts]
    assert sum(t["draft_n"] for t in timings) == drafted
    assert sum(t["draft_n_accepted"] for t in timings) == kept
    assert not any("draft_n" in a.model_extra["timings"] for a in plain)


def test_a_chat_template_given_to_serve_renders_the_chats(models, tmp_path):
    """`serve --chat-template FILE` (vLLM's option; a GGUF may carry no template): chat
    completions render with it, and the prompt is what it renders; a request's
    ``chat_template_kwargs`` are more of its variables (vLLM's and llama-server's field), and
    its ``reasoning_effort`` one of them (OpenAI's field, as llama-server passes it)."""
    from onnxsample.text import Tokenizer

    template = tmp_path / "chat.jinja"
    template.write_text(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<answer>"
        "{% if mood is defined %}{{ mood }}{% endif %}"
        "{% if reasoning_effort is defined %} effort {{ reasoning_effort }}{% endif %}"
    )
    tokenizer = Tokenizer.from_folder(models["two"].parent)
    args = ("--threads", "1", "--served-model-name", "tiny", "--chat-template", str(template))
    chat = [{"role": "user", "content": "Hi there"}]
    with served(models["two"], *args) as server:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
        plain = c.chat.completions.create(model="tiny", messages=chat, max_tokens=2)
        calm = c.chat.completions.create(model="tiny", messages=chat, max_tokens=2,
                                         extra_body={"chat_template_kwargs": {"mood": "calm"}})  # fmt: skip
        body = json.dumps({"messages": chat, "chat_template_kwargs": {"mood": "calm"}}).encode()
        counted = post(server.port, "/tokenize", body)[1]["count"]
        high = c.chat.completions.create(
            model="tiny", messages=chat, max_tokens=2, reasoning_effort="high"
        )
        with pytest.raises(openai.BadRequestError) as refused:
            c.chat.completions.create(model="tiny", messages=chat, max_tokens=2,
                                      extra_body={"chat_template_kwargs": {"messages": []}})  # fmt: skip
    assert plain.usage.prompt_tokens == len(
        tokenizer.encode("<user>Hi there<answer>", add_special_tokens=False)
    )
    want = tokenizer.encode("<user>Hi there<answer>calm", add_special_tokens=False)
    assert calm.usage.prompt_tokens == counted == len(want)
    want = tokenizer.encode("<user>Hi there<answer> effort high", add_special_tokens=False)
    assert high.usage.prompt_tokens == len(want)
    assert refused.value.body["param"] == "chat_template_kwargs"


@pytest.mark.integration
def test_a_gguf_file_is_served_under_its_name(llama_cpp, tmp_path, monkeypatch):
    """`onnxsample serve FILE.gguf`, as `llama-server -m FILE.gguf`: exported into the user cache
    on first use and served under the file's name."""
    import _llama_cpp_models as fixtures

    monkeypatch.setenv("ONNXSAMPLE_CACHE", str(tmp_path))
    file = fixtures.gguf("llama3", "Q4_K_M", llama_cpp)
    with served(file, "--threads", "1", startup_s=300) as server:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
        assert [m.id for m in c.models.list().data] == [file.stem]
        answer = c.completions.create(model=file.stem, prompt="Hi", max_tokens=8, temperature=0)
    assert answer.usage.completion_tokens > 0 and answer.model == file.stem
    [folder] = (tmp_path / "exports").glob(f"*/{file.stem}")
    assert (folder / "composed.onnx").is_file()


def test_the_chat_page_streams_an_answer_in_chromium(port, chromium, tmp_path):
    """Type a question, watch streamed text appear, change the temperature, read the timings."""
    from PIL import Image
    from selenium.webdriver.common.by import By

    driver = chromium
    wait = open_chat_page(driver, port)
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


# Installed before the chat page's own script: every request body the page sends is kept in
# window.__bodies, and window.__break() ends the chat answer streaming now as a dropped
# connection does (its body fails with the TypeError fetch gives; the request itself is closed).
RECORD_REQUESTS = """
window.__bodies = [];
const fetched = window.fetch;
window.fetch = async function (url, options) {
  if (options && options.body) window.__bodies.push(JSON.parse(options.body));
  const response = await fetched.apply(this, arguments);
  if (!response.ok || !String(url).includes("/chat/")) return response;
  const reader = response.body.getReader();
  let broken = false;
  const body = new ReadableStream({
    start(stream) {
      window.__break = () => {
        broken = true;
        reader.cancel();
        stream.error(new TypeError("network error"));
      };
    },
    async pull(stream) {
      const { value, done } = await reader.read();
      if (broken) return;
      if (done) stream.close();
      else stream.enqueue(value);
    },
    cancel(reason) { return reader.cancel(reason); },
  });
  return new Response(body, { status: response.status, headers: response.headers });
};
"""

# Runs `action` in the page the moment the first answer on it shows text (or, for "stop-at-once",
# the moment its bubble appears): no wait between the page and the test decides the timing.
WHEN_THE_ANSWER_SHOWS = """
const [action] = arguments;
const box = document.getElementById("messages");
new MutationObserver((_, observer) => {
  const answer = box.querySelector(".message.assistant");
  if (!answer || (!answer.textContent && action !== "stop-at-once")) return;
  observer.disconnect();
  if (action === "break") window.__break();
  else document.getElementById(action === "clear" ? "clear" : "stop").click();
}).observe(box, { subtree: true, childList: true, characterData: true });
"""


def _open_recording(driver, port: int):
    """The chat page with RECORD_REQUESTS, once it has asked for the model (named or not)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_REQUESTS})
    driver.get(f"http://127.0.0.1:{port}/")
    wait = WebDriverWait(driver, 60)
    wait.until(lambda d: d.find_element(By.ID, "model").text != "loading…")
    return wait


def _set(driver, field: str, value: str) -> None:
    driver.execute_script(
        "document.getElementById(arguments[0]).value = arguments[1]", field, value
    )


def _send(driver, wait, question: str | None = None) -> None:
    """Click Send (after typing `question`, if given) and wait until the turn is over."""
    from selenium.webdriver.common.by import By

    if question is not None:
        _set(driver, "input", question)
    driver.find_element(By.ID, "send").click()
    wait.until(lambda d: d.find_element(By.ID, "send").get_attribute("disabled") is None)


def _sent(driver) -> list[list[tuple[str, str]]]:
    """The messages of each chat request the page sent: (role, content)."""
    bodies = driver.execute_script("return window.__bodies")
    return [[(m["role"], m["content"]) for m in b["messages"]] for b in bodies if "messages" in b]


def _page(driver) -> list[tuple[str, str]]:
    """What #messages shows: each element's class and text."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#messages > *')].map(e => [e.className, e.textContent])"
    )


def _cancelled(port: int) -> float:
    name = 'onnxsample_requests_total{finish_reason="cancelled"}'
    lines = [
        line for line in get(port, "/metrics")[1].decode().splitlines() if line.startswith(name)
    ]
    return float(lines[0].split()[-1]) if lines else 0.0


# (id, the server's options, what breaks the second turn, what mends it before it is sent again)
FAILED_TURNS = [
    ("over-the-context", ["--max-len", "96"], "long question", "short question"),
    ("api-key", ["--api-key", "k3y"], "no key", "key"),
    ("schema-not-json", [], "bad schema", "text"),
    ("stopped-before-any-answer", [], "stop at once", None),
]


@pytest.mark.parametrize(
    ("server_args", "breaks", "mends"),
    [case[1:] for case in FAILED_TURNS],
    ids=[case[0] for case in FAILED_TURNS],
)
def test_a_failed_turn_on_the_chat_page_stays_out_of_the_conversation(
    models, chromium, server_args, breaks, mends
):
    """A turn that gets no answer (a 400, a 401, a schema the page cannot send, Stop before the
    first token) is shown as failed, its question goes back into the box, and the next request
    holds the conversation as it was before it: user and assistant turns alternating."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = chromium
    with served(models["two"], "--threads", "1", "--served-model-name", "tiny", *server_args) as s:
        wait = _open_recording(driver, s.port)
        _set(driver, "max_tokens", "4")
        if breaks == "no key":
            _set(driver, "api_key", "k3y")
        _send(driver, wait, "Hello.")
        question = "Tell me more."
        if breaks == "long question":
            question = "word " * 80
        elif breaks == "no key":
            _set(driver, "api_key", "")
        elif breaks == "bad schema":
            Select(driver.find_element(By.ID, "format")).select_by_value("json_schema")
            _set(driver, "schema", "{not json")
        elif breaks == "stop at once":
            driver.execute_script(WHEN_THE_ANSWER_SHOWS, "stop-at-once")
        _send(driver, wait, question)
        failed = [(kind, text) for kind, text in _page(driver) if kind.startswith("message")]
        box = driver.find_element(By.ID, "input").get_attribute("value")
        if mends == "short question":
            _set(driver, "input", "And now?")
        elif not box:  # (the question is to be back in the box; asked again all the same)
            _set(driver, "input", question)
        if mends == "key":
            _set(driver, "api_key", "k3y")
        elif mends == "text":
            Select(driver.find_element(By.ID, "format")).select_by_value("text")
        again = driver.find_element(By.ID, "input").get_attribute("value").strip()
        _send(driver, wait)  # what the box holds: the question again, or the one put instead
        shown = [(kind, text) for kind, text in _page(driver) if kind.startswith("message")]
    first = shown[1][1]
    assert _sent(driver)[-1] == [("user", "Hello."), ("assistant", first), ("user", again)]
    assert shown[-2] == ("message user", again) and shown[-1][0] == "message assistant", shown
    assert failed[-2] == ("message user failed", question.strip()), failed
    assert failed[-1][0] == "message error", failed
    assert "left out of the conversation" in failed[-1][1], failed
    assert box == question.strip()


@pytest.mark.parametrize("action", ["stop", "clear", "break"])
def test_an_answer_ended_mid_stream_on_the_chat_page(port, chromium, action):
    """Stop, New conversation or a broken connection while an answer streams: the request is
    cancelled on the server; what was shown is the assistant's turn after Stop or the break (said
    under it) and nothing of it is left after New conversation, which starts anew."""
    from selenium.webdriver.common.by import By

    driver = chromium
    wait = _open_recording(driver, port)
    _set(driver, "max_tokens", "400")
    _set(driver, "temperature", "0")
    cancelled = _cancelled(port)
    driver.execute_script(WHEN_THE_ANSWER_SHOWS, action)
    _send(driver, wait, "Write a long story about the sea.")
    wait.until(lambda d: _cancelled(port) > cancelled)
    shown = _page(driver)
    if action == "clear":
        assert shown == []
    else:
        [answer] = driver.find_elements(By.CSS_SELECTOR, ".message.assistant")
        partial = driver.execute_script("return arguments[0].textContent", answer)
        note = driver.find_element(By.CSS_SELECTOR, ".note").text
        assert partial and not driver.find_elements(By.CSS_SELECTOR, ".message.error"), shown
        said = "stopped" if action == "stop" else "the connection to the server broke"
        assert said in note, note
    _set(driver, "max_tokens", "4")
    _send(driver, wait, "What is 2+2?")
    before = [] if action == "clear" else [("user", "Write a long story about the sea."),
                                           ("assistant", partial)]  # fmt: skip
    assert _sent(driver)[-1] == [*before, ("user", "What is 2+2?")]


@pytest.mark.parametrize("how", ["keydown", "ime"])
def test_the_enter_that_ends_an_ime_composition_does_not_send(port, chromium, how):
    """Enter that picks the words of a composition (Japanese, Chinese) is the IME's, as
    llama.cpp's web UI keeps it; an Enter after it sends."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver = chromium
    wait = _open_recording(driver, port)
    _set(driver, "max_tokens", "2")
    box = driver.find_element(By.ID, "input")
    box.click()
    if how == "keydown":  # as the browser fires it when a composition ends on Enter
        _set(driver, "input", "日本語の")
        driver.execute_script(
            "arguments[0].dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', "
            "keyCode: 229, isComposing: true, bubbles: true, cancelable: true}))",
            box,
        )
    else:  # an IME composing in Chromium itself, then Enter
        driver.execute_cdp_cmd(
            "Input.imeSetComposition", {"text": "にほん", "selectionStart": 3, "selectionEnd": 3}
        )
        driver.execute_cdp_cmd(
            "Input.dispatchKeyEvent",
            {"type": "rawKeyDown", "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13},
        )
        driver.execute_cdp_cmd("Input.insertText", {"text": "日本"})
    import time

    time.sleep(1)
    assert _sent(driver) == [] and _page(driver) == []
    typed = box.get_attribute("value")
    assert typed.startswith("日本"), typed
    box.send_keys(Keys.ENTER)
    wait.until(lambda d: d.find_element(By.ID, "send").get_attribute("disabled") is None)
    wait.until(lambda d: _sent(d) == [[("user", typed.strip())]])


@pytest.mark.parametrize(
    ("server_args", "max_tokens", "said"),
    [([], "5", "cut at the max tokens limit (5)"), (["--max-len", "64"], "200", "context (64")],
    ids=["max-tokens", "context"],
)
def test_an_answer_cut_short_says_so_on_the_chat_page(
    models, chromium, server_args, max_tokens, said
):
    """finish_reason "length": a line under the answer says Max tokens or the context cut it."""
    from selenium.webdriver.common.by import By

    driver = chromium
    with served(models["two"], "--threads", "1", "--served-model-name", "tiny", *server_args) as s:
        wait = _open_recording(driver, s.port)
        _set(driver, "max_tokens", max_tokens)
        _set(driver, "temperature", "0")
        _send(driver, wait, "Tell me a story.")
        note = driver.find_element(By.CSS_SELECTOR, ".timings + .note").text
    assert said in note, note
    assert driver.find_element(By.CSS_SELECTOR, ".message.assistant").text


def test_the_end_of_sequence_token_counts_as_generated(client, port, tiny_gqa_export):
    """As vLLM's usage and generation-token counter and llama-server's predicted_n count it:
    the end-of-sequence token that ended a choice is one of its completion tokens, whole and
    streamed."""
    eos = Tokenizer.from_folder(tiny_gqa_export.output).eos_token_id
    kw = dict(max_tokens=5, temperature=0, logit_bias={str(eos): 100})
    counted = metric_value(port, "onnxsample_generation_tokens_total")
    whole = chat(client, **kw)
    chunks = list(chat(client, **kw, stream=True, stream_options={"include_usage": True}))
    assert whole.choices[0].finish_reason == "stop" and whole.choices[0].message.content == ""
    assert whole.usage.completion_tokens == 1 == whole.model_extra["timings"]["predicted_n"]
    assert chunks[-1].usage.completion_tokens == 1
    assert metric_value(port, "onnxsample_generation_tokens_total") == counted + 2


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_the_end_of_sequence_token_has_the_last_logprob(client, tiny_gqa_export, route, stream):
    """As vLLM and llama-server list it: the end-of-sequence token that ended a choice is the
    last position of its logprobs (its text the token's own, beyond the answer's text), so the
    positions are as many as the completion tokens, whole and streamed."""
    tokenizer = Tokenizer.from_folder(tiny_gqa_export.output)
    eos = tokenizer.eos_token_id
    kw = dict(model="tiny", max_tokens=6, temperature=0, logit_bias={str(eos): 100}, stream=stream)
    kw |= {"extra_body": {"min_tokens": 2}}  # two tokens, then the end of sequence
    if stream:
        kw["stream_options"] = {"include_usage": True}
    if route == "chat":
        messages = [{"role": "user", "content": "Hi there"}]
        answer = client.chat.completions.create(messages=messages, logprobs=True, **kw)
    else:
        answer = client.completions.create(prompt="Hi there", logprobs=1, **kw)
    parts = list(answer) if stream else [answer]
    choices = [p.choices[0] for p in parts if p.choices]
    usage = parts[-1].usage
    if route == "chat":
        entries = [e for c in choices if c.logprobs for e in c.logprobs.content or []]
        texts = [e.token for e in entries]
        text = "".join((c.delta.content if stream else c.message.content) or "" for c in choices)
        assert bytes(entries[-1].bytes) == tokenizer.token_bytes(eos)
    else:
        texts = [t for c in choices if c.logprobs for t in c.logprobs.tokens]
        offsets = [o for c in choices if c.logprobs for o in c.logprobs.text_offset]
        text = "".join(c.text for c in choices)
        assert offsets[-1] == len(text)
    assert choices[-1].finish_reason == "stop"
    assert len(texts) == 3 == usage.completion_tokens, texts
    assert texts[-1] == tokenizer.token_bytes(eos).decode() and texts[-1] not in text


def test_ignore_eos_is_each_peers_own(port, tiny_gqa_export):
    """llama-server's /completion: ignore_eos keeps every end-of-generation token from being
    drawn, whatever bias the request gave it; vLLM's on the OpenAI routes: one drawn is kept and
    the answer goes on."""
    eos = Tokenizer.from_folder(tiny_gqa_export.output).eos_token_id
    native = {"prompt": "Once", "n_predict": 4, "logit_bias": [[eos, 100]], "ignore_eos": True,
              "return_tokens": True, "temperature": 0}  # fmt: skip
    code, data = post(port, "/completion", json.dumps(native).encode())
    assert code == 200 and data["stop_type"] == "limit", data
    assert len(data["tokens"]) == 4 and eos not in data["tokens"], data
    openai_route = {"prompt": "Once", "max_tokens": 4, "logit_bias": {str(eos): 100},
                    "ignore_eos": True, "temperature": 0, "logprobs": 1}  # fmt: skip
    code, data = post(port, "/v1/completions", json.dumps(openai_route).encode())
    assert code == 200 and data["choices"][0]["finish_reason"] == "length", data
    assert data["usage"]["completion_tokens"] == 4
    # the biases need room in the model's table (2 entries here): refused, naming ignore_eos
    crowded = {**native, "logit_bias": [[5, 1.0], [6, 1.0]]}
    code, error = post(port, "/completion", json.dumps(crowded).encode())
    assert code == 400 and error["error"]["param"] == "ignore_eos", error
    assert "compose it with --max-bias" in error["error"]["message"], error


def test_a_base_url_without_v1_reaches_the_same_routes(port):
    """llama-server answers /models and /chat/completions too: a client configured without /v1
    works against either server."""
    bare = openai.OpenAI(base_url=f"http://127.0.0.1:{port}", api_key="none", max_retries=0)
    assert [m.id for m in bare.models.list()] == ["tiny"]
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, seed=1)
    answer = bare.chat.completions.create(**kw).choices[0].message.content
    full = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    assert answer == full.chat.completions.create(**kw).choices[0].message.content
