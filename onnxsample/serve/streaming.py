"""Reading a request's choices as they decode: whole (`collect`) or as OpenAI's SSE chunks.

Each choice is one engine request; their events are merged as they arrive. A client that goes
away cancels its requests, so their slots are free at the engine's next step: a streaming response
is cancelled by the server when the socket closes (the generators' ``finally``), and `collect`
watches for the disconnect itself.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from starlette.requests import Request as HTTPRequest
from starlette.responses import StreamingResponse

from onnxsample.engine import Engine
from onnxsample.engine.request import Completion, Request, StreamEvent
from onnxsample.errors import OnnxSampleError, QueueFull
from onnxsample.serve import convert
from onnxsample.serve.errors import APIError, ClientGone, error_body, from_library
from onnxsample.serve.metrics import Metrics
from onnxsample.serve.reasoning import ThoughtStream
from onnxsample.serve.schemas import SamplingFields
from onnxsample.serve.tools import ToolPlan, ToolWatch

__all__ = [
    "Job",
    "chat_stream",
    "collect",
    "completion_stream",
    "enqueue",
    "error_chunk",
    "merged_events",
    "shutdown_chunk",
    "sse",
]


def enqueue(engine: Engine, seqs: list, metrics: Metrics) -> list[Request]:
    """All of a request's choices onto `engine`, or none (a full queue is counted, then raised)."""
    try:
        return engine.enqueue(seqs)
    except QueueFull:
        metrics.rejected.labels("queue_full").inc()
        raise


def _finished(metrics: Metrics, completion: Completion, ended: bool = False) -> None:
    """Count a finished request: `ended` when the server ended its answer at a repeated tool
    call (the engine reports it cancelled; the client reads ``tool_calls``)."""
    t = completion.timings
    reason = "tool_calls" if ended and completion.finish_reason == "cancelled" else None
    metrics.requests.labels(reason or completion.finish_reason).inc()
    metrics.prompt_tokens.inc(t.prompt_tokens)
    metrics.cached_tokens.inc(t.cached_tokens)
    metrics.generated_tokens.inc(len(completion.token_ids))
    metrics.draft_tokens.inc(t.draft_tokens)
    metrics.accepted_tokens.inc(t.accepted_tokens)
    if completion.token_ids:
        metrics.ttft.observe(t.ttft_s)


def _cut(completion: Completion, n: int) -> Completion:
    """An answer the server ended after its `n`-th token, as the client got it: the tokens (and
    their logprobs) up to there, so its usage does not depend on how soon the cancel arrived."""
    tops = completion.top_logprobs
    return replace(
        completion,
        token_ids=completion.token_ids[:n],
        logprobs=completion.logprobs[:n] if completion.logprobs is not None else None,
        top_logprobs=tops[:n] if tops is not None else None,
    )


async def merged_events(
    requests: list[Request], metrics: Metrics, ended: set[int] | None = None
) -> AsyncIterator[tuple[int, StreamEvent]]:
    """(choice position, event) of every request, as they arrive; errors raised. `ended`: the
    positions whose answers the server ends itself (a repeated tool call), filled as it does."""
    ended = set() if ended is None else ended
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(k: int, request: Request) -> None:
        try:
            async for event in request:
                await queue.put((k, event))
        except BaseException as exc:  # handed to the reader
            await queue.put((k, exc))
        finally:
            await queue.put((k, None))

    tasks = [asyncio.create_task(pump(k, r)) for k, r in enumerate(requests)]
    last: dict[int, float] = {}
    finished: set[int] = set()
    tokens = [0] * len(requests)  # each choice's tokens handed on so far
    cut: dict[int, int] = {}  # an ended answer's tokens when it ended
    try:
        running = len(tasks)
        while running:
            k, item = await queue.get()
            if item is None:
                running -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            now = time.perf_counter()
            if item.token_id is not None:
                tokens[k] += 1
                if k in last:
                    metrics.itl.observe(now - last[k])
                last[k] = now
            if item.completion is not None:
                # what the engine decoded before the cancel reached it is not the answer's
                if k in cut:
                    item = replace(item, completion=_cut(item.completion, cut[k]))
                finished.add(k)
                _finished(metrics, item.completion, k in ended)
            yield k, item
            if k in ended and k not in cut:  # the consumer ended it at this event
                cut[k] = tokens[k]
    finally:
        for k, request in enumerate(requests):
            request.cancel()  # nothing for finished requests; frees the slot of the others
            if k not in finished:  # the client went away (or the stream was cut) before it ended
                metrics.requests.labels("cancelled").inc()
        for task in tasks:
            task.cancel()


async def collect(
    requests: list[Request],
    http: HTTPRequest,
    metrics: Metrics,
    stopping: Callable[[], bool] = lambda: False,
    ends: Callable[[int, StreamEvent], bool] = lambda k, event: False,
) -> list[Completion]:
    """Every choice's completion; if the client disconnects first, the requests are cancelled and
    :class:`ClientGone` raised (there is nobody to answer); a request the stopping server cut is
    a 503. `ends(k, event)` says when choice `k`'s answer is over before the engine says so (it
    is then cancelled, and its completion holds what it wrote)."""
    done: dict[int, Completion] = {}
    ended: set[int] = set()

    async def gather() -> None:
        async for k, event in merged_events(requests, metrics, ended):
            if event.completion is not None:
                done[event.index] = event.completion
            elif ends(k, event):
                ended.add(k)
                requests[k].cancel()

    task = asyncio.create_task(gather())
    while not task.done():
        finished, _ = await asyncio.wait({task}, timeout=0.25)
        if not finished and await http.is_disconnected():
            task.cancel()
            for request in requests:
                request.cancel()
            raise ClientGone
    task.result()  # raises the requests' error, if any
    if stopping() and any(c.finish_reason == "cancelled" for c in done.values()):
        raise APIError(503, _SHUTDOWN, code="unavailable")
    return [done[k] for k in sorted(done)]


_SHUTDOWN = "the server is shutting down: the request was cut before it finished"


def shutdown_chunk() -> dict:
    """The error a stream ends with when the stopping server cut it."""
    return {"error": {"message": _SHUTDOWN, "type": "service_unavailable", "param": None,
                      "code": 503}}  # fmt: skip


def sse(chunks: AsyncIterator[dict | str]) -> StreamingResponse:
    """`chunks` as server-sent events: ``data: <json>`` each (a string as it is)."""

    async def events() -> AsyncIterator[str]:
        async for chunk in chunks:
            text = chunk if isinstance(chunk, str) else json.dumps(chunk, ensure_ascii=False)
            yield f"data: {text}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def error_chunk(exc: BaseException) -> dict:
    """The event that ends a stream whose request failed: the error the answer would have been
    (a client's mistake found mid-way, such as a step whose kept set is past the candidates, is
    a 400 naming its field), or an internal error."""
    if isinstance(exc, OnnxSampleError):
        err = from_library(exc)
        return error_body(err.status, err.message, err.param, err.code)
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
            yield error_chunk(exc)
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


def _piece(index: int, delta: dict, logprobs: dict | None = None) -> dict:
    """A chat chunk's choice that is not its last."""
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}


def reporting(seqs: list, body: SamplingFields) -> list:
    """`seqs`, which report how far their prompts are and their timings at each token when
    `body` asks a stream for them (llama-server's ``return_progress`` and ``timings_per_token``;
    a whole answer has nowhere to put them)."""
    for seq in seqs:
        seq.report_progress = body.stream and body.return_progress
        seq.report_timings = body.stream and body.timings_per_token
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
        for seq in job.seqs:
            yield job.chunk(_piece(seq.index, {"role": "assistant", "content": ""}))
        watch = ToolWatch(plan, len(job.requests)) if plan is not None else None
        thoughts = [ThoughtStream(opened) for _ in job.requests] if opened is not None else None
        written = [""] * len(job.requests)  # each choice's text so far
        sent = [0] * len(job.requests)  # of its answer, sent as content (without tools)
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
                if c is not None:
                    done.append(c)
                    _, _, finish = watch.streams[k].message(convert.FINISH[c.finish_reason])
                    yield job.chunk({**_piece(c.index, {}), "finish_reason": finish},
                                    convert.timings(c))  # fmt: skip
                continue
            if len(answer) > sent[k]:
                delta["content"], sent[k] = answer[sent[k] :], len(answer)
            logprobs = None
            if event.logprob is not None:
                content = convert.chat_logprobs(
                    job.engine.tokenizer,
                    [event.token_id],
                    [event.logprob],
                    [event.top_logprobs or []],
                    post_sampling=job.seqs[k].params.post_sampling_probs is not None,
                )
                logprobs = {"content": content}
            if delta or logprobs:
                yield job.token_chunk(
                    _piece(event.index, delta or {"content": ""}, logprobs), event
                )
            if c is not None:
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
    offsets: dict[int, int] = {}

    def logprobs_of(index: int, ids, lps, tops) -> dict:
        found = convert.legacy_logprobs(tokenizer, ids, lps, tops, offsets.get(index, 0))
        if found["tokens"]:
            offsets[index] = found["text_offset"][-1] + len(found["tokens"][-1])
        return found

    async def chunks() -> AsyncIterator[dict]:
        started: set[int] = set()
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
            if not score_only and (event.text or event.logprob is not None):
                logprobs = None
                if event.logprob is not None:
                    logprobs = logprobs_of(
                        event.index, [event.token_id], [event.logprob], [event.top_logprobs]
                    )
                yield job.token_chunk(_text_piece(event.index, event.text, logprobs), event)
            if (c := event.completion) is not None:
                if not score_only:
                    done.append(c)
                finish = "length" if score_only else convert.FINISH[c.finish_reason]
                yield chunk(c.index, "", finish, timings=convert.timings(c, score_only=score_only))

    return job.framed(chunks(), done)
