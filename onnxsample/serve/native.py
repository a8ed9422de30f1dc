"""llama-server's own completion endpoints, ``POST /completion`` (and ``/completions``) and
``POST /infill`` (code infill: :mod:`~onnxsample.serve.infill` builds its prompt).

The request is llama-server's: ``prompt`` (text, token ids, or several prompts), ``n_predict`` (-1
or absent: until the end of the sequence or the context; 0 samples one token, as llama-server's),
its sampler names and ``samplers`` order (:mod:`~onnxsample.serve.llama_fields`), ``stop``,
``seed``, ``logit_bias`` in its forms (pairs or an object, tokens as ids or text), ``n_probs``
(``logprobs`` when it is absent), ``return_tokens``, ``stream``, and code completion's
``n_indent`` and ``t_max_predict_ms`` (how the text ends:
:meth:`~onnxsample.engine._sequence.Sequence.end_lines`) and ``response_fields``;
``t_max_prompt_ms`` is ignored, as llama-server ignores it. What this server does not implement is
refused by name (:mod:`~onnxsample.serve.peer_fields`). Sampling a request leaves out is what
``GET /props`` reports, as on llama-server.

The answer is llama-server's: ``content``, ``tokens`` (with ``return_tokens``), ``stop``,
``stop_type`` (``eos``, ``word``, ``limit``) and ``stopping_word``, ``tokens_predicted``,
``tokens_evaluated``, ``tokens_cached``, the prompt's text, ``generation_settings``, ``timings``
and, with ``n_probs``, ``completion_probabilities``. Several prompts (or ``n`` above 1) give a
list. A stream sends one ``data:`` event per token (``stop`` false, ``tokens`` the token,
``content`` the text it lets out: empty while a possible stop string waits), then the final object
with ``stop`` true, and no ``[DONE]``; an error after the status line is an ``error`` event. As on
llama-server, a token that leaves a UTF-8 character unfinished has no event and no
``completion_probabilities`` entry: the next token's entry carries its bytes. The body is read as
JSON whatever its content type, as llama-server reads it.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from onnxsample.engine import Engine
from onnxsample.engine.request import Completion, StreamEvent
from onnxsample.serve import convert
from onnxsample.serve.errors import APIError
from onnxsample.serve.infill import infill_body, with_infill_sampler
from onnxsample.serve.llama_fields import apply_llama_names, take_infill
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

    async def answer(request: Request, data: Any, e: Engine):
        if isinstance(data, dict) and isinstance(data.get("logit_bias"), (list, dict)):
            given = data["logit_bias"]
            data["logit_bias"] = await asyncio.to_thread(_logit_bias, e.tokenizer, given)
        if isinstance(data, dict) and type(data.get("n_predict")) is int and data["n_predict"] == 0:
            data["n_predict"] = 1  # llama-server samples one token even then
        body = _validated(data)
        check_model(body.model)
        extra = body.model_extra if body.model_extra is not None else {}
        n_probs = extra.pop("n_probs", None)
        n_probs = body.logprobs if n_probs is None else n_probs  # llama-server's alias
        return_tokens = extra.pop("return_tokens", False)
        endings = _Endings.read(extra)
        infill = take_infill(extra)  # llama.cpp's infill sampler, run on the host
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
        if infill:
            params = with_infill_sampler(e, params)
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])

        def prepared() -> tuple[list, list[str]]:
            seqs = [
                e.prepare(prompt, p, limit, body.stop, False, None, k * body.n + j)
                for k, prompt in enumerate(prompts)
                for j, p in enumerate(params)
            ]
            for seq in seqs:
                seq.end_lines(endings.n_indent, endings.t_max_predict_ms)
            texts = [e.tokenizer.decode(s.prompt, skip_special_tokens=False) for s in seqs]
            return seqs, texts

        seqs, texts = await asyncio.to_thread(prepared)
        requests = enqueue(e, seqs, metrics)
        shaped = _Answer(
            e.tokenizer, seqs, texts, stops, n_probs, return_tokens, model_name, limit, endings
        )
        if body.stream:
            return sse(shaped.stream(requests, metrics, stopping))
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


@dataclass(frozen=True)
class _Endings:
    """llama-server's fields for code completion: ``n_indent`` and ``t_max_predict_ms`` (how the
    text ends: :meth:`~onnxsample.engine._sequence.Sequence.end_lines`) and ``response_fields``
    (the final object's fields kept, a path ``a/b`` for a nested one, keyed by the path)."""

    n_indent: int = 0
    t_max_predict_ms: float = 0
    fields: tuple[str, ...] = ()

    @classmethod
    def read(cls, extra: dict) -> _Endings:
        """Take the three from a request's `extra` fields, checked."""
        indent = extra.pop("n_indent", None)
        indent = 0 if indent is None else indent
        if isinstance(indent, bool) or not isinstance(indent, int) or indent < 0:
            raise APIError(400, f"n_indent must be an integer >= 0, got {indent!r}",
                           param="n_indent")  # fmt: skip
        ms = extra.pop("t_max_predict_ms", None)
        ms = 0 if ms is None else ms
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms):
            raise APIError(400, f"t_max_predict_ms must be a number, got {ms!r}",
                           param="t_max_predict_ms")  # fmt: skip
        fields = extra.pop("response_fields", None)
        fields = [] if fields is None else fields
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise APIError(400, "response_fields must be a list of field names",
                           param="response_fields")  # fmt: skip
        return cls(indent, max(ms, 0), tuple(fields))

    def kept(self, result: dict) -> dict:
        """`result` with only the ``response_fields`` it has (all without any)."""
        if not self.fields:
            return result
        kept = {}
        for path in self.fields:
            value: Any = result
            for key in path.split("/"):
                if not isinstance(value, dict) or key not in value:
                    break
                value = value[key]
            else:
                kept[path] = value
        return kept


class _Characters:
    """A sequence's bytes as llama-server checks them after each token (``validate_utf8``):
    :meth:`add` gives the bytes since the last whole character ended the text, or None while a
    character is unfinished."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.tail, self.pending = tokenizer, b"", b""

    def add(self, token: int) -> bytes | None:
        data = self.tokenizer.token_bytes(token)
        self.pending += data
        self.tail = (self.tail + data)[-4:]
        for back in range(1, len(self.tail) + 1):
            lead = self.tail[-back]
            need = 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else 4 if lead >> 3 == 30 else 0
            if back < need:
                return None
        pending, self.pending = self.pending, b""
        return pending


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
        endings: _Endings,
    ) -> None:
        self.tokenizer, self.endings = tokenizer, endings
        self.seqs = {s.index: s for s in seqs}
        self.texts = {s.index: t for s, t in zip(seqs, texts, strict=True)}
        self.stops, self.n_probs, self.return_tokens = stops, n_probs, return_tokens
        self.model, self.limit = model, limit

    def _probs(
        self, tokens: list[int], logprobs: list[float], tops: list | None, text: _Characters
    ) -> list[dict]:
        """``completion_probabilities``: each token's id, text, bytes, logprob and top tokens, as
        llama-server lists them: a token that leaves a character unfinished has no entry, and
        the next one's text and bytes are all those since the last entry (`text` follows the
        sequence's bytes)."""
        entries = convert.chat_logprobs(self.tokenizer, tokens, logprobs, tops)
        listed = []
        for i, (token, entry) in enumerate(zip(tokens, entries, strict=True)):
            pending = text.add(token)
            if pending is None:
                continue
            top = tops[i] if tops is not None and i < len(tops) else []
            entry["top_logprobs"] = [
                {"id": t, **shown} for (t, _), shown in zip(top, entry["top_logprobs"], strict=True)
            ]
            entry.update(token=pending.decode("utf-8", "replace"), bytes=list(pending))
            listed.append({"id": token, **entry})
        return listed

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
            # the positions left in the cache: the last token was never fed back
            "tokens_cached": len(c.prompt_token_ids) + max(len(ended) - 1, 0),
            "timings": {k: v for k, v in convert.timings(c).items() if k != "ttft_ms"},
        }
        if self.n_probs and not streamed:
            shown = len(self.tokenizer.encode(result["stopping_word"], add_special_tokens=False))
            kept = len(c.token_ids) - shown if result["stopping_word"] else len(c.token_ids)
            tops = None if c.top_logprobs is None else c.top_logprobs[:kept]
            tokens, logprobs = c.token_ids[:kept], list(c.logprobs or [])[:kept]
            text = _Characters(self.tokenizer)
            result["completion_probabilities"] = self._probs(tokens, logprobs, tops, text)
        return self.endings.kept(result)

    def partial(self, event: StreamEvent, predicted: int, text: _Characters) -> dict | None:
        """A piece of text as it streams, or None for a token that leaves a character unfinished
        (llama-server sends no event for one); `predicted`: the tokens of its sequence so far,
        `text` follows its bytes."""
        if event.logprob is None and text.add(event.token_id) is None:
            return None
        result = {
            "index": event.index,
            "content": event.text,
            "tokens": [] if event.token_id is None else [event.token_id],
            "stop": False,
            "tokens_predicted": predicted,
            "tokens_evaluated": len(self.seqs[event.index].prompt),
        }
        if event.logprob is not None:
            probs = self._probs([event.token_id], [event.logprob], [event.top_logprobs or []], text)
            if not probs:
                return None
            result["completion_probabilities"] = probs
        return result

    async def stream(
        self, requests: list, metrics: Metrics, stopping: Callable[[], bool]
    ) -> AsyncIterator[dict]:
        events = merged_events(requests, metrics)
        predicted = dict.fromkeys(self.seqs, 0)
        texts = {i: _Characters(self.tokenizer) for i in self.seqs}
        try:
            async for _, event in events:
                if event.token_id is not None:  # an event a token, as llama-server's
                    predicted[event.index] += 1
                    piece = self.partial(event, predicted[event.index], texts[event.index])
                    if piece is not None:
                        yield piece
                if event.completion is not None:
                    yield self.final(event.completion, streamed=True)
        except Exception as exc:
            yield error_chunk(exc)
            return
        finally:
            await events.aclose()  # at once, so a client that went away frees its slots now
        if stopping():
            yield shutdown_chunk()
