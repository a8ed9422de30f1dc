"""A request's choices as OpenAI's SSE chunks, as they decode (the events merged by
:mod:`~onnxsample.serve.relay`); a stream the client leaves is cancelled when its socket closes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from starlette.responses import StreamingResponse

from onnxsample.engine import Engine
from onnxsample.engine.request import Completion, Request, StreamEvent, TopLogprobs
from onnxsample.errors import OnnxSampleError
from onnxsample.serve import convert
from onnxsample.serve.errors import error_body, from_library
from onnxsample.serve.metrics import Metrics
from onnxsample.serve.reasoning import ThoughtStream
from onnxsample.serve.relay import merged_events, shutdown_error
from onnxsample.serve.schemas import SamplingFields
from onnxsample.serve.tools import ToolPlan, ToolWatch

__all__ = [
    "Job",
    "chat_stream",
    "completion_stream",
    "cut_by_shutdown",
    "error_chunk",
    "shutdown_chunk",
    "sse",
]


def shutdown_chunk() -> dict:
    """The error a stream ends with when the stopping server cut it."""
    err = shutdown_error()
    return error_body(err.status, err.message, err.param, err.code, err.extra)


def cut_by_shutdown(completion: Completion, stopping: Callable[[], bool]) -> bool:
    """Whether the stopping server cut this choice: it gets no finish (a client that reads up to
    ``finish_reason`` would take it for a whole answer); its stream ends with
    :func:`shutdown_chunk` instead."""
    return completion.finish_reason == "cancelled" and stopping()


def sse(chunks: AsyncIterator[dict | str]) -> StreamingResponse:
    """`chunks` as server-sent events: ``data: <json>`` each (a string as it is)."""

    async def events() -> AsyncIterator[str]:
        async for chunk in chunks:
            text = chunk if isinstance(chunk, str) else json.dumps(chunk, ensure_ascii=False)
            yield f"data: {text}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def error_chunk(exc: BaseException, names: dict[str, str] | None = None) -> dict:
    """The event that ends a stream whose request failed: the error the answer would have been
    (a client's mistake found mid-way, such as a step whose kept set is past the candidates, is
    a 400 naming its field, by the request's `names` for it), or an internal error."""
    if isinstance(exc, OnnxSampleError):
        err = from_library(exc, names)
        return error_body(err.status, err.message, err.param, err.code, err.extra)
    return error_body(500, f"internal error: {type(exc).__name__}")


@dataclass
class Job:
    """One API request's choices on the engine, streamed as `object` chunks; `prompts` are its
    distinct prompts (for usage)."""

    engine: Engine
    requests: list[Request]
    seqs: list
    prompts: list[list[int]]
    meta: dict
    include_usage: bool
    metrics: Metrics
    object: str
    stopping: Callable[[], bool] = lambda: False
    names: dict[str, str] = field(default_factory=dict)  # the request's (errors.name_fields)

    def chunk(
        self, choice: dict, timings: dict | None = None, progress: dict | None = None
    ) -> dict:
        """A chunk of one choice; `timings` and the prompt's `progress` go beside the choices,
        llama-server's place."""
        return {
            **self.meta,
            "object": self.object,
            "choices": [choice],
            **({"usage": None} if self.include_usage else {}),
            **({"timings": timings} if timings is not None else {}),
            **({"prompt_progress": progress} if progress is not None else {}),
        }

    def cut(self, completion: Completion) -> bool:
        """:func:`cut_by_shutdown` for this job's server."""
        return cut_by_shutdown(completion, self.stopping)

    def token_chunk(self, choice: dict, event: StreamEvent) -> dict:
        """A chunk of a token's piece, or of the prompt's progress (llama-server's
        ``return_progress``); with its ``timings_per_token``, the timings when it came."""
        progress = event.progress.to_json() if event.progress is not None else None
        timed = event.timings is not None
        return self.chunk(choice, convert.event_timings(event) if timed else None, progress)

    async def framed(
        self, chunks: AsyncIterator[dict], done: list[Completion]
    ) -> AsyncIterator[dict | str]:
        """`chunks`, then the usage chunk when asked and ``[DONE]``; an error ends the stream with
        an error chunk (the status line is long gone)."""
        try:
            async for chunk in chunks:
                yield chunk
        except Exception as exc:
            yield error_chunk(exc, self.names)
            yield "[DONE]"
            return
        finally:
            await chunks.aclose()  # at once, so a client that went away frees its slots now
        if self.stopping():  # the server cut the stream: say so, then end it as OpenAI does
            yield shutdown_chunk()
            yield "[DONE]"
            return
        if self.include_usage:
            usage = convert.usage(done, self.prompts)
            yield {**self.meta, "object": self.object, "choices": [], "usage": usage}
        yield "[DONE]"


class _Held:
    """One choice's token logprobs, held until the text their tokens wrote goes out: a stop
    string's tokens, whose text never does, never show theirs, as in an answer not streamed
    (:meth:`~onnxsample.engine.request.Completion.written_tokens`)."""

    def __init__(self) -> None:
        self._events: list[StreamEvent] = []

    def take(self, event: StreamEvent, written: int) -> list[StreamEvent]:
        """The events whose logprobs go out with `event`'s chunk, `written` characters of the
        choice's text being out with it."""
        if event.logprob is not None:
            self._events.append(event)
        c = event.completion
        if c is not None and c.finish_reason != "stop":
            written = len(c.text) + 1  # every token wrote the text
        out = [e for e in self._events if e.offset is not None and e.offset < written]
        self._events = [] if c is not None else self._events[len(out) :]
        return out


def _logprob_positions(
    released: list[StreamEvent], completion: Completion | None
) -> tuple[list[int], list[float], list[TopLogprobs]]:
    """The tokens, logprobs and alternatives a chunk lists: the `released` events', and on the
    last event the end-of-sequence token that finished the choice
    (:func:`~onnxsample.serve.convert.end_entry`)."""
    ids = [e.token_id for e in released]
    lps = [e.logprob for e in released]
    tops = [e.top_logprobs or [] for e in released]
    if completion is not None:
        end, end_lp, end_top = convert.end_entry(completion)
        ids, lps, tops = ids + end, lps + end_lp, tops + end_top
    return ids, lps, tops


def _piece(index: int, delta: dict, logprobs: dict | None = None) -> dict:
    """A chat chunk's choice that is not its last."""
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}


def request_options(seqs: list, body: SamplingFields) -> list:
    """`seqs` with llama-server's per-request options of `body`: they report how far their
    prompts are and their timings at each token when a stream asks (``return_progress``,
    ``timings_per_token``; a whole answer has nowhere to put them), and reuse a cached prefix
    unless ``cache_prompt`` is false."""
    for seq in seqs:
        seq.report_progress = body.stream and body.return_progress
        seq.report_timings = body.stream and body.timings_per_token
        seq.reuse_prefix = body.cache_prompt
    return seqs


def _text_piece(index: int, text: str, logprobs: dict | None = None) -> dict:
    """A text completion chunk's choice that is not its last."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None}


def chat_stream(
    job: Job, plan: ToolPlan | None = None, opened: bool | None = None
) -> AsyncIterator[dict | str]:
    """Chat completion chunks: the role first, then content (with logprobs when asked). With
    tools (`plan`), the envelope is streamed as OpenAI streams calls: a call's index, id and name
    once its name is written, then its arguments in fragments; or the response's text. `opened`
    not None: a thought arrives apart, as ``reasoning_content`` (it says whether the prompt
    opened the thought; :mod:`~onnxsample.serve.reasoning`)."""
    done: list[Completion] = []

    async def chunks() -> AsyncIterator[dict]:
        # with tools the answer may be calls alone: its content stays null (as OpenAI streams it)
        # until text arrives, so the assembled stream's message is the unstreamed one
        opening = {"role": "assistant", "content": "" if plan is None else None}
        for seq in job.seqs:
            yield job.chunk(_piece(seq.index, opening))
        watch = ToolWatch(plan, len(job.requests)) if plan is not None else None
        thoughts = [ThoughtStream(opened) for _ in job.requests] if opened is not None else None
        written = [""] * len(job.requests)  # each choice's text so far
        sent = [0] * len(job.requests)  # of its answer, sent as content (without tools)
        held = [_Held() for _ in job.requests]
        ended: set[int] = set()
        async for k, event in merged_events(job.requests, job.metrics, ended):
            if event.progress is not None:  # llama-server's: the role again, and the progress
                yield job.token_chunk(_piece(event.index, {"role": "assistant", "content": None}),
                                      event)  # fmt: skip
                continue
            c = event.completion
            written[k] = c.text if c is not None else written[k] + event.text
            delta: dict = {}
            answer = written[k]
            if thoughts is not None:
                thought, answer = thoughts[k].feed(written[k], final=c is not None)
                if thought:
                    delta["reasoning_content"] = thought
            if watch is not None:
                if delta:
                    yield job.token_chunk(_piece(event.index, delta), event)
                for tool_delta in watch.feed_text(k, answer):
                    yield job.token_chunk(_piece(event.index, tool_delta), event)
                if watch.repeated(k):
                    ended.add(k)
                    job.requests[k].cancel()  # the model loops on a call: the answer ends here
                if c is not None and not job.cut(c):
                    done.append(c)
                    _, _, finish = watch.streams[k].message(convert.FINISH[c.finish_reason])
                    yield job.chunk({**_piece(c.index, {}), "finish_reason": finish},
                                    convert.timings(c))  # fmt: skip
                continue
            if len(answer) > sent[k]:
                delta["content"], sent[k] = answer[sent[k] :], len(answer)
            logprobs = None
            ids, lps, tops = _logprob_positions(held[k].take(event, len(written[k])), c)
            if ids:
                content = convert.chat_logprobs(
                    job.engine.tokenizer,
                    ids,
                    lps,
                    tops,
                    post_sampling=job.seqs[k].params.post_sampling_probs is not None,
                )
                logprobs = {"content": content}
            if delta or logprobs:
                yield job.token_chunk(
                    _piece(event.index, delta or {"content": ""}, logprobs), event
                )
            if c is not None and not job.cut(c):
                done.append(c)
                finish = convert.FINISH[c.finish_reason]
                yield job.chunk({**_piece(c.index, {}), "finish_reason": finish},
                                convert.timings(c))  # fmt: skip

    return job.framed(chunks(), done)


def completion_stream(
    job: Job, echo: dict[int, str], n_logprobs: int | None, score_only: bool
) -> AsyncIterator[dict | str]:
    """Text completion chunks; with echo, a choice's first chunk is its prompt (and, with
    logprobs, the prompt tokens' logprobs, known once the prompt is computed). `score_only`
    (echo with max_tokens 0) streams the prompts alone."""
    done: list[Completion] = []
    tokenizer = job.engine.tokenizer

    def chunk(index: int, text: str, finish=None, logprobs=None, timings=None) -> dict:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return job.chunk(choice, timings)

    # Where each choice's next token starts in its whole text (the echoed prompt included), so
    # that text_offset counts from the start of the choice as in a response that is not streamed.
    offsets: dict[int, convert.TextOffsets] = {}

    def logprobs_of(index: int, ids, lps, tops) -> dict:
        going_on = offsets.get(index) or offsets.setdefault(index, convert.TextOffsets(tokenizer))
        return convert.legacy_logprobs(tokenizer, ids, lps, tops, going_on)

    async def chunks() -> AsyncIterator[dict]:
        started: set[int] = set()
        written = [0] * len(job.requests)  # each choice's characters out so far
        held = [_Held() for _ in job.requests]
        async for k, event in merged_events(job.requests, job.metrics):
            if event.progress is not None:
                yield job.token_chunk(_text_piece(event.index, ""), event)
                continue
            if event.index in echo and event.index not in started:
                seq, logprobs = job.seqs[k], None
                if n_logprobs is not None:  # written by the engine before this first event
                    logprobs = logprobs_of(
                        event.index, seq.prompt, seq.prompt_logprobs, seq.prompt_tops
                    )
                yield chunk(event.index, echo[event.index], logprobs=logprobs)
            started.add(event.index)
            written[k] += len(event.text)
            ids: list[int] = []
            if not score_only:
                released = held[k].take(event, written[k])
                ids, lps, tops = _logprob_positions(released, event.completion)
            if not score_only and (event.text or ids):
                logprobs = logprobs_of(event.index, ids, lps, tops) if ids else None
                yield job.token_chunk(_text_piece(event.index, event.text, logprobs), event)
            if (c := event.completion) is not None and not job.cut(c):
                if not score_only:
                    done.append(c)
                finish = "length" if score_only else convert.FINISH[c.finish_reason]
                yield chunk(c.index, "", finish, timings=convert.timings(c, score_only=score_only))

    return job.framed(chunks(), done)
