"""llama-server's own routes held to llama-server on the same file (the families' fixtures of
tests/_llama_cpp_models.py, converted and quantised by llama.cpp's own tools): `/tokenize` and
`/detokenize`, `/props`, `/completion` whole and streamed, `/apply-template`, and the prompts a
chat's template, variables and ``reasoning_effort`` make, id for id."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import _llama_cpp_models as models
import pytest
from _exports import export_beside
from _hard_texts import HARD
from _http import get, post, served
from _llama_cpp import TOL, LlamaServer, same_answer_until_a_near_tie

from onnxsample.text import Tokenizer

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("family", ["gemma3", "llama3", "qwen2", "llama", "phi3"])
def test_the_servers_tokenize_answers_as_llama_servers(family, llama_cpp):
    """`/tokenize` with llama-server's fields (``content``, ``add_special``, ``parse_special``,
    ``with_pieces``) gives llama-server's JSON on the same file: BOS only when asked, special
    tokens' text read as text with ``parse_special: false``, and each piece as text or, where a
    byte-fallback piece is part of a character (Gemma's emoji), as its bytes; `/detokenize` of
    those ids gives llama-server's text, special tokens' text included."""
    path = models.gguf(family, "Q8_0", llama_cpp)
    folder = export_beside(path, "Q8_0").output
    texts = [*HARD[:30], models.CHAT[family]]
    bodies = [
        {"content": t, **extra}
        for t in texts
        for extra in (
            {},
            {"add_special": True},
            {"add_special": False, "with_pieces": True},
            {"add_special": True, "parse_special": False},
        )
    ]
    with LlamaServer(llama_cpp, path) as theirs, served(folder, "--threads", "1") as ours:
        wrong = [
            (body, want, got)
            for body in bodies
            if (want := theirs.post("/tokenize", body)["tokens"])
            != (got := post(ours.port, "/tokenize", json.dumps(body).encode())[1]["tokens"])
        ]
        assert not wrong, f"{len(wrong)} of {len(bodies)} differ, first: {wrong[0]}"
        ids = [theirs.tokenize(text) for text in texts]  # and without BOS: a word's space first
        ids += [
            theirs.post("/tokenize", {"content": t, "add_special": False})["tokens"] for t in texts
        ]
        unlike = [
            (want, got)
            for i in ids
            if (want := theirs.post("/detokenize", {"tokens": i})["content"])
            != (
                got := post(ours.port, "/detokenize", json.dumps({"tokens": i}).encode())[1][
                    "content"
                ]
            )
        ]
    assert not unlike, f"{len(unlike)} of {len(ids)} differ, first: {unlike[0]}"


# llama-server's prompt forms beyond OpenAI's: text and ids mixed (BOS only where text comes
# first), and a list of prompts of different forms
MIXED = [
    [15, " the cat", 16],
    ["Hello", 15, " world"],
    ["one", [15, 16], ["two", 17], [18, "three"]],
]


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # SentencePiece with BOS; BPE without
def test_mixed_prompts_are_read_as_llama_server_reads_them(family, llama_cpp):
    """`/completion`'s prompt of text and ids together: the same prompt tokens as llama-server's
    on the same file (its text and count), one answer a prompt; and `/tokenize`'s content so, with
    BOS and without."""
    path = models.gguf(family, "Q8_0", llama_cpp)
    folder = export_beside(path, "Q8_0").output

    def read(answer: dict | list) -> list:
        return [
            (a["prompt"], a["tokens_evaluated"])
            for a in (answer if isinstance(answer, list) else [answer])
        ]

    with LlamaServer(llama_cpp, path) as theirs, served(folder, "--threads", "1") as ours:
        for prompt in MIXED:
            body = {"prompt": prompt, "n_predict": 1, "temperature": 0}
            code, mine = post(ours.port, "/completion", json.dumps(body).encode())
            assert code == 200, mine
            assert read(mine) == read(theirs.post("/completion", body)), prompt
        for content in (MIXED[0], MIXED[1]):
            for bos in (True, False):
                body = {"content": content, "add_special": bos}
                want = theirs.post("/tokenize", body)["tokens"]
                code, got = post(ours.port, "/tokenize", json.dumps(body).encode())
                assert (code, got["tokens"]) == (200, want), (content, bos)


_JSON_KINDS = (bool, int, float, str, list, dict, type(None))


def _same_kinds(ours, theirs, where: str = "") -> list[str]:
    """Where `ours` has a key `theirs` lacks, or a value of another JSON type."""
    kind = [next(k for k in _JSON_KINDS if isinstance(v, k)) for v in (ours, theirs)]
    if kind[0] is not kind[1]:
        return [f"{where}: {ours!r} where llama-server has {theirs!r}"]
    if kind[0] is not dict:
        return []
    problems = []
    for key, value in ours.items():
        if key not in theirs:
            problems.append(f"{where}.{key}: not llama-server's")
        else:
            problems += _same_kinds(value, theirs[key], f"{where}.{key}")
    return problems


def test_props_answer_as_llama_servers(llama_cpp):
    """`/props`, which llama.cpp's web UI reads when it opens: only llama-server's keys, each
    with a value of the same JSON type, and on the same file the same chat template, BOS, EOS,
    context and modalities."""
    path = models.gguf("qwen2", "Q8_0", llama_cpp)
    with served(export_beside(path, "Q8_0").output, "--threads", "1") as ours:
        code, raw = get(ours.port, "/props")
    assert code == 200, raw
    mine = json.loads(raw)
    n_ctx = mine["default_generation_settings"]["n_ctx"]
    with LlamaServer(llama_cpp, path, ctx=n_ctx, args=("--jinja",)) as theirs:
        want = theirs.get("/props")
    assert _same_kinds(mine, want) == []
    for key in ("chat_template", "bos_token", "eos_token", "modalities"):
        assert mine[key] == want[key], key
    assert want["default_generation_settings"]["n_ctx"] == n_ctx


def _events(url: str, body: dict) -> list[dict]:
    """A streamed /completion's events from the server at `url`."""

    conn = http.client.HTTPConnection(urlsplit(url).hostname, urlsplit(url).port, timeout=300)
    try:
        conn.request("POST", "/completion", json.dumps({**body, "stream": True}).encode(),
                     {"Content-Type": "application/json"})  # fmt: skip
        lines = conn.getresponse().read().decode().split("\n\n")
    finally:
        conn.close()
    return [json.loads(line.removeprefix("data: ")) for line in lines if line]


def test_completion_answers_as_llama_servers(llama_cpp):
    """`POST /completion`, llama-server's own endpoint, on the same file and request: only
    llama-server's keys, each with a value of its JSON type, whole and streamed (no ``[DONE]``
    on either; with ``timings_per_token``, the timings on every event, and with
    ``return_progress`` the prompt's progress first); the same prompt, ``stop_type`` and counts; the same greedy tokens until llama.cpp's
    top two come within 2 * TOL of each other, and its likely tokens' logprobs within TOL there."""
    path = models.gguf("qwen2", "Q8_0", llama_cpp)
    body = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0,
            "ignore_eos": True, "return_tokens": True, "n_probs": 3}  # fmt: skip
    folder = export_beside(path, "Q8_0").output
    eos = Tokenizer.from_folder(folder).eos_token_id  # biased: the answer ends at once
    ending = {**body, "logit_bias": [[eos, 100]], "ignore_eos": False, "n_probs": 2}
    timed = {**body, "timings_per_token": True, "return_progress": True}
    with served(folder, "--threads", "1") as ours:
        code, mine = post(ours.port, "/completion", json.dumps(body).encode())
        my_events = _events(f"http://127.0.0.1:{ours.port}", body)
        my_end = post(ours.port, "/completion", json.dumps(ending).encode())[1]
        my_end_events = _events(f"http://127.0.0.1:{ours.port}", ending)
        my_timed = _events(f"http://127.0.0.1:{ours.port}", timed)
    assert code == 200, mine
    with LlamaServer(llama_cpp, path) as server:
        theirs = server.post("/completion", body)
        their_events = _events(server.url, body)
        their_end = server.post("/completion", ending)
        their_end_events = _events(server.url, ending)
        their_timed = _events(server.url, timed)
    keys = ("content", "tokens", "tokens_predicted", "stop_type")
    assert [my_end[k] for k in keys] == [their_end[k] for k in keys] == ["", [eos], 1, "eos"]
    pieces = [
        [(e["tokens"], e["content"], e["stop"]) for e in ev]
        for ev in (my_end_events, their_end_events)
    ]
    assert pieces[0] == pieces[1], pieces
    # the end-of-sequence token has its entry, without text, whole and streamed; its logprob
    # is the model's (the bias is the sampler's)
    for answer in (my_end, their_end, my_end_events[0], their_end_events[0]):
        [entry] = answer["completion_probabilities"]
        assert (entry["id"], entry["token"], entry["bytes"]) == (eos, "", []), answer
    lps = [a["completion_probabilities"][0]["logprob"] for a in (my_end, their_end)]
    assert abs(lps[0] - lps[1]) < TOL and lps[0] < -0.5, lps
    assert my_end_events[0]["completion_probabilities"][0]["logprob"] == lps[0]
    assert _same_kinds(mine, theirs) == []
    for key in ("prompt", "stop_type", "tokens_evaluated", "tokens_predicted", "stop"):
        assert mine[key] == theirs[key], key
    same = same_answer_until_a_near_tie(mine, theirs, 12)
    assert [e["stop"] for e in their_events][-1] and [e["stop"] for e in my_events][-1]
    for mine_event in my_events:
        assert _same_kinds(mine_event, their_events[0 if not mine_event["stop"] else -1]) == []
    streamed = [
        [(e["tokens"], e["content"]) for e in ev[:-1]][:same] for ev in (my_events, their_events)
    ]
    assert streamed[0] == streamed[1]  # an event a token, with the text it lets out
    # timings_per_token: every event has llama-server's timings, counting the tokens so far;
    # return_progress: events without a token first (llama-server lists token 0 in them, we
    # list none), from the cached part of the prompt to all of it
    before, tokens = [], []
    for events in (my_timed, their_timed):
        first = next(i for i, e in enumerate(events) if "prompt_progress" not in e)
        before.append(events[:first])
        tokens.append(events[first:])
        counts = [e["timings"]["predicted_n"] for e in tokens[-1][:-1]]
        assert counts and counts == [e["tokens_predicted"] for e in tokens[-1][:-1]], events
    for mine, theirs in (before, tokens):
        for mine_event in mine:
            their_event = theirs[0 if not mine_event["stop"] else -1]
            assert _same_kinds(mine_event, their_event) == []
            assert mine_event["timings"].keys() == their_event["timings"].keys()
    progress = [[e["prompt_progress"] for e in events] for events in before]
    for mine, theirs in zip(*progress, strict=False):
        assert mine.keys() == theirs.keys() and mine["total"] == theirs["total"]
    assert [p[-1]["processed"] for p in progress] == [p[-1]["total"] for p in progress]


CHATS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "An apple."},
     {"role": "user", "content": "Another?"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Bonjour"}, {"role": "user", "content": "Thanks"}],
]  # fmt: skip


@pytest.mark.parametrize("family", ["phi3", "qwen2", "qwen3"])  # the files with a chat template
def test_chats_are_the_prompts_llama_server_makes_of_them(family, llama_cpp):
    """llama-server --jinja renders the file's template and tokenises the text with the BOS its
    vocabulary adds: the same ids as ours, system messages included (Phi-3's template writes
    none, so both put the system's text at the start of the user's turn)."""
    path = models.gguf(family, "Q8_0", llama_cpp)
    tokenizer = Tokenizer.from_folder(export_beside(path, "Q8_0").output)
    assert tokenizer.chat_template
    with LlamaServer(llama_cpp, path, args=("--jinja",)) as server:
        for chat in CHATS:
            text = server.post("/apply-template", {"messages": chat})["prompt"]
            assert tokenizer.apply_chat_template(chat) == server.tokenize(text), (chat, text)
            assert chat[0]["role"] != "system" or chat[0]["content"] in text


# Qwen3's switch: enable_thinking false writes an empty thought after the generation prompt.
THINKING = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)


def test_template_variables_render_as_llama_server_renders_them(llama_cpp, tmp_path):
    """A request's ``chat_template_kwargs`` (here Qwen3's ``enable_thinking``) with a template
    given in place of the file's (`--chat-template-file`, ours `--chat-template`): the same ids.
    Given no value, llama-server passes its own (false unless it knows the template for a
    reasoning one) where transformers and vLLM leave it undefined, so only given values compare."""
    path = models.gguf("qwen3", "Q8_0", llama_cpp)
    (tmp_path / "thinking.jinja").write_text(THINKING)
    tokenizer = Tokenizer.from_folder(export_beside(path, "Q8_0").output).with_chat_template(
        THINKING
    )
    args = ("--jinja", "--chat-template-file", str(tmp_path / "thinking.jinja"))
    with LlamaServer(llama_cpp, path, args=args) as server:
        for variables in ({"enable_thinking": False}, {"enable_thinking": True}):
            body = {"messages": CHATS[1], "chat_template_kwargs": variables}
            text = server.post("/apply-template", body)["prompt"]
            ours = tokenizer.apply_chat_template(CHATS[1], variables=variables)
            assert ours == server.tokenize(text), (variables, text)
            assert ("<think>" in text) == (variables["enable_thinking"] is False)


# OpenAI's reasoning_effort, as llama-server passes it: the variable, or "none" as enable_thinking.
EFFORT = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if reasoning_effort is defined %}{{ 'effort: ' + reasoning_effort + '\\n' }}{% endif %}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)


def test_reasoning_effort_reaches_the_template_as_in_llama_server(llama_cpp, tmp_path):
    """A chat's ``reasoning_effort`` through `/tokenize` (the chat route's prompt): the ids of
    llama-server's rendering of the same request with the same template."""
    path = models.gguf("qwen3", "Q8_0", llama_cpp)
    template = tmp_path / "effort.jinja"
    template.write_text(EFFORT)
    folder = export_beside(path, "Q8_0").output
    args = ("--jinja", "--chat-template-file", str(template))
    with (
        LlamaServer(llama_cpp, path, args=args) as theirs,
        served(folder, "--threads", "1", "--chat-template", str(template)) as ours,
    ):
        # llama-server gives enable_thinking a value of its own where none is given: pinned
        for effort, thinking, shown in (("high", True, "effort: high"), ("none", None, "<think>")):
            body = {"messages": CHATS[1], "reasoning_effort": effort}
            if thinking is not None:
                body["chat_template_kwargs"] = {"enable_thinking": thinking}
            text = theirs.post("/apply-template", body)["prompt"]
            got = post(ours.port, "/tokenize", json.dumps(body).encode())[1]["tokens"]
            assert got == theirs.tokenize(text), (effort, text)
            assert shown in text


# Llama 3's way: the template writes the BOS that the vocabulary also adds when it tokenises.
BOS_FIRST = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>"
    "\\n\\n' + m.content + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


# Gemma 3's way: a message's content may be a list of parts, which the template joins itself.
PARTS = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{% if m.content is string %}"
    "{{ m.content | trim }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}"
    "{{ p.text | trim }}{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.parametrize(
    ("family", "template"),
    [("phi3", None), ("qwen3", None), ("llama3", BOS_FIRST), ("qwen3", PARTS)],
    ids=["phi3", "qwen3", "llama3-bos-first", "qwen3-parts"],
)
def test_apply_template_answers_as_llama_server(family, template, llama_cpp, tmp_path):
    """`/apply-template` on the same file (or template): llama-server's text, the BOS a template
    writes left out where the vocabulary adds one (Llama 3's), a message's text parts joined by
    a template that reads them as a list (Gemma 3's) or else by newlines; the chat route's ids
    are that text tokenised as llama-server tokenises a prompt."""
    path = models.gguf(family, "Q8_0", llama_cpp)
    theirs_args, ours_args = ("--jinja",), ()
    if template is not None:
        (tmp_path / "chat.jinja").write_text(template)
        theirs_args += ("--chat-template-file", str(tmp_path / "chat.jinja"))
        ours_args = ("--chat-template", str(tmp_path / "chat.jinja"))
    bodies = [{"messages": chat} for chat in CHATS]
    bodies.append({"messages": CHATS[1], "chat_template_kwargs": {"enable_thinking": False}})
    bodies.append({"messages": CHATS[1], "add_generation_prompt": False})
    parts = [{"type": "text", "text": "Name a fruit."}, {"type": "text", "text": "Be brief."}]
    bodies.append({"messages": [{"role": "user", "content": parts}]})  # joined by a newline
    parts = [{"type": "text", "text": ""}, {"type": "text", "text": " Go. "}]
    bodies.append({"messages": [{"role": "user", "content": parts}]})  # or by the template
    folder = export_beside(path, "Q8_0").output
    with (
        LlamaServer(llama_cpp, path, args=theirs_args) as theirs,
        served(folder, "--threads", "1", *ours_args) as ours,
    ):
        for body in bodies:
            text = theirs.post("/apply-template", body)["prompt"]
            raw = json.dumps(body).encode()
            assert post(ours.port, "/apply-template", raw) == (200, {"prompt": text}), body
            assert post(ours.port, "/tokenize", raw)[1]["tokens"] == theirs.tokenize(text), body
    assert template != BOS_FIRST or not text.startswith("<|begin_of_text|>"), text
