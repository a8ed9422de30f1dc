"""llama-server's own endpoint, ``POST /completion``, on the tiny model's server: its answer and
stream shapes, how a request ends (``stop_type``, ``stopping_word``), ``n_probs``, several
prompts, and the fields it refuses. The same requests against a real llama-server on the same
GGUF file: tests/exporters/test_gguf_llama_cpp_families.py."""

from __future__ import annotations

import http.client
import json
import re

import pytest
from _http import post

from onnxsample.text import Tokenizer


def stream(port: int, body: dict) -> list[dict]:
    """The events of a streamed /completion, in order (and that it sends no ``[DONE]``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/completion", json.dumps({**body, "stream": True}).encode(),
                     {"Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        assert response.status == 200 and "text/event-stream" in response.getheader("content-type")
        lines = response.read().decode().split("\n\n")
    finally:
        conn.close()
    events = [line.removeprefix("data: ") for line in lines if line]
    assert "[DONE]" not in events
    return [json.loads(e) for e in events]


def complete(port: int, body: dict) -> dict:
    code, data = post(port, "/completion", json.dumps(body).encode())
    assert code == 200, data
    return data


def test_an_answer_has_llama_servers_fields(port):
    body = {"prompt": "Once upon a time", "n_predict": 6, "temperature": 0, "ignore_eos": True}
    whole = complete(port, {**body, "return_tokens": True})
    assert whole["stop"] is True and whole["stop_type"] == "limit" and whole["stopping_word"] == ""
    assert len(whole["tokens"]) == whole["tokens_predicted"] == 6
    assert whole["tokens_evaluated"] > 0 and whole["prompt"].endswith("Once upon a time")
    assert whole["model"] == "tiny" and whole["truncated"] is False
    assert whole["timings"]["predicted_n"] == 6
    settings = whole["generation_settings"]
    assert (
        settings["n_predict"] == 6 and settings["temperature"] == 0 and settings["stream"] is False
    )
    assert "completion_probabilities" not in whole
    again = complete(port, {**body, "prompt": whole["tokens"]})  # token ids as the prompt
    assert again["tokens_evaluated"] == 6
    code, alias = post(port, "/completions", json.dumps(body).encode())
    assert code == 200 and alias["content"] == whole["content"]
    # curl -d without a content type: a form to FastAPI, JSON to llama-server and here
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    code, plain = post(port, "/completion", json.dumps(body).encode(), form)
    assert code == 200 and plain["content"] == whole["content"]


@pytest.mark.parametrize(
    ("off", "neutral"),
    [
        ({"temperature": -1}, {"temperature": 0}),  # greedy, as 0
        ({"top_k": -5, "seed": 3}, {"top_k": 0, "seed": 3}),
        ({"top_p": 1.5, "seed": 3}, {"top_p": 1.0, "seed": 3}),
        ({"typical_p": 2, "seed": 3}, {"typical_p": 1.0, "seed": 3}),
        ({"min_p": -0.5, "seed": 3}, {"min_p": 0.0, "seed": 3}),
        ({"n_probs": -1, "temperature": 0}, {"temperature": 0}),
    ],
)
def test_values_llama_server_reads_as_off_are_read_so(port, off, neutral):
    """llama-server's clients send a sampler switched off as a value past its range (its samplers
    skip it): the same answer as the neutral value, not a 400."""
    body = {"prompt": "Once upon a time", "n_predict": 6, "ignore_eos": True}
    given, expected = complete(port, {**body, **off}), complete(port, {**body, **neutral})
    assert given["content"] == expected["content"]
    assert "completion_probabilities" not in given


@pytest.mark.parametrize("seed", [-1, 0xFFFFFFFF])
def test_llama_servers_default_seed_draws_a_random_one(port, seed):
    """llama-server's LLAMA_DEFAULT_SEED (a uint32: clients send -1): each request its own seed."""
    body = {"prompt": "Once upon a time", "n_predict": 2, "seed": seed}
    seeds = {complete(port, body)["generation_settings"]["seed"] for _ in range(4)}
    assert len(seeds) == 4 and seed not in seeds, seeds
    assert all(0 <= s < 2**53 for s in seeds), seeds  # JSON's doubles hold them (JavaScript, jq)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"content": "Hello world"}),
        ("/detokenize", {"tokens": [1, 2, 3]}),
        ("/apply-template", {"messages": [{"role": "user", "content": "Hi"}]}),
        ("/infill", {"input_prefix": "def f(", "input_suffix": ")", "n_predict": 2}),
    ],
)
def test_every_llama_server_route_reads_json_whatever_the_content_type(port, path, body):
    """curl -d sends a form's content type; llama-server reads every body as JSON."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    code, plain = post(port, path, json.dumps(body).encode(), form)
    code_json, typed = post(port, path, json.dumps(body).encode())
    assert (code, plain) == (code_json, typed), plain
    assert code == (501 if path == "/infill" else 200), plain  # the tiny model has no FIM tokens
    code, data = post(port, path, b"{not json", form)
    assert code == 400 and "the body is not JSON" in data["error"]["message"], data


def test_a_stream_adds_up_to_the_whole_answer(port):
    body = {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0.8, "seed": 11}
    whole = complete(port, {**body, "return_tokens": True})
    events = stream(port, body)
    *pieces, last = events
    assert all(e["stop"] is False and len(e["tokens"]) == 1 for e in pieces)
    assert "".join(e["content"] for e in pieces) == whole["content"]
    # an event a token, but for a token that leaves a character unfinished (as llama-server's)
    counts = [e["tokens_predicted"] for e in pieces]
    assert counts == sorted(set(counts)) and len(whole["tokens"]) - 2 <= len(pieces)
    assert all(
        whole["tokens"][n - 1] == e["tokens"][0] for n, e in zip(counts, pieces, strict=True)
    )
    assert last["stop"] is True and last["content"] == "" and last["tokens"] == []
    assert last["tokens_predicted"] == whole["tokens_predicted"]
    assert last["stop_type"] == whole["stop_type"]


@pytest.mark.parametrize("per_token", [False, True])
def test_timings_per_token_give_every_event_the_timings_so_far(port, per_token):
    """As llama-server's ``timings_per_token``: every event has the timings when its token came
    (``predicted_n`` its ``tokens_predicted``), with the final object's keys; without it, only
    the final object has them."""
    body = {"prompt": "Once upon a time", "n_predict": 6, "temperature": 0, "ignore_eos": True}
    *pieces, last = stream(port, {**body, "timings_per_token": per_token})
    assert "timings" in last
    if not per_token:
        assert not any("timings" in e for e in pieces)
        return
    timings = [e["timings"] for e in pieces]
    assert all(t.keys() == last["timings"].keys() for t in timings)
    assert [t["predicted_n"] for t in timings] == [e["tokens_predicted"] for e in pieces]
    assert {t["prompt_n"] for t in timings} == {last["timings"]["prompt_n"]}
    spent = [t["predicted_ms"] for t in timings] + [last["timings"]["predicted_ms"]]
    assert spent == sorted(spent) and spent[0] == 0  # the first token comes from the prompt


@pytest.mark.parametrize("per_token", [False, True])
def test_return_progress_streams_how_far_the_prompt_is(port, per_token):
    """llama-server's ``return_progress``: before the tokens, events without one say how much of
    the prompt is in the cache (from what was reused, to all of it); a second request reuses the
    first's prompt; a whole answer is the same as without it."""
    prompt = "Once upon a time " * 30  # several prompt calls
    body = {"prompt": prompt, "n_predict": 3, "temperature": 0, "ignore_eos": True,
            "return_progress": True, "timings_per_token": per_token}  # fmt: skip
    for _ in range(2):
        events = stream(port, body)
        first_token = next(i for i, e in enumerate(events) if e["tokens"])
        progress = [e["prompt_progress"] for e in events[:first_token]]
        assert all("prompt_progress" not in e for e in events[first_token:])
        assert all(e["content"] == "" and not e["stop"] for e in events[:first_token])
        assert all(("timings" in e) == per_token for e in events[:first_token])
        total = events[-1]["tokens_evaluated"]
        assert {p["total"] for p in progress} == {total} and len(
            {p["cache"] for p in progress}
        ) == 1
        done = [p["processed"] for p in progress]
        assert done[0] == progress[0]["cache"] and done[-1] == total and done == sorted(done)
    assert progress[0]["cache"] > 0 and len(done) >= 2  # the second time, the prompt was reused
    whole = {**body, "n_predict": 3}
    plain = {k: v for k, v in whole.items() if k not in ("return_progress", "timings_per_token")}
    assert complete(port, whole)["content"] == complete(port, plain)["content"]


def test_the_end_of_sequence_token_ends_the_tokens(port, models):
    """As llama-server's: the end-of-sequence token is the answer's last token (no text), and
    counted; streamed, it is an event of its own."""
    eos = Tokenizer.from_folder(models["four"].parent).eos_token_id
    body = {"prompt": "Hi", "n_predict": 5, "logit_bias": {str(eos): 100}, "return_tokens": True}
    whole = complete(port, body)
    assert whole["content"] == "" and whole["tokens"] == [eos]
    assert whole["tokens_predicted"] == 1 and whole["stop_type"] == "eos"
    *pieces, last = stream(port, body)
    assert [(e["tokens"], e["content"]) for e in pieces] == [([eos], "")]
    assert last["stop_type"] == "eos" and last["tokens_predicted"] == 1


def test_logit_bias_takes_llama_servers_forms(port, models):
    """Pairs or an object, a token as an id or as text (each of its tokens biased), entries for
    one token added up: the same answer as OpenAI's object of ids."""
    tokenizer = Tokenizer.from_folder(models["four"].parent)
    [a] = tokenizer.encode(" the", add_special_tokens=False)
    body = {"prompt": "Once upon a time", "n_predict": 4, "temperature": 0, "ignore_eos": True}
    want = complete(port, {**body, "logit_bias": {str(a): 30}, "return_tokens": True})
    assert want["tokens"] == [a] * 4
    for bias in ([[a, 30]], [[" the", 20], [a, 10]], {" the": 30}, {str(a): 15, " the": 15}):
        assert complete(port, {**body, "logit_bias": bias})["content"] == want["content"], bias
    for bias in ([[a, False]], [[a]], [[a, "30"]], [[None, 3]]):
        code, data = post(port, "/completion", json.dumps({**body, "logit_bias": bias}).encode())
        assert code == 400 and data["error"]["param"] == "logit_bias", (bias, data)


def test_a_stop_word_ends_the_answer_and_is_named(port):
    body = {"prompt": "Once upon a time", "n_predict": 12, "temperature": 0, "ignore_eos": True}
    free = complete(port, {**body, "n_probs": 2})
    pieces = [p["token"] for p in free["completion_probabilities"]]
    assert "".join(pieces) == free["content"] and len(pieces) == 12
    word = next(piece for piece in pieces[4:] if piece.strip())
    stopped = complete(port, {**body, "stop": ["\u00a7never", word], "n_probs": 2})
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == word
    assert stopped["content"] == free["content"][: free["content"].index(word)]
    # as llama-server: the stop word's tokens (as the word alone tokenises) lose their entries
    probs = stopped["completion_probabilities"]
    assert 0 < len(probs) < stopped["tokens_predicted"]
    assert probs == free["completion_probabilities"][: len(probs)]
    for p in probs:
        assert set(p) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        assert len(p["top_logprobs"]) == 2 and p["top_logprobs"][0]["logprob"] >= p["logprob"]
        assert set(p["top_logprobs"][0]) == {"id", "token", "bytes", "logprob"}


def test_several_prompts_get_a_list_in_order(port):
    body = {"prompt": ["Once upon a time", "The sea"], "n_predict": 4, "temperature": 0}
    answers = complete(port, body)
    assert isinstance(answers, list) and [a["index"] for a in answers] == [0, 1]
    for prompt, answer in zip(body["prompt"], answers, strict=True):
        assert answer["content"] == complete(port, {**body, "prompt": prompt})["content"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_probs", 9),  # more than the model was composed for (3)
        ("n_probs", "2"),
        ("return_tokens", 1),
        ("echo", True),
        ("mirostat", 2),
        ("samplers", ["temperature", "temperature"]),  # the temperature (0.7) twice
        ("repeat_penalty", 1.3),  # over llama-server's 64-token window
        ("response_fields", "content"),
        ("n_indent", -1),
        ("t_max_predict_ms", "soon"),
        ("timings_per_token", "yes"),
        ("return_progress", 1),
        ("post_sampling_probs", "yes"),
        ("verbose", True),
        ("n_predict", "many"),
        ("prompt", {"text": "Hi"}),
    ],
)
def test_what_it_cannot_do_is_refused_by_name(port, field, value):
    body = {"prompt": "Hi", "n_predict": 2, "temperature": 0.7, field: value}
    code, data = post(port, "/completion", json.dumps(body).encode())
    assert code == 400, data
    assert field in json.dumps(data["error"]), data


def test_post_sampling_probs_need_the_candidates_unless_greedy(port):
    """This model has no candidates: greedy decoding's probabilities are known (its token's is 1,
    as on llama-server), a draw's are refused by name with what to do."""
    body = {"prompt": "Hi", "n_predict": 3, "n_probs": 2, "post_sampling_probs": True}
    greedy = complete(port, {**body, "temperature": 0, "ignore_eos": True})
    assert greedy["generation_settings"]["post_sampling_probs"] is True
    for entry in greedy["completion_probabilities"]:
        assert entry["prob"] == 1.0 and entry["top_probs"] == [
            {"id": entry["id"], "token": entry["token"], "bytes": entry["bytes"], "prob": 1.0}
        ]
    code, data = post(port, "/completion", json.dumps({**body, "temperature": 0.7}).encode())
    assert code == 400 and data["error"]["param"] == "post_sampling_probs", data
    assert "serve --candidates K" in data["error"]["message"], data


def test_a_body_that_is_not_json_is_a_400(port):
    code, data = post(port, "/completion", b"prompt=Hi")
    assert code == 400 and "not JSON" in data["error"]["message"], data


def test_code_completion_fields_are_llama_servers(port, models):
    """``response_fields`` keeps the paths it names (keyed by the path), ``n_predict`` 0 samples
    one token (and says 0), an answer the context ends is ``truncated``, ``t_max_prompt_ms``
    changes nothing (llama-server does not implement it), and
    ``n_indent`` and ``t_max_predict_ms`` end the text as the token limit does."""
    body = {"prompt": "Once upon a time", "n_predict": 6, "temperature": 0, "ignore_eos": True}
    whole = complete(port, body)
    assert whole["tokens_cached"] == whole["tokens_evaluated"] + 5  # the last is not fed back
    fields = ["content", "tokens_cached", "timings/predicted_n", "generation_settings/top_k", "x/y"]
    kept = complete(port, {**body, "response_fields": fields})
    assert kept == {k: whole[k] for k in fields[:2]} | {
        "timings/predicted_n": 6, "generation_settings/top_k": whole["generation_settings"]["top_k"]
    }  # fmt: skip
    assert complete(port, {**body, "t_max_prompt_ms": 1})["content"] == whole["content"]
    one = complete(port, {**body, "n_predict": 0})
    assert one["tokens_predicted"] == 1 and one["stop_type"] == "limit"
    assert one["generation_settings"]["n_predict"] == 0  # as asked, as llama-server says
    assert whole["truncated"] is False  # its n_predict ended it
    full = complete(port, {**body, "n_predict": -1})  # the context (512 positions) ends it
    assert full["tokens_evaluated"] + full["tokens_predicted"] == 512
    assert full["truncated"] is True and full["stop_type"] == "limit"
    # every token a new line: the second line is empty, so less indented than 1 (its new line
    # is no space), and llama-server's check of it comes a token later
    tokenizer = Tokenizer.from_folder(models["four"].parent)
    lines = {str(t): 100 for t in tokenizer.encode("\n", add_special_tokens=False)}
    body = {**body, "n_predict": 24, "logit_bias": lines}
    assert complete(port, body)["content"] == "\n" * 24
    cut = complete(port, {**body, "n_indent": 1})
    assert (cut["content"], cut["tokens_predicted"], cut["stop_type"]) == ("\n", 3, "limit")
    timed = complete(port, {**body, "t_max_predict_ms": 0.001})
    assert timed["stop_type"] == "limit" and timed["tokens_predicted"] == 2


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_code_completion_endings_hold_on_the_openai_routes(port, models, path):
    """llama-server ends any route's text at ``n_indent`` and ``t_max_predict_ms`` (they are the
    slot's): the same cuts as on /completion, finishing as the token limit does; a bad value is
    refused by name."""
    tokenizer = Tokenizer.from_folder(models["four"].parent)
    lines = {str(t): 100 for t in tokenizer.encode("\n", add_special_tokens=False)}
    body = {"max_tokens": 24, "temperature": 0, "ignore_eos": True, "logit_bias": lines}
    body |= (
        {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    )

    def text(extra: dict) -> tuple[str, str]:
        code, data = post(port, path, json.dumps({**body, **extra}).encode())
        assert code == 200, data
        choice = data["choices"][0]
        return choice["message"]["content"] if "chat" in path else choice["text"], choice[
            "finish_reason"
        ]

    assert text({}) == ("\n" * 24, "length")
    assert text({"n_indent": 1}) == ("\n", "length")
    assert text({"t_max_predict_ms": 0.001}) == ("\n" * 2, "length")
    for field, value in (("n_indent", -1), ("t_max_predict_ms", "soon")):
        code, data = post(port, path, json.dumps({**body, field: value}).encode())
        assert code == 400 and data["error"]["param"] == field, data


def test_infill_needs_the_models_fim_tokens(port):
    """SmolLM2's vocabulary has no FIM prefix, suffix or middle token: llama-server's 501 (a real
    llama-server on a model with them: test_infill_llama_server.py)."""
    code, data = post(
        port, "/infill", json.dumps({"input_prefix": "a", "input_suffix": "b"}).encode()
    )
    assert code == 501 and data["error"]["type"] == "not_supported_error", data
    assert data["error"]["message"].startswith("Infill is not supported by this model: prefix")


@pytest.mark.parametrize(
    ("extra", "prompt", "batch", "kept"),
    [
        ([], "", 2048, "REP {myproject\n} SEP {filename\n} PRE {prefix} SUF {suffix} MID"),
        ([("f.py", "x = 1")], "p", 2048,
         "REP {myproject\n} SEP {f.py\n} {x = 1} SEP {filename\n} PRE {prefix} {p} SUF {suffix} MID"),
        # 3/4 of the batch from the prefix; a quarter less 2 and the prompt from the suffix
        ([], "", 8, "REP {myproject\n} SEP {filename\n} PRE {prefix:-6} SUF MID"),
        ([], "p", 16, "REP {myproject\n} SEP {filename\n} PRE {prefix:-12} {p} SUF {suffix:1} MID"),
        # the context less the batch, plus 2, from the end of the extra chunks
        ([("f.py", "x = 1")], "", None, "SEP {filename\n} PRE {prefix} SUF {suffix} MID"),
    ],
)  # fmt: skip
def test_an_infill_prompt_is_built_as_llama_server_builds_it(models, extra, prompt, batch, kept):
    """Tokens in llama-server's order and cut to its shares of the batch and context (4096)."""
    from onnxsample.serve.infill import infill_tokens
    from onnxsample.text.llama_tokens import FimTokens

    tokenizer = Tokenizer.from_folder(models["four"].parent)
    names = {"PRE": "<|im_start|>", "SUF": "<|im_end|>", "MID": "<|endoftext|>",
             "REP": "<repo_name>", "SEP": "<file_sep>"}  # fmt: skip
    ids = {name: tokenizer.token_id(text) for name, text in names.items()}
    fim = FimTokens(ids["PRE"], ids["SUF"], ids["MID"], ids["REP"], ids["SEP"])

    def tokens(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False, parse_special=False)

    parts = {"prefix": tokens("one two three four five six seven eight nine ten"),
             "suffix": tokens("eleven twelve thirteen")}  # fmt: skip
    expected: list[int] = []
    for word in re.findall(r"\{[^}]*\}|\S+", kept):
        if word in ids:
            expected.append(ids[word])
            continue
        text, _, cut = word[1:-1].partition(":")
        found = parts.get(text, tokens(text.replace("\\n", "\n")))
        expected += found[int(cut) :] if cut.startswith("-") else found[: int(cut or len(found))]
    context = 4096 if batch else 2048 - 2 + 1 + len(tokens("filename\n"))
    got = infill_tokens(
        tokenizer, fim, parts["prefix"], parts["suffix"], extra, tokens(prompt), context,
        batch or 2048,
    )  # fmt: skip
    assert got == expected


def test_the_infill_sampler_of_a_greedy_request_keeps_the_greedy_token(port):
    """llama.cpp's infill sampler after a temperature of 0 sees one token and keeps it: no
    candidates needed (elsewhere it picks from a model's candidates:
    test_infill_llama_server.py)."""
    body = {"prompt": "Once upon a time", "n_predict": 6, "temperature": 0, "ignore_eos": True}
    listed = {**body, "samplers": ["top_k", "temperature", "infill"]}
    assert complete(port, listed)["content"] == complete(port, body)["content"]
    code, data = post(port, "/completion", json.dumps({**listed, "temperature": 0.7}).encode())
    assert code == 400 and "--candidates" in data["error"]["message"], data
    first = {**listed, "samplers": ["infill", "top_k", "temperature"]}
    code, data = post(port, "/completion", json.dumps(first).encode())
    assert code == 400 and "after every other sampler" in data["error"]["message"], data
