"""The engine's requests for one HTTP request: enqueued together, their events merged as they
arrive, and whole answers collected.

Each choice is one engine request. A client that goes away cancels its requests, so their slots
are free at the engine's next step: `collect` watches for the disconnect itself, and a streaming
response is cancelled when its socket closes (`merged_events`' ``finally``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from starlette.requests import Request as HTTPRequest

from onnxsample.engine import Engine
from onnxsample.engine.request import Completion, Request, StreamEvent
from onnxsample.errors import InvalidParameter, QueueFull
from onnxsample.serve import convert
from onnxsample.serve.errors import APIError, ClientGone
from onnxsample.serve.metrics import Metrics

__all__ = ["SHUTDOWN", "collect", "enqueue", "merged_events", "shutdown_error"]

log = logging.getLogger(__name__)


def enqueue(engine: Engine, seqs: list, metrics: Metrics, many: str = "n") -> list[Request]:
    """All of a request's choices onto `engine`, or none (a full queue is counted, then raised).
    More than the engine could ever hold is the fault of the field `many` names (``n``, or
    ``prompt`` for a list of prompts with one choice each)."""
    try:
        return engine.enqueue(seqs)
    except QueueFull:
        metrics.rejected.labels("queue_full").inc()
        raise
    except InvalidParameter as exc:
        raise APIError(400, " ".join(str(exc).split()), param=many) from exc


def _finished(metrics: Metrics, completion: Completion, ended: bool = False) -> None:
    """Count a finished request: `ended` when the server ended its answer at a repeated tool
    call (the engine reports it cancelled; the client reads ``tool_calls``)."""
    reason = "tool_calls" if ended and completion.finish_reason == "cancelled" else None
    metrics.requests.labels(reason or completion.finish_reason).inc()
    _count_tokens(metrics, completion)


_COUNTING: set[asyncio.Task] = set()  # the counts still to come of requests whose client left


def _count_when_done(metrics: Metrics, requests: list[Request]) -> None:
    """Count the tokens of `requests`, which their client left (they are counted as cancelled
    already), once the engine has ended them: it computed their prompts and tokens all the
    same."""

    async def count() -> None:
        for request in requests:
            try:
                _count_tokens(metrics, await request.aresult())
            except Exception as exc:  # its error reached nobody: the tokens are not known
                log.debug("request %s failed after its client left: %s", request.id, exc)

    try:
        task = asyncio.get_running_loop().create_task(count())
    except RuntimeError:  # no event loop: the server is gone, and its metrics with it
        return
    _COUNTING.add(task)
    task.add_done_callback(_COUNTING.discard)


def _count_tokens(metrics: Metrics, completion: Completion) -> None:
    t = completion.timings
    metrics.prompt_tokens.inc(t.prompt_tokens)
    metrics.cached_tokens.inc(t.cached_tokens)
    metrics.generated_tokens.inc(convert.predicted(completion))
    metrics.draft_tokens.inc(t.draft_tokens)
    metrics.accepted_tokens.inc(t.accepted_tokens)
    if completion.token_ids:
        metrics.ttft.observe(t.ttft_s)


def _cut(completion: Completion, n: int) -> Completion:
    """An answer the server ended after its `n`-th token, as the client got it: the tokens (and
    their logprobs) up to there, so its usage does not depend on how soon the cancel arrived
    (nor on an end-of-sequence token the engine wrote after it)."""
    tops = completion.top_logprobs
    return replace(
        completion,
        end_token=None,
        end_logprob=None,
        end_top_logprobs=None,
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
        if left := [r for k, r in enumerate(requests) if k not in finished]:
            _count_when_done(metrics, left)


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

    def cancel() -> None:
        task.cancel()
        for request in requests:
            request.cancel()

    task = asyncio.create_task(gather())
    try:
        while not task.done():
            finished, _ = await asyncio.wait({task}, timeout=0.25)
            if not finished and await http.is_disconnected():
                cancel()
                raise ClientGone
    except asyncio.CancelledError:  # the handler itself cancelled (Ray Serve's, as its client
        cancel()  # goes): the requests with it, or they run on for nobody
        raise
    task.result()  # raises the requests' error, if any
    if stopping() and any(c.finish_reason == "cancelled" for c in done.values()):
        raise shutdown_error()
    return [done[k] for k in sorted(done)]


SHUTDOWN = "the server is shutting down: the request was cut before it finished"


def shutdown_error() -> APIError:
    """The error of a request the stopping server cut: a whole answer's 503, a stream's last
    event (:func:`~onnxsample.serve.streaming.shutdown_chunk`)."""
    return APIError(503, SHUTDOWN, code="unavailable")
