"""llama-server's ``post_sampling_probs``, held to a real llama-server on the same GGUF file (a tiny
Qwen2 converted by llama.cpp's own converter): with ``n_probs``, ``/completion`` answers the
probabilities of the distribution the draw uses, after the whole chain. The same kept tokens, most
likely first, their probabilities within TOL in log space, the same entry's keys and types; and
the chat route's ``logprobs`` in the same form."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest
from _fim_model import fim_gguf
from _http import post, served
from _llama_cpp import TOL, LlamaServer

pytestmark = pytest.mark.slow
PROMPT = "def fibonacci(n):\n    "
N_PROBS = 12
# llama-server's sampler order (the temperature after the cuts) is listed, as its web UI lists it
ORDER = ["top_k", "typ_p", "top_p", "min_p", "temperature"]
# every cut set: a field left out takes each server's own default (llama-server: top-p 0.95)
OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0}
CASES = {
    "top_k": {**OFF, "top_k": 10, "temperature": 0.8},
    "the web UI's cuts": {**OFF, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 0.8},
    "min_p": {**OFF, "top_k": 60, "min_p": 0.02, "temperature": 1.5},
    "top_p": {**OFF, "top_k": 50, "top_p": 0.5, "temperature": 1.0},
    "greedy": {**OFF, "temperature": 0},
    # no sampling field and no samplers: each server's defaults for /completion, llama-server's
    "defaults": {},
}


# no top-k: kept sets past any candidates, read from a model composed with sampler.probs
WIDE_TOL = 0.2
WIDE = {
    "top_p, no top_k": {**OFF, "top_p": 0.9, "temperature": 0.9},
    "min_p, no top_k": {**OFF, "min_p": 0.01, "temperature": 1.2},
    "no cut": {**OFF, "temperature": 1.0},
}


def _body(case: dict) -> dict:
    order = {"samplers": ORDER} if case else {}
    return {"prompt": PROMPT, "n_predict": 1, "seed": 5, **order, "n_probs": N_PROBS,
            "post_sampling_probs": True, "cache_prompt": False, **case}  # fmt: skip


def _events(port: int, path: str, body: dict) -> list[dict]:
    """A stream's events, as JSON."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    lines = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


@pytest.fixture(scope="module")
def answers(llama_cpp, fim_export) -> dict[str, tuple[dict, dict]]:
    """Each case's first token, ours (`serve FOLDER --candidates 64`; the wide ones `serve
    FOLDER --output-probs`) and llama-server's."""
    mine = {}
    with served(fim_export, "--threads", "1", "--candidates", "64", "--max-slots", "2") as ours:
        for name, case in CASES.items():
            code, data = post(ours.port, "/completion", json.dumps(_body(case)).encode())
            assert code == 200, (name, data)
            mine[name] = data
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "top_k": 5,
                "logprobs": True, "top_logprobs": 3, "post_sampling_probs": True}  # fmt: skip
        code, data = post(ours.port, "/v1/chat/completions", json.dumps(chat).encode())
        assert code == 200, data
        mine["chat"] = data
        wide = _body({**OFF, "temperature": 1.0})  # the filters keep the whole vocabulary
        mine["wide"] = post(ours.port, "/completion", json.dumps(wide).encode())
        # a cut that keeps thousands of the tiny model's flat distribution: past them at a step
        wide = {**wide, "top_p": 0.999}
        streamed = {**chat, "stream": True, "top_k": 0, "top_p": 0.999}
        mine["wide at a step"] = post(ours.port, "/completion", json.dumps(wide).encode())
        mine["wide streams"] = [
            _events(ours.port, "/completion", {**wide, "stream": True}),
            _events(ours.port, "/v1/chat/completions", streamed),
        ]
    with served(fim_export, "--threads", "1", "--output-probs", "--max-slots", "2") as ours:
        for name, case in WIDE.items():
            code, data = post(ours.port, "/completion", json.dumps(_body(case)).encode())
            assert code == 200, (name, data)
            mine[name] = data
    found = {}
    with LlamaServer(llama_cpp, fim_gguf(llama_cpp)) as server:
        for name, case in {**CASES, **WIDE}.items():
            found[name] = (mine[name], server.post("/completion", _body(case)))
    found["chat"] = (mine["chat"], {})
    found["wide"] = mine["wide"]
    found["wide at a step"] = mine["wide at a step"]
    found["wide streams"] = mine["wide streams"]
    return found


@pytest.mark.parametrize("name", list(CASES))
def test_the_kept_distribution_is_llama_servers(answers, name):
    mine, theirs = answers[name]
    (entry,) = mine["completion_probabilities"]
    (their,) = theirs["completion_probabilities"]
    assert list(entry) == list(their) == ["id", "token", "bytes", "prob", "top_probs"]
    assert [list(t) for t in entry["top_probs"]] == [["id", "token", "bytes", "prob"]] * len(
        entry["top_probs"]
    )
    assert mine["generation_settings"]["post_sampling_probs"] is True
    if name == "defaults":  # what a request that sets nothing gets is llama-server's
        keys = ("temperature", "top_k", "top_p", "min_p", "typical_p")
        settings = [
            {k: answer["generation_settings"][k] for k in keys} for answer in (mine, theirs)
        ]
        assert settings[0] == pytest.approx(settings[1]), settings
    ours = {t["id"]: t["prob"] for t in entry["top_probs"]}
    them = {t["id"]: t["prob"] for t in their["top_probs"]}
    assert list(ours.values()) == sorted(ours.values(), reverse=True)
    if name == "greedy":
        assert ours == them == {entry["id"]: 1.0} and entry["prob"] == 1.0
        assert entry["id"] == their["id"]
        return
    if entry["id"] in ours:  # the token drawn is in the kept set, at its probability there
        assert entry["prob"] == ours[entry["id"]]
    assert sum(ours.values()) == pytest.approx(1.0, abs=1e-5) or len(ours) == N_PROBS
    if ours.keys() != them.keys():
        # a cut's boundary between two tokens that the two sides' logits (TOL apart) order
        # differently: one side keeps a token or two more, the shared ones compared among
        # themselves
        short, long = sorted((ours, them), key=len)
        assert short.keys() < long.keys() and len(long) - len(short) <= 2, (name, ours, them)
        shared = sum(ours[t] for t in short), sum(them[t] for t in short)
        ours = {t: ours[t] / shared[0] for t in short}
        them = {t: them[t] / shared[1] for t in short}
    for t in ours:
        assert abs(np.log(ours[t]) - np.log(them[t])) < TOL, (name, t, ours, them)


@pytest.mark.parametrize("name", list(WIDE))
def test_any_kept_set_is_llama_servers_with_the_whole_distribution(answers, name):
    """Kept sets of many tokens: the N_PROBS most likely are llama-server's (the last one or two
    may trade places with the next across the two sides' logits), each within TOL in log space,
    normalised over the whole kept set."""
    mine, theirs = answers[name]
    (entry,) = mine["completion_probabilities"]
    (their,) = theirs["completion_probabilities"]
    assert list(entry) == list(their) == ["id", "token", "bytes", "prob", "top_probs"]
    ours = {t["id"]: t["prob"] for t in entry["top_probs"]}
    them = {t["id"]: t["prob"] for t in their["top_probs"]}
    assert len(ours) == len(them) == N_PROBS
    assert sum(ours.values()) < 1 - 1e-3  # the kept set is past the tokens listed
    assert list(ours.values()) == sorted(ours.values(), reverse=True)
    assert list(ours)[:2] == list(them)[:2], (ours, them)
    shared = ours.keys() & them.keys()
    assert len(shared) >= N_PROBS - 2, (ours, them)
    for t in shared:  # tighter than TOL: 0.12 at most on this file
        assert abs(np.log(ours[t]) - np.log(them[t])) < WIDE_TOL, (name, t, ours, them)
    assert 0 < entry["prob"] <= max(ours.values())  # the token drawn, seldom among those listed
    if entry["id"] in ours:
        assert entry["prob"] == ours[entry["id"]]


def test_the_chat_routes_logprobs_take_llama_servers_form(answers):
    mine, _ = answers["chat"]
    content = mine["choices"][0]["logprobs"]["content"]
    assert content and all(list(e) == ["id", "token", "bytes", "prob", "top_probs"]
                           for e in content)  # fmt: skip
    for e in content:
        probs = [t["prob"] for t in e["top_probs"]]
        assert 1 <= len(probs) <= 3 and probs == sorted(probs, reverse=True)
        assert e["prob"] in probs or e["prob"] <= probs[-1]


@pytest.mark.parametrize(
    ("case", "said"),
    [("wide", "with no filter the distribution keeps every token"), ("wide at a step", "kept")],
)
def test_a_kept_set_past_the_candidates_is_a_400_naming_the_fix(answers, case, said):
    """No filter at all is refused before any work; a cut that keeps too many at a step then."""
    code, data = answers[case]
    assert code == 400 and data["error"]["param"] == "post_sampling_probs", data
    assert said in data["error"]["message"], data
    assert "past the model's 64 candidates" in data["error"]["message"], data


def test_in_a_stream_it_ends_with_that_400s_error(answers):
    for events in answers["wide streams"]:
        error = events[-1]["error"]
        assert (error["code"], error["type"]) == (400, "invalid_request_error"), events[-1]
        assert error["param"] == "post_sampling_probs", events[-1]
