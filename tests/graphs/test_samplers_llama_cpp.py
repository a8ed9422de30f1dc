"""The sampler chain held to llama.cpp's own samplers, and the server's reading of llama-server's
``samplers`` field held to what llama-server does with it.

llama-server gives, for one prompt, the raw distribution of the next token (its top N logprobs)
and the distribution its sampler chain leaves for the draw (``post_sampling_probs``: the kept
tokens with their probabilities), running its samplers in the order ``samplers`` lists (read
by :func:`~onnxsample.serve.llama_fields.apply_llama_names`: the temperature last where only that
order gives the listed one). Every
case here keeps top-k (k < N) ahead of the cuts that read a mass (top-p, typical-p), so what
either chain leaves depends on those N tokens alone: our sampler graph runs on a row holding
llama.cpp's N logprobs (every other token -inf). Where
:func:`~onnxsample.serve.llama_fields.order_refusal` lets the order through, it must leave the same
tokens with the same probabilities (within float32 rounding) on every prompt; where it refuses the
order, another distribution on at least one. The model is the embedded SmolLM2-135M-Instruct's
GGUF: a trained model, whose distributions the cuts bite into (1 to 40 tokens kept here).
"""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
from _llama_cpp import LlamaServer

from onnxsample import SamplingParams, sampler_feeds
from onnxsample.composer.sampler_model import sampler_session
from onnxsample.exporters import embedded_gguf
from onnxsample.serve.llama_fields import apply_llama_names, order_refusal
from onnxsample.serve.schemas import CompletionRequest

CHAIN = "temperature,top_k,top_p,min_p,typical_p,dist"
N = 100  # llama.cpp's raw logprobs read: more than any top_k below
PROMPTS = ["The capital of France is", "def fibonacci(n):\n   ", "My favourite colour is"]
OURS = ["penalties", "temperature", "top_k", "top_p", "min_p", "typ_p"]  # this server's order
WEB_UI = ["top_k", "typ_p", "top_p", "min_p", "temperature"]  # llama.cpp's default

# (llama-server's samplers, the request's sampling fields, how the server reads the order:
# "first" our order, "last" with temperature_last, None refused)
CASES = [
    (OURS, {"temperature": 0.7, "top_k": 40, "top_p": 0.9}, "first"),
    (OURS, {"temperature": 1.5, "top_k": 40, "min_p": 0.05}, "first"),
    (OURS, {"temperature": 0.8, "top_k": 40, "typical_p": 0.9}, "first"),
    (OURS, {"temperature": 1.2, "top_k": 50, "top_p": 0.95, "min_p": 0.02, "typical_p": 0.95},
     "first"),
    (WEB_UI, {"temperature": 0.7, "top_k": 40}, "first"),  # top-k and temperature commute
    (WEB_UI, {"temperature": 0.6, "top_k": 30, "min_p": 0.1}, "last"),
    ("kypmt", {"temperature": 1.0, "top_k": 40, "top_p": 0.8}, "first"),  # temperature 1: none
    (WEB_UI, {"temperature": 0.0, "top_k": 40, "top_p": 0.5}, "first"),  # greedy: one token
    (WEB_UI, {"temperature": 0.7, "top_k": 40, "top_p": 0.9}, "last"),
    (WEB_UI, {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}, "last"),  # web UI
    (WEB_UI, {"temperature": 1.6, "top_k": 40, "min_p": 0.05}, "last"),
    (["top_k", "top_p", "typ_p", "temperature"], {"temperature": 0.6, "top_k": 40,
                                                   "typical_p": 0.9}, "last"),
    (["top_k", "min_p", "top_p", "temperature"], {"temperature": 1.0, "top_k": 40, "top_p": 0.9,
                                                  "min_p": 0.05}, None),  # top-p after min-p
    (["top_k", "top_p", "temperature", "min_p"], {"temperature": 1.6, "top_k": 40, "top_p": 0.9,
                                                  "min_p": 0.1}, None),  # temperature between
    (WEB_UI, {"temperature": 1.5, "top_k": 40, "top_p": 0.8, "typical_p": 0.5},
     None),  # typical-p before top-p
]  # fmt: skip


@pytest.fixture(scope="module")
def server(llama_cpp):
    with LlamaServer(llama_cpp, embedded_gguf()) as running:
        yield running


@pytest.fixture(scope="module")
def session(server):
    """Our sampler graph for one slot over llama.cpp's vocabulary, with its final distribution."""
    with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as r:
        vocab = int(json.loads(r.read())["data"][0]["meta"]["n_vocab"])
    return sampler_session(CHAIN, vocab, 1, output_probs=True), vocab


def _llama(server: LlamaServer, ids: list[int], samplers, fields: dict, post: bool) -> dict:
    """llama.cpp's next-token distribution after `ids`: {id: probability} after its chain (post),
    or {id: logprob} of the raw distribution's top N."""
    body = {
        "prompt": ids,
        "n_predict": 1,
        "n_probs": N,
        "post_sampling_probs": post,
        "samplers": samplers,
        "cache_prompt": False,
        "seed": 1,
        "top_p": 1.0,
        "min_p": 0.0,
        "typical_p": 1.0,
        "repeat_penalty": 1.0,
        **fields,
    }
    step = server.post("/completion", body)["completion_probabilities"][0]
    key, value = ("top_probs", "prob") if post else ("top_logprobs", "logprob")
    return {int(t["id"]): float(t[value]) for t in step[key]}


def _ours(session, raw: dict[int, float], fields: dict, last: bool) -> dict[int, float]:
    """Our chain's final distribution (kept id: probability) on a row of llama.cpp's raw top N."""
    sampler, vocab = session
    row = np.full((2, vocab), -np.inf, np.float32)  # row 0: the dummy row of an idle slot
    row[1, list(raw)] = list(raw.values())
    params = SamplingParams(**fields, temperature_last=last)
    out = sampler.run(None, sampler_feeds(CHAIN, row, [params]))
    probs = out[[o.name for o in sampler.get_outputs()].index("sampler.probs")][0]
    return {int(i): float(probs[i]) for i in np.flatnonzero(probs)}


@pytest.mark.parametrize(("samplers", "fields", "read"), CASES)
def test_the_chain_leaves_llama_cpps_distribution_where_the_order_is_let_through(
    server, session, samplers, fields, read
):
    """Let through: the same kept tokens and probabilities on every prompt, in the order the
    server reads. Refused: another distribution than either of this server's orders gives, on at
    least one prompt (on some prompts the cuts leave one token either way)."""
    request = CompletionRequest(prompt="x", samplers=samplers, **fields)
    apply_llama_names(request)
    let_through = order_refusal(samplers, request) is None
    last = bool(request.temperature_last)
    assert (("last" if last else "first") if let_through else None) == read
    orders = [last] if let_through else [False, True]
    found = {order: [] for order in orders}
    for text in PROMPTS:
        ids = server.tokenize(text)
        raw = _llama(server, ids, OURS, {}, post=False)
        theirs = _llama(server, ids, samplers, fields, post=True)
        assert len(theirs) < N, "llama.cpp listed as many tokens as asked: some may be missing"
        for order in orders:
            ours = _ours(session, raw, fields, order)
            same = ours.keys() == theirs.keys() and all(
                abs(ours[i] - p) <= 1e-5 + 1e-4 * p for i, p in theirs.items()
            )
            found[order].append((text, same, len(theirs), len(ours)))
    for order, cases in found.items():
        agree = all(same for _, same, _, _ in cases)
        assert agree == let_through, (order, cases)
