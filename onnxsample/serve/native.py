"""llama-server's own endpoints: completions, ``POST /completion`` (and ``/completions``) and
``POST /infill`` (code infill: :mod:`~onnxsample.serve.infill` builds its prompt), and the
prompt's tools, ``POST /tokenize``, ``/detokenize`` and ``/apply-template``
(:mod:`~onnxsample.serve.tokenize`).

The request is llama-server's: ``prompt`` (text, token ids, text and ids mixed, or several
prompts), ``n_predict`` (-1 or absent: until the end of the sequence or the context; 0 samples one
token, as llama-server's),
its sampler names and ``samplers`` order (:mod:`~onnxsample.serve.llama_fields`), ``stop`` (an
empty one refused, as on the OpenAI routes; llama-server ends the answer at once),
``seed`` (-1, its default, for a random one), ``logit_bias`` in its forms (pairs or an object,
tokens as ids or text), ``ignore_eos`` (as llama-server's: no end-of-generation token is
drawn), ``n_probs`` (``logprobs`` when it is absent), ``return_tokens``, ``stream``, and code
completion's
``n_indent`` and ``t_max_predict_ms`` (how the text ends:
:meth:`~onnxsample.engine._sequence.Sequence.end_lines`) and ``response_fields``;
``t_max_prompt_ms`` is ignored, as llama-server ignores it. What this server does not implement is
refused by name (:mod:`~onnxsample.serve.peer_fields`). Sampling a request leaves out is what
``GET /props`` reports, as on llama-server.

The answer is llama-server's: ``content``, ``tokens`` (with ``return_tokens``), ``stop``,
``stop_type`` (``eos``, ``word``, ``limit``) and ``stopping_word``, ``tokens_predicted``,
``tokens_evaluated``, ``tokens_cached``, the prompt's text, ``generation_settings``, ``timings``
and, with ``n_probs``, ``completion_probabilities`` (the end-of-sequence token that ended it
has its entry, without text). Several prompts (or ``n`` above 1) give a
list. A stream sends one ``data:`` event per token (``stop`` false, ``tokens`` the token,
``content`` the text it lets out: empty while a possible stop string waits), then the final object
with ``stop`` true, and no ``[DONE]``; with ``timings_per_token`` every event has the
``timings`` so far, and with ``return_progress`` events without a token say how far the prompt
is (``prompt_progress``), as on llama-server; an error after the status line is an ``error``
event. As on llama-server, a token that leaves a UTF-8 character unfinished has no event and no
``completion_probabilities`` entry: the next token's entry carries its bytes. Every route reads
its body as JSON whatever its content type, as llama-server reads it (curl's ``-d`` says a form).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from onnxsample.engine import Engine
from onnxsample.engine._requests import barred_eos
from onnxsample.errors import InvalidParameter
from onnxsample.serve import convert
from onnxsample.serve.errors import APIError, name_fields, request_names
from onnxsample.serve.infill import infill_body, with_infill_sampler
from onnxsample.serve.llama_fields import (
    apply_llama_defaults,
    apply_llama_names,
    post_sampling_bound,
    take_infill,
    take_post_sampling,
)
from onnxsample.serve.metrics import Metrics
from onnxsample.serve.native_answer import Answer, Endings
from onnxsample.serve.peer_fields import refuse_unsupported
from onnxsample.serve.relay import collect, enqueue
from onnxsample.serve.schemas import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from onnxsample.serve.streaming import request_options, sse
from onnxsample.serve.structured import constraint_field
from onnxsample.serve.tokenize import applied_template, tokenized
from onnxsample.text.tokenizer import Tokenizer

__all__ = ["add_native_routes"]

_Body = TypeVar("_Body", bound=BaseModel)


def add_native_routes(
    app: FastAPI,
    engine: Callable[[], Engine],
    check_model: Callable[[str | None], None],
    model_name: str,
    metrics: Metrics,
    stopping: Callable[[], bool],
) -> None:
    """``POST /completion``, ``/completions``, ``/infill``, ``/tokenize``, ``/detokenize`` and
    ``/apply-template`` on `app`, over the engine `engine()` serves; the completions' answers are
    :class:`~onnxsample.serve.native_answer.Answer`'s."""

    async def answer(request: Request, data: Any, e: Engine):
        if isinstance(data, dict) and isinstance(data.get("logit_bias"), (list, dict)):
            given = data["logit_bias"]
            data["logit_bias"] = await asyncio.to_thread(_logit_bias, e.tokenizer, given)
        if isinstance(data, dict) and _has_mixed(data.get("prompt")):
            data["prompt"] = await asyncio.to_thread(_unmixed, e.tokenizer, data["prompt"])
        zero = (
            isinstance(data, dict) and type(data.get("n_predict")) is int and data["n_predict"] == 0
        )
        if zero:
            data["n_predict"] = 1  # llama-server samples one token even then (and says 0)
        if isinstance(data, dict) and type(data.get("seed")) is int and data["seed"] in _RANDOM:
            data["seed"] = None  # llama-server's default seed: a random one each request
        if isinstance(data, dict):
            _read_as_off(data)
        body = _validated(data)
        check_model(body.model)
        extra = body.model_extra if body.model_extra is not None else {}
        n_probs = extra.pop("n_probs", None)
        n_probs = body.logprobs if n_probs is None else n_probs  # llama-server's alias
        return_tokens = extra.pop("return_tokens", False)
        endings = Endings.read(extra)
        infill = take_infill(extra)  # llama.cpp's infill sampler, run on the host
        post_sampling = take_post_sampling(extra)
        if n_probs is not None and (not isinstance(n_probs, int) or isinstance(n_probs, bool)):
            raise APIError(400, f"n_probs must be an integer, got {n_probs!r}", param="n_probs")
        if not isinstance(return_tokens, bool):
            raise APIError(400, f"return_tokens must be a boolean, got {return_tokens!r}",
                           param="return_tokens")  # fmt: skip
        if body.echo:
            raise APIError(400, "echo is not a field of /completion: use /v1/completions",
                           param="echo")  # fmt: skip
        apply_llama_defaults(
            body, e.meta.chain
        )  # llama-server's sampling where the request sets none
        apply_llama_names(body)  # n_predict, repeat_penalty, samplers
        refuse_unsupported(extra, route="native", sampling=body, context=e.limit)
        n_probs = n_probs or 0
        post_sampling = post_sampling and n_probs > 0  # llama-server's: only with n_probs
        bound = e.meta.top_logprobs
        if post_sampling:
            bound = post_sampling_bound(body, e.meta)
        if n_probs < 0 or (bound is not None and n_probs > bound):
            within = ">= 0" if bound is None else f"in [0, {bound}]"
            raise APIError(400, f"n_probs must be {within}, got {n_probs}", param="n_probs")
        prompts = convert.prompts(body.prompt)
        limit = convert.token_limit(body.max_tokens, None)
        name_fields(request, constraint_field(body))
        if post_sampling:
            if infill:
                raise APIError(400, "post_sampling_probs cannot be combined with the infill "
                               "sampler here", param="post_sampling_probs")  # fmt: skip
            params = convert.choice_params(body, post_sampling_probs=n_probs)
        else:
            params = convert.choice_params(body, logprobs=n_probs > 0, top_logprobs=n_probs)
        if body.ignore_eos:  # llama-server's: an end-of-generation token is never drawn
            params = [barred_eos(p, e.eos_ids, e.meta, "ignore_eos") for p in params]
        if infill:
            params = with_infill_sampler(e, params)
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])

        def prepared() -> tuple[list, list[str]]:
            seqs = [
                e.prepare(prompt, p, limit, body.stop, False, None, k * body.n + j)
                for k, prompt in enumerate(prompts)
                for j, p in enumerate(params)
            ]
            endings.apply(request_options(seqs, body))
            texts = [e.tokenizer.decode(s.prompt, skip_special_tokens=False) for s in seqs]
            return seqs, texts

        seqs, texts = await asyncio.to_thread(prepared)
        requests = enqueue(e, seqs, metrics, "n" if body.n > 1 else "prompt")
        shaped = Answer(
            e.tokenizer, seqs, texts, stops, n_probs, return_tokens, model_name, limit, endings,
            context=e.limit, n_predict=0 if zero else None,
        )  # fmt: skip
        if body.stream:
            return sse(shaped.stream(requests, metrics, stopping, request_names(request)))
        done = await collect(requests, request, metrics, stopping)
        results = [shaped.final(c, streamed=False) for c in done]
        return results[0] if len(results) == 1 else results

    async def completion(request: Request):
        return await answer(request, _json(await request.body()), engine())

    async def infill(request: Request):
        data, e = _json(await request.body()), engine()
        data = await asyncio.to_thread(infill_body, e.tokenizer, e.limit, data)
        return await answer(request, data, e)

    for path in ("/completion", "/completions"):
        app.post(path)(completion)
    app.post("/infill")(infill)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        body, e = _read(await request.body(), TokenizeRequest), engine()
        check_model(body.model)
        return await asyncio.to_thread(tokenized, e.tokenizer, body, e.limit, e.vocab_size)

    @app.post("/apply-template")
    async def apply_template(request: Request) -> dict:
        body, e = _read(await request.body(), ChatRequest), engine()
        check_model(body.model)
        return await asyncio.to_thread(applied_template, e.tokenizer, body)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        body, e = _read(await request.body(), DetokenizeRequest), engine()
        check_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < e.vocab_size]
        if bad:
            raise InvalidParameter(f"tokens must be in [0, {e.vocab_size}), got {bad[0]}")
        # special tokens' text included, as llama-server's and vLLM's (and the /tokenize inverse)
        text = await asyncio.to_thread(e.tokenizer.decode, body.tokens, skip_special_tokens=False)
        # llama-server's is its pieces end to end: a SentencePiece vocabulary's first word keeps
        # the space its piece begins with, which a decode drops (as vLLM's does)
        pieces = b"".join(e.tokenizer.token_bytes(t) for t in body.tokens)
        return {"prompt": text, "content": pieces.decode("utf-8", "replace")}


def _json(raw: bytes) -> Any:
    """The body, read as JSON whatever its content type says, as llama-server reads it (curl
    sends ``-d`` as a form unless told otherwise)."""
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise APIError(400, f"the body is not JSON: {exc}") from None
    except RecursionError:  # nested deeper than the parser goes
        raise APIError(400, "the body is not JSON this server reads: nested too deeply") from None


# Values llama-server reads as "off" (its samplers skip them), and the value that says so here:
# (field, is off, neutral value). A negative temperature is greedy there, as 0 is.
_OFF = (
    ("temperature", lambda v: v < 0, 0.0),
    ("top_k", lambda v: v < 0, 0),
    ("top_p", lambda v: v > 1, 1.0),
    ("typical_p", lambda v: v > 1, 1.0),
    ("min_p", lambda v: v < 0, 0.0),
    ("n_probs", lambda v: v < 0, 0),
)


def _read_as_off(data: dict) -> None:
    """`data` with the values llama-server takes as a sampler switched off (``top_k: -1``,
    ``top_p: 1.5``, ``temperature: -1``: greedy) set to ours, so its clients' requests work
    unchanged; a value out of range in any other way is still refused."""
    for name, off, neutral in _OFF:
        value = data.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and off(value):
            data[name] = neutral


# llama-server's LLAMA_DEFAULT_SEED (a uint32, so -1 too): a random seed, as its clients send it.
_RANDOM = (-1, 0xFFFFFFFF)


def _read(raw: bytes, model: type[_Body]) -> _Body:
    """The body as `model`, read as JSON whatever its content type says (:func:`_json`)."""
    return _validated(_json(raw), model)


def _validated(data: Any, model: type[_Body] = CompletionRequest) -> _Body:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None


def _bias_refused(why: str) -> APIError:
    return APIError(400, f"logit_bias: {why}", param="logit_bias")


def _logit_bias(tokenizer: Tokenizer, given: list | dict) -> dict[str, float]:
    """llama-server's ``logit_bias`` forms as token id -> bias: ``[[token, bias], ...]`` or
    ``{"token": bias}``, a token an id or text (each token of the text, without BOS, gets the
    bias). A token given more than once gets the sum, as llama-server adds every entry. An entry
    llama-server would skip (not a pair, an id outside the vocabulary) is refused here, and so
    is ``false`` (never the token): -100 is the strongest bias."""
    if isinstance(given, dict):
        pairs: list = [[int(k) if k.lstrip("-").isdigit() else k, v] for k, v in given.items()]
    else:
        pairs = given
    bias: dict[str, float] = {}
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise _bias_refused(f"each entry is a [token, bias] pair, got {pair!r}")
        token, value = pair
        if value is False:
            raise _bias_refused("false (never the token) is not supported: use -100")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bias_refused(f"a bias is a number, got {value!r}")
        if isinstance(token, str):
            ids = tokenizer.encode(token, add_special_tokens=False)
        elif isinstance(token, int) and not isinstance(token, bool):
            ids = [token]
        else:
            raise _bias_refused(f"a token is an id or text, got {token!r}")
        for t in ids:
            bias[str(t)] = bias.get(str(t), 0.0) + float(value)
    return bias


def _is_mixed(prompt: Any) -> bool:
    """A prompt of text and token ids together (llama-server's ``[12, "text", 34]``)."""
    kinds = {type(x) for x in prompt} if isinstance(prompt, list) else set()
    return str in kinds and int in kinds


def _has_mixed(prompt: Any) -> bool:
    """Whether `prompt` is one of text and ids, or a list of prompts that holds one, or holds
    texts and lists of ids together: what OpenAI's forms leave out and llama-server reads."""
    if not isinstance(prompt, list):
        return False
    kinds = {type(p) for p in prompt}
    return _is_mixed(prompt) or {str, list} <= kinds or any(_is_mixed(p) for p in prompt)


def _unmixed(tokenizer: Tokenizer, prompt: list) -> list:
    """llama-server's mixed prompts as token ids (:func:`~onnxsample.serve.convert.mixed_ids`)."""
    if _is_mixed(prompt):
        return convert.mixed_ids(tokenizer, prompt)
    return [
        convert.mixed_ids(tokenizer, p) if _is_mixed(p) or type(p) is str else p for p in prompt
    ]
