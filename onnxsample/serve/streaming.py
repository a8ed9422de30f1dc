"""Reading a request's choices as they decode: whole (`collect`) or as OpenAI's SSE chunks.

Each choice is one engine request; their events are merged as they arrive. A client that goes
away cancels its requests, so their slots are free at the engine's next step: a streaming response
is cancelled by the server when the socket closes (the generators' ``finally``), and `collect`
watches for the disconnect itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from starlette.requests import Request as HTTPRequest

from onnxsample.engine import Engine
from onnxsample.errors import OnnxSampleError
from onnxsample.request import Completion, Request, StreamEvent
from onnxsample.serve import convert
from onnxsample.serve.errors import from_library
from onnxsample.serve.metrics import Metrics


def _finished(metrics: Metrics, completion: Completion) -> None:
    t = completion.timings
    metrics.requests.labels(completion.finish_reason).inc()
    metrics.prompt_tokens.inc(t.prompt_tokens)
    metrics.cached_tokens.inc(t.cached_tokens)
    metrics.generated_tokens.inc(len(completion.token_ids))
    if completion.token_ids:
        metrics.ttft.observe(t.ttft_s)


async def _merged(
    requests: list[Request], metrics: Metrics
) -> AsyncIterator[tuple[int, StreamEvent]]:
    """(choice position, event) of every request, as they arrive; errors raised."""
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
                if k in last:
                    metrics.itl.observe(now - last[k])
                last[k] = now
            if item.completion is not None:
                _finished(metrics, item.completion)
            yield k, item
    finally:
        for request in requests:
            request.cancel()  # nothing for finished requests; frees the slot of the others
        for task in tasks:
            task.cancel()


async def collect(requests: list[Request], http: HTTPRequest, metrics: Metrics) -> list[Completion]:
    """Every choice's completion; if the client disconnects first, the requests are cancelled."""
    done: dict[int, Completion] = {}

    async def gather() -> None:
        async for _k, event in _merged(requests, metrics):
            if event.completion is not None:
                done[event.index] = event.completion

    task = asyncio.create_task(gather())
    while not task.done():
        finished, _ = await asyncio.wait({task}, timeout=0.25)
        if not finished and await http.is_disconnected():
            task.cancel()
            for request in requests:
                request.cancel()
            raise asyncio.CancelledError("the client went away")
    task.result()  # raises the requests' error, if any
    return [done[k] for k in sorted(done)]


def _error_chunk(exc: BaseException) -> dict:
    err = from_library(exc) if isinstance(exc, OnnxSampleError) else None
    message = err.message if err else f"internal error: {type(exc).__name__}"
    return {"error": {"message": message, "type": "server_error", "param": None, "code": 500}}


async def chat_stream(
    engine: Engine,
    requests,
    seqs,
    prompts: list[list[int]],
    meta: dict,
    include_usage: bool,
    metrics: Metrics,
) -> AsyncIterator[dict | str]:
    base = {**meta, "object": "chat.completion.chunk"}

    def chunk(index: int, delta: dict, finish=None, logprobs=None, **extra) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {
            **base,
            "choices": [{**choice, **extra}],
            **({"usage": None} if include_usage else {}),
        }

    for seq in seqs:
        yield chunk(seq.index, {"role": "assistant", "content": ""})
    done: list[Completion] = []
    try:
        async for _k, event in _merged(requests, metrics):
            logprobs = None
            if event.logprob is not None:
                content = convert.chat_logprobs(
                    engine.tokenizer, [event.token_id], [event.logprob], [event.top_logprobs or []]
                )
                logprobs = {"content": content}
            if event.text or logprobs:
                yield chunk(event.index, {"content": event.text}, logprobs=logprobs)
            if event.completion is not None:
                c = event.completion
                done.append(c)
                yield chunk(
                    c.index, {}, convert.FINISH[c.finish_reason], timings=convert.timings(c)
                )
    except Exception as exc:
        yield _error_chunk(exc)
        return
    if include_usage:
        yield {**base, "choices": [], "usage": convert.usage(done, prompts)}
    yield "[DONE]"


async def completion_stream(
    engine: Engine,
    requests,
    seqs,
    prompts: list[list[int]],
    meta: dict,
    include_usage: bool,
    metrics: Metrics,
    echo: dict[int, str],
    n_logprobs: int | None,
    score_only: bool,
) -> AsyncIterator[dict | str]:
    """Text completion chunks; with echo, a choice's first chunk is its prompt (and, with
    logprobs, the prompt tokens' logprobs, known once the prompt is computed)."""
    base = {**meta, "object": "text_completion"}

    def chunk(index: int, text: str, finish=None, logprobs=None, **extra) -> dict:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return {
            **base,
            "choices": [{**choice, **extra}],
            **({"usage": None} if include_usage else {}),
        }

    done: list[Completion] = []
    started: set[int] = set()
    try:
        async for k, event in _merged(requests, metrics):
            if event.index in echo and event.index not in started:
                seq, logprobs = seqs[k], None
                if n_logprobs is not None:  # written by the engine before this first event
                    logprobs = convert.legacy_logprobs(
                        engine.tokenizer, seq.prompt, seq.prompt_logprobs, seq.prompt_tops
                    )
                yield chunk(event.index, echo[event.index], logprobs=logprobs)
            started.add(event.index)
            if not score_only and (event.text or event.logprob is not None):
                logprobs = None
                if event.logprob is not None:
                    logprobs = convert.legacy_logprobs(
                        engine.tokenizer, [event.token_id], [event.logprob], [event.top_logprobs]
                    )
                yield chunk(event.index, event.text, logprobs=logprobs)
            if event.completion is not None:
                c = event.completion
                done.append(c)
                finish = "length" if score_only else convert.FINISH[c.finish_reason]
                yield chunk(c.index, "", finish, timings=convert.timings(c))
    except Exception as exc:
        yield _error_chunk(exc)
        return
    if include_usage:
        yield {**base, "choices": [], "usage": convert.usage([] if score_only else done, prompts)}
    yield "[DONE]"
