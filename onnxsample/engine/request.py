"""What a caller gets back from the engine: :class:`Request` handles, their events and results.

A :class:`Request` is returned by :meth:`onnxsample.Engine.submit` at once. The engine's thread
pushes :class:`StreamEvent` s into it as tokens are decoded; any thread reads them with a plain
``for`` loop, an asyncio task with ``async for``, or waits for the final :class:`Completion` with
:meth:`Request.result` (or ``await`` :meth:`Request.aresult`). :meth:`Request.cancel` asks the
engine to stop the request at its next step and free the slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["Completion", "PromptProgress", "Request", "StreamEvent", "Timings"]

TopLogprobs = list[tuple[int, float]]


@dataclass
class Timings:
    """One request's (or one batch's) timings, llama.cpp style.

    ``ttft_s`` runs from submission to the first token; ``queue_s`` is the part spent waiting for a
    slot; ``prefill_s`` is the time of the calls that processed the prompt (``cached_tokens`` of it
    were reused from the slot's previous request and not computed again); ``decode_s`` is the time
    of the decode steps the request took part in. With speculative decoding, ``draft_tokens``
    were verified and ``accepted_tokens`` of them kept.
    """

    prompt_tokens: int = 0
    generated_tokens: int = 0
    sequences: int = 1
    cached_tokens: int = 0
    ttft_s: float = 0.0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def prompt_tps(self) -> float:
        computed = self.prompt_tokens - self.cached_tokens
        return computed / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        decoded = max(self.generated_tokens - self.sequences, 0)  # first tokens come from prefill
        return decoded / self.decode_s if self.decode_s else 0.0

    def to_json(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens,
            "sequences": self.sequences,
            "ttft_ms": round(self.ttft_s * 1000, 2),
            "queue_ms": round(self.queue_s * 1000, 2),
            "prefill_ms": round(self.prefill_s * 1000, 2),
            "decode_ms": round(self.decode_s * 1000, 2),
            "prompt_tokens_per_s": round(self.prompt_tps, 2),
            "decode_tokens_per_s": round(self.decode_tps, 2),
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
        }


@dataclass
class Completion:
    """One request's result.

    ``finish_reason`` is ``stop`` (a stop string), ``eos``, ``length`` (``max_new_tokens`` or the
    end of the context / KV buffer) or ``cancelled``; ``end_token`` is the end-of-sequence token
    that finished it (``eos``), which is no part of ``token_ids``; ``end_logprob`` /
    ``end_top_logprobs`` are its own, when the request asked for logprobs (llama-server lists
    them). ``logprobs`` / ``top_logprobs`` are per generated token; ``prompt_logprobs`` /
    ``prompt_top_logprobs`` per prompt token (``None`` for the first, which has no context), when
    the request asked for them. ``token_offsets`` say where each
    generated token's text begins in the text (a token that ends a character the one before began
    begins where that character does), so a stop string's tokens are told apart
    (:meth:`written_tokens`). ``constraint_complete`` says, for a constrained request, whether its
    tokens complete what the constraint matches (an answer the token limit cut may not).
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_token_ids: list[int]
    seed: int
    logprobs: list[float] | None = None
    top_logprobs: list[TopLogprobs] | None = None
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[TopLogprobs | None] | None = None
    timings: Timings = field(default_factory=Timings)
    end_token: int | None = None
    token_offsets: list[int] = field(default_factory=list)
    end_logprob: float | None = None
    end_top_logprobs: TopLogprobs | None = None
    constraint_complete: bool | None = None

    def written_tokens(self) -> int:
        """How many of ``token_ids`` wrote ``text``: all but the tokens of the stop string that
        ended it (a token whose text begins before the stop string is one of them);
        ``token_offsets`` are where each token's text begins in the text, in characters."""
        if self.finish_reason != "stop":
            return len(self.token_ids)
        return sum(offset < len(self.text) for offset in self.token_offsets)

    def to_json(self) -> dict:
        data = {
            "index": self.index,
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "seed": self.seed,
            "timings": self.timings.to_json(),
        }
        if self.logprobs is not None:
            data["logprobs"] = self.logprobs
        if self.top_logprobs is not None:
            data["top_logprobs"] = [[[t, lp] for t, lp in step] for step in self.top_logprobs]
        if self.prompt_logprobs is not None:
            data["prompt_logprobs"] = self.prompt_logprobs
        if self.prompt_top_logprobs is not None:
            data["prompt_top_logprobs"] = [
                None if step is None else [[t, lp] for t, lp in step]
                for step in self.prompt_top_logprobs
            ]
        return data


@dataclass(frozen=True)
class PromptProgress:
    """How far a request's prompt is (llama-server's ``prompt_progress``): of its ``total``
    tokens, ``cache`` were reused from the slot's cache and ``processed`` are in the cache now
    (the reused ones included); ``time_ms`` since the request got its slot."""

    total: int
    cache: int
    processed: int
    time_ms: int

    def to_json(self) -> dict:
        return {"total": self.total, "cache": self.cache, "processed": self.processed,
                "time_ms": self.time_ms}  # fmt: skip


@dataclass
class StreamEvent:
    """A piece of one request's text; `completion` is set on the event that finishes it.

    ``token_id`` is the token that produced the piece (``None`` on an event that only finishes the
    request, such as a cancel), and ``offset`` where that token's text begins in the completion's
    text; ``text`` may be empty while a multi-byte character or a possible stop string is held
    back, and the event that lets held-back text out carries it, so its ``text`` may begin before
    ``offset`` (the pieces joined in order are the completion's text).
    ``logprob`` / ``top_logprobs`` are the token's, when the request asked for them (not for an
    end-of-sequence token, which is no part of the output). ``timings`` are
    the request's when the token came (a copy; llama-server's ``timings_per_token``), and an
    event with ``progress`` (and no token) says how far the prompt is, for a sequence that asked
    (:class:`~onnxsample.engine._sequence.Sequence`'s ``report_timings`` and
    ``report_progress``).
    """

    index: int
    text: str
    token_id: int | None
    completion: Completion | None = None
    logprob: float | None = None
    top_logprobs: TopLogprobs | None = None
    timings: Timings | None = None
    progress: PromptProgress | None = None
    offset: int | None = None


class Request:
    """A handle on one submitted request; safe to use from any thread and from asyncio.

    Iterate it (``for`` or ``async for``) for its :class:`StreamEvent` s — each event is delivered
    once, to whichever loop reads it — or call :meth:`result` for the :class:`Completion`. A request
    that fails (for example when its KV cache cannot be allocated) raises its error from both.
    """

    def __init__(self, request_id: str, index: int, cancel_hook: Callable[[], None]) -> None:
        self.id = request_id
        self.index = index
        self.submitted = time.perf_counter()
        self._cancel_hook = cancel_hook
        self._cond = threading.Condition()
        self._events: deque[StreamEvent] = deque()
        self._completion: Completion | None = None
        self._error: BaseException | None = None
        self._cancelled = threading.Event()
        self._listeners: list[Callable[[], None]] = []

    # ---- consumer side --------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._completion is not None or self._error is not None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop the request at the engine's next step (its slot is freed); idempotent."""
        if not self.done and not self._cancelled.is_set():
            self._cancelled.set()
            self._cancel_hook()

    def result(self, timeout: float | None = None) -> Completion:
        """Block until the request finishes; its :class:`Completion` (or its error, raised)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.done, timeout):
                raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._completion is not None
        return self._completion

    async def aresult(self) -> Completion:
        """:meth:`result` for asyncio: waits without blocking the event loop."""
        async for _event in self:
            pass
        return self.result(timeout=0)

    def __iter__(self) -> Iterator[StreamEvent]:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._events or self.done)
                if self._events:
                    event = self._events.popleft()
                elif self._error is not None:
                    raise self._error
                else:
                    return
            yield event

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[StreamEvent]:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()

        def wake() -> None:
            # A closed loop raises RuntimeError: nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(ready.set)

        with self._cond:
            self._listeners.append(wake)
        try:
            while True:
                ready.clear()  # before looking: a push after this look schedules set() anew
                with self._cond:
                    event = self._events.popleft() if self._events else None
                    finished, error = self.done, self._error
                if event is not None:
                    yield event
                elif error is not None:
                    raise error
                elif finished:
                    return
                else:
                    await ready.wait()
        finally:
            with self._cond:
                self._listeners.remove(wake)

    def _subscribe(self, wake: Callable[[], None]) -> None:
        """Call `wake` (from the engine's thread) whenever an event arrives or the request ends;
        at once if something is already there."""
        with self._cond:
            self._listeners.append(wake)
            ready = bool(self._events) or self.done
        if ready:
            wake()

    def _drain(self) -> tuple[list[StreamEvent], BaseException | None]:
        """The events that arrived so far, without waiting, and the request's error if it failed."""
        with self._cond:
            events = list(self._events)
            self._events.clear()
            return events, self._error

    # ---- engine side ----------------------------------------------------------------------------

    def _push(self, event: StreamEvent) -> None:
        with self._cond:
            self._events.append(event)
            if event.completion is not None:
                self._completion = event.completion
            self._cond.notify_all()
            listeners = list(self._listeners)
        for wake in listeners:
            wake()

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            if self.done:
                return
            self._error = error
            self._cond.notify_all()
            listeners = list(self._listeners)
        for wake in listeners:
            wake()

    def __repr__(self) -> str:
        state = "done" if self.done else "cancelled" if self.cancelled else "running"
        return f"Request({self.id!r}, {state})"
