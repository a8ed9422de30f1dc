"""llama-server's own completion endpoint, ``POST /completion`` (and ``/completions``).

The request is llama-server's: ``prompt`` (text, token ids, or several prompts), ``n_predict`` (-1
or absent: until the end of the sequence or the context), its sampler names and ``samplers`` order
(:mod:`~onnxsample.serve.llama_fields`), ``stop``, ``seed``, ``logit_bias`` in its forms (pairs or
an object, tokens as ids or text), ``n_probs`` (``logprobs`` when it is absent), ``return_tokens``,
``stream``; what this server does not implement is refused by name
(:mod:`~onnxsample.serve.peer_fields`). Sampling a request leaves out is what ``GET /props``
reports, as on llama-server.

The answer is llama-server's: ``content``, ``tokens`` (with ``return_tokens``), ``stop``,
``stop_type`` (``eos``, ``word``, ``limit``) and ``stopping_word``, ``tokens_predicted``,
``tokens_evaluated``, the prompt's text, ``generation_settings``, ``timings`` and, with
``n_probs``, ``completion_probabilities``. Several prompts (or ``n`` above 1) give a list. A stream
sends one ``data:`` event per token (``stop`` false, ``tokens`` the token, ``content`` the text it
lets out: empty while a possible stop string or part of a character waits), then the final object
with ``stop`` true, and no ``[DONE]``; an error after the status line is an ``error`` event. The
body is read as JSON whatever its content type, as llama-server reads it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from onnxsample.engine import Engine
from onnxsample.engine.request import Completion, StreamEvent
from onnxsample.serve import convert
from onnxsample.serve.errors import APIError
from onnxsample.serve.llama_fields import apply_llama_names
from onnxsample.serve.metrics import Metrics
from onnxsample.serve.peer_fields import refuse_unsupported
from onnxsample.serve.props import generation_settings
from onnxsample.serve.schemas import CompletionRequest
from onnxsample.serve.streaming import (
    collect,
    enqueue,
    error_chunk,
    merged_events,
    shutdown_chunk,
    sse,
)
from onnxsample.text.tokenizer import Tokenizer

__all__ = ["add_native_routes"]

_STOP_TYPES = {"eos": "eos", "stop": "word", "length": "limit", "cancelled": "none"}


def add_native_routes(
    app: FastAPI,
    engine: Callable[[], Engine],
    check_model: Callable[[str | None], None],
    model_name: str,
    metrics: Metrics,
    stopping: Callable[[], bool],
) -> None:
    """``POST /completion`` and ``/completions`` on `app`, over the engine `engine()` serves."""

    async def completion(request: Request):
        data = _json(await request.body())
        e = engine()
        if isinstance(data, dict) and isinstance(data.get("logit_bias"), (list, dict)):
            given = data["logit_bias"]
            data["logit_bias"] = await asyncio.to_thread(_logit_bias, e.tokenizer, given)
        body = _validated(data)
        check_model(body.model)
        extra = body.model_extra if body.model_extra is not None else {}
        n_probs = extra.pop("n_probs", None)
        n_probs = body.logprobs if n_probs is None else n_probs  # llama-server's alias
        return_tokens = extra.pop("return_tokens", False)
        if n_probs is not None and (not isinstance(n_probs, int) or isinstance(n_probs, bool)):
            raise APIError(400, f"n_probs must be an integer, got {n_probs!r}", param="n_probs")
        if not isinstance(return_tokens, bool):
            raise APIError(400, f"return_tokens must be a boolean, got {return_tokens!r}",
                           param="return_tokens")  # fmt: skip
        if body.echo:
            raise APIError(400, "echo is not a field of /completion: use /v1/completions",
                           param="echo")  # fmt: skip
        apply_llama_names(body)  # n_predict, repeat_penalty, samplers
        refuse_unsupported(extra, route="native", sampling=body)
        n_probs = n_probs or 0
        if not 0 <= n_probs <= e.meta.top_logprobs:
            raise APIError(400, f"n_probs must be in [0, {e.meta.top_logprobs}], got {n_probs}",
                           param="n_probs")  # fmt: skip
        prompts = convert.prompts(body.prompt)
        limit = convert.token_limit(body.max_tokens, None)
        params = convert.choice_params(body, logprobs=n_probs > 0, top_logprobs=n_probs)
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])

        def prepared() -> tuple[list, list[str]]:
            seqs = [
                e.prepare(prompt, p, limit, body.stop, False, None, k * body.n + j)
                for k, prompt in enumerate(prompts)
                for j, p in enumerate(params)
            ]
            texts = [e.tokenizer.decode(s.prompt, skip_special_tokens=False) for s in seqs]
            return seqs, texts

        seqs, texts = await asyncio.to_thread(prepared)
        requests = enqueue(e, seqs, metrics)
        answer = _Answer(e.tokenizer, seqs, texts, stops, n_probs, return_tokens, model_name, limit)
        if body.stream:
            return sse(answer.stream(requests, metrics, stopping))
        done = await collect(requests, request, metrics, stopping)
        results = [answer.final(c, streamed=False) for c in done]
        return results[0] if len(results) == 1 else results

    for path in ("/completion", "/completions"):
        app.post(path)(completion)


def _json(raw: bytes) -> Any:
    """The body, read as JSON whatever its content type says, as llama-server reads it (curl
    sends ``-d`` as a form unless told otherwise)."""
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise APIError(400, f"the body is not JSON: {exc}") from None


def _validated(data: Any) -> CompletionRequest:
    try:
        return CompletionRequest.model_validate(data)
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


class _Answer:
    """llama-server's answer objects for one request's sequences."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        seqs: list,
        texts: list[str],
        stops: list[str],
        n_probs: int,
        return_tokens: bool,
        model: str,
        limit: int | None,
    ) -> None:
        self.tokenizer = tokenizer
        self.seqs = {s.index: s for s in seqs}
        self.texts = {s.index: t for s, t in zip(seqs, texts, strict=True)}
        self.stops, self.n_probs, self.return_tokens = stops, n_probs, return_tokens
        self.model, self.limit = model, limit

    def _probs(self, tokens: list[int], logprobs: list[float], tops: list | None) -> list[dict]:
        """``completion_probabilities``: each token's id, text, bytes, logprob and top tokens."""
        entries = convert.chat_logprobs(self.tokenizer, tokens, logprobs, tops)
        for i, (token, entry) in enumerate(zip(tokens, entries, strict=True)):
            top = tops[i] if tops is not None and i < len(tops) else []
            entry["top_logprobs"] = [
                {"id": t, **shown} for (t, _), shown in zip(top, entry["top_logprobs"], strict=True)
            ]
            entries[i] = {"id": token, **entry}
        return entries

    def _stopping_word(self, c: Completion) -> str:
        """The stop string that ended `c`: the one its tokens wrote right after its text."""
        if c.finish_reason != "stop":
            return ""
        written = self.tokenizer.decode(c.token_ids)[len(c.text) :]
        return next((s for s in self.stops if written.startswith(s)), "")

    def final(self, c: Completion, *, streamed: bool) -> dict:
        """The final object; `streamed`: its content and tokens went out as pieces already."""
        params = self.seqs[c.index].params
        # as llama-server's: the end-of-sequence token that ended it is one of its tokens
        ended = c.token_ids + ([] if c.end_token is None else [c.end_token])
        result = {
            "index": c.index,
            "content": "" if streamed else c.text,
            "tokens": ended if self.return_tokens and not streamed else [],
            "stop": True,
            "model": self.model,
            "tokens_predicted": len(ended),
            "tokens_evaluated": len(c.prompt_token_ids),
            "generation_settings": generation_settings(
                params,
                n_predict=-1 if self.limit is None else self.limit,
                seed=c.seed,
                stop=self.stops,
                stream=streamed,
            ),
            "prompt": self.texts[c.index],
            "has_new_line": "\n" in c.text,
            "truncated": False,  # a prompt over the context is refused, never cut
            "stop_type": _STOP_TYPES[c.finish_reason],
            "stopping_word": self._stopping_word(c),
            "timings": {k: v for k, v in convert.timings(c).items() if k != "ttft_ms"},
        }
        if self.n_probs and not streamed:
            shown = len(self.tokenizer.encode(result["stopping_word"], add_special_tokens=False))
            kept = len(c.token_ids) - shown if result["stopping_word"] else len(c.token_ids)
            tops = None if c.top_logprobs is None else c.top_logprobs[:kept]
            tokens, logprobs = c.token_ids[:kept], list(c.logprobs or [])[:kept]
            result["completion_probabilities"] = self._probs(tokens, logprobs, tops)
        return result

    def partial(self, event: StreamEvent, predicted: int) -> dict:
        """A piece of text as it streams; `predicted`: the tokens of its sequence so far."""
        result = {
            "index": event.index,
            "content": event.text,
            "tokens": [] if event.token_id is None else [event.token_id],
            "stop": False,
            "tokens_predicted": predicted,
            "tokens_evaluated": len(self.seqs[event.index].prompt),
        }
        if event.logprob is not None:
            result["completion_probabilities"] = self._probs(
                [event.token_id], [event.logprob], [event.top_logprobs or []]
            )
        return result

    async def stream(
        self, requests: list, metrics: Metrics, stopping: Callable[[], bool]
    ) -> AsyncIterator[dict]:
        events = merged_events(requests, metrics)
        predicted = dict.fromkeys(self.seqs, 0)
        try:
            async for _, event in events:
                if event.token_id is not None:  # one event a token, as llama-server's
                    predicted[event.index] += 1
                    yield self.partial(event, predicted[event.index])
                if event.completion is not None:
                    yield self.final(event.completion, streamed=True)
        except Exception as exc:
            yield error_chunk(exc)
            return
        finally:
            await events.aclose()  # at once, so a client that went away frees its slots now
        if stopping():
            yield shutdown_chunk()
