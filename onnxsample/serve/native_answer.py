"""llama-server's answer objects for ``/completion`` and ``/infill``
(:mod:`~onnxsample.serve.native`): the final object and the stream's events, with the fields a
request keeps (``response_fields``), and the UTF-8 rule that decides which tokens get an event and
a ``completion_probabilities`` entry of their own.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from onnxsample.engine.request import Completion, StreamEvent
from onnxsample.serve import convert
from onnxsample.serve.errors import APIError
from onnxsample.serve.metrics import Metrics
from onnxsample.serve.props import generation_settings
from onnxsample.serve.relay import merged_events
from onnxsample.serve.streaming import cut_by_shutdown, error_chunk, shutdown_chunk
from onnxsample.text.tokenizer import Tokenizer

__all__ = ["Answer", "Endings"]

_STOP_TYPES = {"eos": "eos", "stop": "word", "length": "limit", "cancelled": "none"}


@dataclass(frozen=True)
class Endings:
    """llama-server's fields for code completion: ``n_indent`` and ``t_max_predict_ms`` (how the
    text ends: :meth:`~onnxsample.engine._sequence.Sequence.end_lines`) and ``response_fields``
    (the final object's fields kept, a path ``a/b`` for a nested one, keyed by the path)."""

    n_indent: int = 0
    t_max_predict_ms: float = 0
    fields: tuple[str, ...] = ()

    @classmethod
    def read(cls, extra: dict, fields: bool = True) -> Endings:
        """Take the three from a request's `extra` fields, checked (without `fields`, the first
        two: llama-server reads ``response_fields`` on its own routes only)."""
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
        kept = extra.pop("response_fields", None) if fields else None
        kept = [] if kept is None else kept
        if not isinstance(kept, list) or not all(isinstance(f, str) for f in kept):
            raise APIError(400, "response_fields must be a list of field names",
                           param="response_fields")  # fmt: skip
        return cls(indent, max(ms, 0), tuple(kept))

    def apply(self, seqs: list) -> list:
        """`seqs`, which end their text as these endings say."""
        for seq in seqs:
            seq.end_lines(self.n_indent, self.t_max_predict_ms)
        return seqs

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


class Answer:
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
        endings: Endings,
        *,
        context: int | None = None,
        n_predict: int | None = None,
    ) -> None:
        """`context`: the positions a sequence may hold (an answer that fills them is
        ``truncated``, as llama-server says); `n_predict`: the limit the request gave, where the
        `limit` run is another (llama-server's 0 samples one token all the same)."""
        self.tokenizer, self.endings = tokenizer, endings
        self.context = context
        self.n_predict = n_predict if n_predict is not None else -1 if limit is None else limit
        self.seqs = {s.index: s for s in seqs}
        self.texts = {s.index: t for s, t in zip(seqs, texts, strict=True)}
        self.stops, self.n_probs, self.return_tokens = stops, n_probs, return_tokens
        # llama-server's post_sampling_probs: the final distribution's probabilities
        self.post_sampling = any(s.params.post_sampling_probs is not None for s in seqs)
        self.model, self.limit = model, limit

    def _probs(
        self,
        tokens: list[int],
        logprobs: list[float],
        tops: list | None,
        text: _Characters,
        *,
        ended: bool = False,
    ) -> list[dict]:
        """``completion_probabilities``: each token's id, text, bytes, logprob and top tokens, as
        llama-server lists them: a token that leaves a character unfinished has no entry, and
        the next one's text and bytes are all those since the last entry (`text` follows the
        sequence's bytes). `ended`: the last token is the end-of-sequence token that finished
        the answer, listed without text or bytes (it writes none)."""
        entries = convert.chat_logprobs(self.tokenizer, tokens, logprobs, tops)
        listed = []
        for i, (token, entry) in enumerate(zip(tokens, entries, strict=True)):
            if ended and i == len(tokens) - 1 and text.pending:
                continue  # after an unfinished character llama-server lists no entry for it
            pending = b"" if ended and i == len(tokens) - 1 else text.add(token)
            if pending is None:
                continue
            top = tops[i] if tops is not None and i < len(tops) else []
            entry["top_logprobs"] = [
                {"id": t, **shown} for (t, _), shown in zip(top, entry["top_logprobs"], strict=True)
            ]
            entry.update(token=pending.decode("utf-8", "replace"), bytes=list(pending))
            entry = {"id": token, **entry}
            if self.post_sampling:
                entry = convert.post_sampling_entry(entry, [t for t, _ in top])
            listed.append(entry)
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
                n_predict=self.n_predict,
                seed=c.seed,
                stop=self.stops,
                stream=streamed,
            ),
            "prompt": self.texts[c.index],
            "has_new_line": "\n" in c.text,
            # llama-server's: the answer ran into the end of the context (a prompt over it is
            # refused, never cut)
            "truncated": c.finish_reason == "length"
            and self.context is not None
            and len(c.prompt_token_ids) + len(ended) >= self.context,
            "stop_type": _STOP_TYPES[c.finish_reason],
            "stopping_word": self._stopping_word(c),
            # the positions left in the cache: the last token was never fed back
            "tokens_cached": len(c.prompt_token_ids) + max(len(ended) - 1, 0),
            "timings": _llama_timings(convert.timings(c)),
        }
        if self.n_probs and not streamed:
            shown = len(self.tokenizer.encode(result["stopping_word"], add_special_tokens=False))
            kept = len(c.token_ids) - shown if result["stopping_word"] else len(c.token_ids)
            tops = None if c.top_logprobs is None else c.top_logprobs[:kept]
            # as llama-server's: the end-of-sequence token has its entry
            end, end_lp, end_top = convert.end_entry(c)
            tokens, logprobs = c.token_ids[:kept] + end, list(c.logprobs or [])[:kept] + end_lp
            tops = None if tops is None else tops + end_top
            ended = bool(end)
            text = _Characters(self.tokenizer)
            result["completion_probabilities"] = self._probs(
                tokens, logprobs, tops, text, ended=ended
            )
        return self.endings.kept(result)

    def partial(self, event: StreamEvent, predicted: int, text: _Characters) -> dict | None:
        """A piece of text as it streams, or None for a token that leaves a character unfinished
        (llama-server sends no event for one); `predicted`: the tokens of its sequence so far,
        `text` follows its bytes."""
        done = event.completion
        ended = done is not None and done.end_token is not None and done.end_token == event.token_id
        # an end-of-sequence token after an unfinished character: llama-server's text is still
        # incomplete, so it sends no event (here only the held text's, if any) and no entry
        unfinished = ended and bool(text.pending)
        if unfinished and not event.text:
            return None
        if not ended and event.logprob is None and text.add(event.token_id) is None:
            return None
        result = {
            "index": event.index,
            "content": event.text,
            "tokens": [] if event.token_id is None else [event.token_id],
            "stop": False,
            "tokens_predicted": predicted,
            "tokens_evaluated": len(self.seqs[event.index].prompt),
        }
        if event.timings is not None:  # timings_per_token
            result["timings"] = _llama_timings(convert.event_timings(event))
        logprob, tops = event.logprob, event.top_logprobs
        if ended:  # the end-of-sequence token's entry, as llama-server streams it
            logprob, tops = done.end_logprob, done.end_top_logprobs
        if logprob is not None and not unfinished:
            probs = self._probs([event.token_id], [logprob], [tops or []], text, ended=ended)
            if not probs:
                return None
            result["completion_probabilities"] = probs
        return result

    def progress(self, event: StreamEvent, predicted: int) -> dict:
        """An event that says how far the prompt is (``return_progress``), as llama-server's."""
        result = {
            "index": event.index,
            "content": "",
            "tokens": [],
            "stop": False,
            "tokens_predicted": predicted,
            "tokens_evaluated": len(self.seqs[event.index].prompt),
        }
        if event.timings is not None:  # timings_per_token
            result["timings"] = _llama_timings(convert.event_timings(event))
        result["prompt_progress"] = event.progress.to_json()
        return result

    async def stream(
        self,
        requests: list,
        metrics: Metrics,
        stopping: Callable[[], bool],
        names: dict[str, str] | None = None,
    ) -> AsyncIterator[dict]:
        """The answer's chunks as they decode; an error ends it naming the request's field by
        `names` (:func:`~onnxsample.serve.errors.name_fields`)."""
        events = merged_events(requests, metrics)
        predicted = dict.fromkeys(self.seqs, 0)
        texts = {i: _Characters(self.tokenizer) for i in self.seqs}
        try:
            async for _, event in events:
                if event.progress is not None:
                    yield self.progress(event, predicted[event.index])
                if event.token_id is not None:  # an event a token, as llama-server's
                    predicted[event.index] += 1
                    piece = self.partial(event, predicted[event.index], texts[event.index])
                    if piece is not None:
                        yield piece
                done = event.completion
                if done is not None and not cut_by_shutdown(done, stopping):
                    yield self.final(done, streamed=True)  # a cut one ends with the error
        except Exception as exc:
            yield error_chunk(exc, names)
            return
        finally:
            await events.aclose()  # at once, so a client that went away frees its slots now
        if stopping():
            yield shutdown_chunk()


def _llama_timings(timings: dict) -> dict:
    """llama-server's own routes' ``timings``: the OpenAI routes' without ``ttft_ms``."""
    return {k: v for k, v in timings.items() if k != "ttft_ms"}
