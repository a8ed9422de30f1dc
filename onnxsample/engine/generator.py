"""`Generator`: the simple batch API, a thin wrapper over an :class:`~onnxsample.Engine`.

``generate`` and ``stream`` submit every prompt of a call as its own engine request (its own slot,
parameters and seeded generator), then read their events back in the order they are decoded. There
is no second copy of the stepping logic: prompts beyond the graph's slots wait in the engine's queue,
and two threads using one Generator at once are two sets of requests on one engine.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from pathlib import Path

import numpy as np

from onnxsample.engine._drafter import DEFAULT_NGRAM
from onnxsample.engine._engine import DEFAULT_PREFILL_CHUNK, Engine
from onnxsample.engine.request import Completion, StreamEvent, Timings
from onnxsample.errors import InvalidParameter
from onnxsample.params import SamplingParams
from onnxsample.text._prompt import Prompt

__all__ = ["Completion", "Generator", "StreamEvent", "Timings"]

log = logging.getLogger(__name__)


class Generator:
    """Runs a composed model (see :func:`onnxsample.compose`) on prompts given together.

    The options are :class:`~onnxsample.Engine`'s: `provider` (``auto``, ``cpu``, ``cuda``),
    `threads` (ONNX Runtime intra-op threads), `tokenizer` (the export folder, default the model's),
    `chat_template` (jinja text in place of the folder's), `max_len` (KV positions per sequence,
    default the context), `prefill_chunk`, `prefix_reuse`, speculative decoding (`speculative`,
    `draft_tokens`, `ngram`), `cuda_graph`, `row_buckets` and `optimization` (ONNX Runtime's
    graph optimisation level: ``disable``, ``basic``, ``extended``, ``all``).
    ``last_timings`` holds the timings of the last call. A call is one batch: a prompt that fails
    raises its error and cancels the others (an :class:`~onnxsample.Engine`'s requests fail one
    by one).
    """

    def __init__(
        self,
        model: str | Path,
        *,
        provider: str = "auto",
        threads: int | None = None,
        tokenizer: str | Path | None = None,
        optimization: str = "all",
        max_len: int | None = None,
        prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
        prefix_reuse: bool = True,
        speculative: str | None = None,
        draft_tokens: int | None = None,
        ngram: int = DEFAULT_NGRAM,
        cuda_graph: bool | None = None,
        row_buckets: bool = True,
        chat_template: str | None = None,
    ) -> None:
        self.engine = Engine(
            model,
            provider=provider,
            threads=threads,
            max_len=max_len,
            max_queue=None,
            prefill_chunk=prefill_chunk,
            prefix_reuse=prefix_reuse,
            tokenizer=tokenizer,
            optimization=optimization,
            speculative=speculative,
            draft_tokens=draft_tokens,
            ngram=ngram,
            cuda_graph=cuda_graph,
            row_buckets=row_buckets,
            chat_template=chat_template,
        )
        e = self.engine
        self.path, self.device, self.threads, self.meta = e.path, e.device, e.threads, e.meta
        self.tokenizer, self.max_len = e.tokenizer, max_len
        self.last_timings = Timings()

    # The composed model's facts, as the engine has them.
    chain = property(lambda self: self.meta.chain)
    max_slots = property(lambda self: self.meta.max_slots)
    vocab_size = property(lambda self: self.meta.vocab_size)
    top_logprobs = property(lambda self: self.meta.top_logprobs)
    max_bias = property(lambda self: self.meta.max_bias)
    kv_layout = property(lambda self: self.meta.kv_layout)
    eos_ids = property(lambda self: self.engine.eos_ids)
    context_length = property(lambda self: self.engine.context_length)

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        max_new_tokens: int | None = 256,
        stop: str | Seq[str] | None = None,
        chat: bool | None = None,
        system: str | None = None,
    ) -> list[Completion]:
        """Generate for every prompt; the completions in prompt order."""
        done: dict[int, Completion] = {}
        for event in self.stream(
            prompts, params, max_new_tokens=max_new_tokens, stop=stop, chat=chat, system=system
        ):
            if event.completion is not None:
                done[event.index] = event.completion
        return [done[i] for i in sorted(done)]

    def stream(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        max_new_tokens: int | None = 256,
        stop: str | Seq[str] | None = None,
        chat: bool | None = None,
        system: str | None = None,
    ) -> Iterator[StreamEvent]:
        """Yield text pieces as they are decoded (never half a UTF-8 character), with each prompt's
        index; the event that finishes a prompt carries its :class:`Completion`. Leaving the loop
        early cancels the prompts still running."""
        prompts = _prompt_list(prompts)
        if isinstance(params, SamplingParams) or params is None:
            params = [params or SamplingParams()] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise InvalidParameter(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        # Everything is checked before anything is queued: bad input costs nothing.
        sequences = [
            self.engine.prepare(p, sp, max_new_tokens, stop, chat, system, index=i)
            for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
        ]
        before, began = self.engine.stats(), time.perf_counter()
        arrived: queue.SimpleQueue = queue.SimpleQueue()
        requests = self.engine.enqueue(sequences)
        for request in requests:
            request._subscribe(lambda r=request: arrived.put(r))
        running, first, completions = set(requests), None, []
        try:
            while running:
                request = arrived.get()
                events, error = request._drain()
                for event in events:
                    first = first or time.perf_counter()
                    if event.completion is not None:
                        completions.append(event.completion)
                        running.discard(request)
                    yield event
                if error is not None:
                    raise error
        finally:
            for request in running:
                request.cancel()
        after = self.engine.stats()
        self.last_timings = Timings(
            prompt_tokens=sum(len(s.prompt) for s in sequences),
            generated_tokens=sum(c.timings.generated_tokens for c in completions),
            sequences=len(sequences),
            cached_tokens=sum(c.timings.cached_tokens for c in completions),
            draft_tokens=sum(c.timings.draft_tokens for c in completions),
            accepted_tokens=sum(c.timings.accepted_tokens for c in completions),
            ttft_s=(first or began) - began,
            prefill_s=after.prefill_s - before.prefill_s,
            decode_s=after.decode_s - before.decode_s,
        )

    def close(self) -> None:
        """Stop the engine thread (it also stops with the process)."""
        self.engine.close(cancel=True)

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _prompt_list(prompts) -> list:
    """One prompt (text, token ids or a chat) or a list of them, as a list."""
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise InvalidParameter("at least one prompt is needed")
    ids = all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in prompts)
    if ids or all(isinstance(p, dict) for p in prompts):
        return [prompts]  # one prompt of token ids (numpy's too), or one chat
    return prompts
