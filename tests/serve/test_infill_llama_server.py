"""``POST /infill`` held to a real llama-server on the same GGUF file: a tiny Qwen2 with Qwen2.5's
FIM tokens, converted by llama.cpp's own converter (tests/_fim_model.py). The same prompt token for
token (extra chunks, special tokens' texts in code, token ids among texts, a prefix and suffix cut
to llama-server's batch), the same greedy answer until a near-tie, the same ``response_fields``,
the same 501 on a file without FIM tokens, and llama.vim's own request (llama.cpp's ``infill``
sampler) answered with llama-server's tokens wherever its sampler left one token to draw."""

from __future__ import annotations

import json
from pathlib import Path

import _llama_cpp_models as models
import numpy as np
import onnx
import pytest
from _exports import export_beside, export_cached
from _fim_model import fim_gguf
from _http import post, served
from _llama_cpp import TOL, LlamaServer, same_answer_until_a_near_tie

pytestmark = pytest.mark.slow
CONTEXT = 8192  # both servers' positions per sequence: how much of the extra chunks is kept
CODE = "def twice(x):\n    return x * 2\n\n"
BODIES = {
    "extra chunks": {
        "input_prefix": "import os\n\ndef main():\n    ",
        "input_suffix": "\n\nif __name__ == '__main__':\n    main()\n",
        "input_extra": [{"filename": "util.py", "text": CODE}, {"text": "VALUE = 3\n"}],
        "prompt": "print(",
    },
    "special tokens in code": {
        "input_prefix": "s = '<|fim_prefix|><|im_start|>'\n",
        "input_suffix": "<|endoftext|>",
        "prompt": "<|im_start|>t",  # the prompt's special tokens are parsed
    },
    "token ids among texts": {"input_prefix": [750, "def", 25, " g():"], "input_suffix": []},
    "cut to the batch": {"input_prefix": CODE * 200, "input_suffix": CODE * 200, "prompt": "x"},
}
GREEDY = {"n_predict": 8, "temperature": 0, "ignore_eos": True, "return_tokens": True,
          "n_probs": 3}  # fmt: skip


@pytest.fixture(scope="module")
def answers(llama_cpp) -> dict[str, tuple[dict, dict]]:
    """Each request's answer from our server and from llama-server on the same file."""
    path = fim_gguf(llama_cpp)
    folder = export_cached(path, path.with_name(path.stem + "-onnx"), verify_tokens=0).output
    fields = {
        "input_prefix": "a",
        "input_suffix": "b",
        "n_predict": 0,
        "response_fields": [
            "content",
            "tokens_cached",
            "generation_settings/n_predict",
            "timings/prompt_n",
            "no/such",
        ],
    }
    # llama.vim's ring warm-up: extra chunks into the cache, no sampler, nothing to answer
    warm = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "prompt": "",
            "input_extra": [{"text": "def twice(x):\n    return 2 * x\n", "time": [1, 2],
                             "filename": "util.py"}],
            "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False,
            "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
            "response_fields": [""]}  # fmt: skip
    requests = {**{k: {**v, **GREEDY} for k, v in BODIES.items()}, "fields": fields, "warm": warm}
    found: dict[str, list] = {k: [] for k in requests}
    with served(folder, "--threads", "1", "--max-len", str(CONTEXT)) as ours:
        for name, body in requests.items():
            code, data = post(ours.port, "/infill", json.dumps(body).encode())
            assert code == 200, (name, data)
            found[name].append(data)
    with LlamaServer(llama_cpp, path, ctx=CONTEXT) as server:
        for name, body in requests.items():
            found[name].append(server.post("/infill", body))
    return {k: (v[0], v[1]) for k, v in found.items()}


@pytest.mark.parametrize("name", list(BODIES))
def test_the_prompt_and_answer_are_llama_servers(answers, name):
    mine, theirs = answers[name]
    assert mine["prompt"] == theirs["prompt"]
    for key in ("tokens_evaluated", "tokens_predicted", "tokens_cached", "stop_type"):
        assert mine[key] == theirs[key], key
    same_answer_until_a_near_tie(mine, theirs, GREEDY["n_predict"])


def test_the_prompt_keeps_what_llama_server_keeps(answers):
    mine, _ = answers["cut to the batch"]
    # of some 3,600 tokens each, the prefix keeps 1536 (3/4 of the batch of 2048) and the suffix
    # 509 (a quarter, less 2 and the prompt's token), beside the FIM and file tokens
    assert 2048 < mine["tokens_evaluated"] < 2048 + 16
    assert mine["prompt"].count("<|fim_prefix|>") == 1 and mine["prompt"].endswith("<|fim_middle|>")


def test_response_fields_and_a_zero_n_predict_are_llama_servers(answers):
    mine, theirs = answers["fields"]
    keys = ["content", "tokens_cached", "generation_settings/n_predict", "timings/prompt_n"]
    assert sorted(mine) == sorted(theirs) == sorted(keys)
    assert mine["timings/prompt_n"] == theirs["timings/prompt_n"] > 0
    assert mine["generation_settings/n_predict"] == theirs["generation_settings/n_predict"] == 0
    assert mine["tokens_cached"] == theirs["tokens_cached"]  # the prompt: one token, not fed back


def test_llama_vims_warm_up_is_answered_as_llama_server_answers_it(answers):
    """Its empty `samplers` beside a temperature was a 400, so the editor's context never
    reached the cache."""
    assert answers["warm"] == ({}, {})


def test_a_file_without_fim_tokens_is_a_501_as_on_llama_server(llama_cpp):
    path = models.gguf("qwen2", "Q8_0", llama_cpp)
    folder = export_beside(path, "Q8_0").output
    body = {"input_prefix": "a", "input_suffix": "b"}
    with served(folder, "--threads", "1") as ours:
        code, mine = post(ours.port, "/infill", json.dumps(body).encode())
    with LlamaServer(llama_cpp, path) as server:
        theirs = server.refused("/infill", body)
    assert code == theirs["error"]["code"] == 501
    for key in ("message", "type"):
        assert mine["error"][key] == theirs["error"][key], key


# llama.vim's request (llama.cpp's examples/llama.vim), and with fewer candidates, so that the
# infill sampler keeps several text tokens rather than falling back to the end of turn
VIM = {"input_suffix": "\n", "input_extra": [], "prompt": "", "n_predict": 8, "n_indent": 4,
       "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
       "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 3000, "seed": 3}  # fmt: skip
VIM_CASES = [
    {**VIM, "input_prefix": prefix, "top_k": k}
    for prefix in ("def add(a, b):\n    ", "import numpy as np\n", "for i in range(")
    for k in (40, 3, 2)
]


def _single_draws(answer: dict) -> int:
    """How many of llama-server's first tokens its sampler drew from one kept token (its
    ``post_sampling_probs``: what the chain left; a token without an entry of its own, which
    leaves a character unfinished, ends the count)."""
    entries = answer["completion_probabilities"]
    for step, (token, entry) in enumerate(zip(answer["tokens"], entries, strict=False)):
        if entry["id"] != token or len(entry["top_probs"]) != 1:
            return step
    return min(len(answer["tokens"]), len(entries))


SERVE_CANDIDATES = ("--candidates", "64", "--max-slots", "2")


@pytest.fixture(scope="module")
def candidates_model(fim_export) -> Path:
    """The FIM file's export composed with the candidates the infill sampler picks from, as
    `serve FOLDER --candidates 64 --max-slots 2` composes it (and then finds it up to date)."""
    from onnxsample.composer import composed_metadata
    from onnxsample.prepare import prepare

    composed = prepare(fim_export, candidates=64, max_slots=2)
    assert composed == fim_export / "composed-s2-c64.onnx"
    meta = composed_metadata(onnx.load(str(composed), load_external_data=False))
    assert (meta.output_candidates, meta.draft_tokens) == (64, 0)
    return composed


@pytest.fixture(scope="module")
def vim_answers(llama_cpp, fim_export, candidates_model) -> list[tuple[dict, dict]]:
    """llama.vim's requests, ours (`serve FOLDER --candidates 64`) and llama-server's (with its
    post-sampling probabilities: what its chain left to draw from at each token)."""
    mine = []
    args = ("--threads", "1", "--max-len", str(CONTEXT), *SERVE_CANDIDATES)
    with served(fim_export, *args) as ours:
        for body in VIM_CASES:
            code, data = post(
                ours.port, "/infill", json.dumps({**body, "return_tokens": True}).encode()
            )
            assert code == 200, (body, data)
            mine.append(data)
        plain = {**VIM, "input_prefix": "x", "samplers": ["infill", "top_k"]}
        code, data = post(ours.port, "/infill", json.dumps(plain).encode())
        assert (
            code == 400
            and "infill runs once, after every other sampler" in data["error"]["message"]
        )
    extra = {"return_tokens": True, "n_probs": 64, "post_sampling_probs": True}
    with LlamaServer(llama_cpp, fim_gguf(llama_cpp), ctx=CONTEXT) as server:
        theirs = [server.post("/infill", {**body, **extra}) for body in VIM_CASES]
        # the same draws again (the same seed), with the model's own distribution at each token
        raw = [server.post("/infill", {**body, **extra, "post_sampling_probs": False})
               for body in VIM_CASES]  # fmt: skip
    for a, b in zip(theirs, raw, strict=True):
        assert a["tokens"] == b["tokens"]
        for entry, model in zip(a["completion_probabilities"], b["completion_probabilities"],
                                strict=True):  # fmt: skip
            entry["raw"] = [t["logprob"] for t in model["top_logprobs"]]
    return list(zip(mine, theirs, strict=True))


def test_llama_vims_request_gets_llama_servers_tokens(vim_answers):
    """Through the host's infill sampler on a model composed with candidates, up to the first
    draw among several tokens (the two servers' random generators differ)."""
    single = 0
    for mine, theirs in vim_answers:
        same = _single_draws(theirs)
        assert mine["tokens"][:same] == theirs["tokens"][:same], (mine, theirs)
        if same == len(theirs["tokens"]):
            assert (mine["content"], mine["stop_type"]) == (theirs["content"], theirs["stop_type"])
        single += same
    assert single >= 3, single  # top_k 40 leaves one token (often the end of turn)


def test_the_infill_sampler_keeps_what_llama_servers_keeps(vim_answers, candidates_model):
    """At each of llama-server's tokens, the same prompt and the tokens before it given to our
    engine: the infill sampler keeps the same tokens, their log-probabilities within TOL (the two
    sides' logits differ by their int8 activations)."""
    from onnxsample import Engine, SamplingParams
    from onnxsample.serve.infill import infill_body, with_infill_sampler

    compared = 0
    with Engine(candidates_model, threads=1, max_len=CONTEXT) as engine:
        for body, (_, theirs) in zip(VIM_CASES, vim_answers, strict=True):
            prompt = infill_body(engine.tokenizer, engine.limit, body)["prompt"]
            (params,) = with_infill_sampler(
                engine, [SamplingParams(top_k=body["top_k"], top_p=0.99)]
            )
            infill = params.host_sampler
            tokens = theirs["tokens"]
            for step, entry in enumerate(theirs["completion_probabilities"][: len(tokens)]):
                if entry["id"] != tokens[step]:
                    break  # a token that left a character unfinished has no entry of its own
                seen = []

                def record(ids, logits, seen=seen, infill=infill):
                    seen.append(infill.kept(ids, logits))
                    return int(seen[-1][0][0])

                forced = SamplingParams(top_k=body["top_k"], top_p=0.99, host_sampler=record)
                engine.submit(prompt + tokens[:step], forced, max_new_tokens=1, chat=False).result(
                    60
                )
                ids, logits = seen[0]
                probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
                mine = dict(zip(ids.tolist(), probs.tolist(), strict=True))
                their = {t["id"]: t["prob"] for t in entry["top_probs"]}
                if mine.keys() != their.keys():
                    # only where llama.cpp's k-th and next most likely tokens are within the two
                    # sides' difference (2 * TOL), so that top-k keeps one here and one there
                    raw = entry["raw"]
                    k = body["top_k"]
                    assert raw[k - 1] - raw[k] < 2 * TOL, (body, step, mine, their, raw[: k + 1])
                    continue
                close = all(abs(np.log(mine[t]) - np.log(their[t])) < TOL for t in mine)
                assert close, (body, step, mine, their)
                compared += 1
    assert compared >= 2 * len(VIM_CASES), compared


def test_the_infill_sampler_needs_a_model_with_candidates(answers, fim_export):
    with served(fim_export, "--threads", "1") as ours:
        code, data = post(ours.port, "/infill", json.dumps({**VIM, "input_prefix": "x"}).encode())
    assert code == 400 and "serve MODEL --candidates 64" in data["error"]["message"], data
