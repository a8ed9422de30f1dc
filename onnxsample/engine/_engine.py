"""`Engine`: requests from any thread, at any time, onto one composed model.

One scheduler thread owns the ONNX Runtime session, the slots, the KV cache and the sampler state;
everything else talks to it through a thread-safe queue. :meth:`Engine.submit` tokenises and
validates a request in the caller's thread (so bad input fails at once, costing the engine
nothing) and returns a :class:`~onnxsample.engine.request.Request` at once; the request joins the running
batch at the engine's next step, or waits (FIFO) for a free slot. Past ``max_queue`` waiting
requests, :meth:`~Engine.submit` raises :class:`~onnxsample.errors.QueueFull`.

This is how llama-server (one ``server_context`` owning the slots) and vLLM (an engine core behind an
async front end) serve per-request samplers on one model; here the samplers are inputs of the graph,
so every request brings its own parameters and seed without rebuilding anything.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence as Seq
from dataclasses import replace
from pathlib import Path
from typing import Any

from onnxsample._memory import give_back_freed_memory
from onnxsample.engine._drafter import (
    DEFAULT_DRAFT_TOKENS,
    DEFAULT_NGRAM,
    NgramDrafter,
    check_method,
    speculation,
)
from onnxsample.engine._kv_concat import ConcatLayout
from onnxsample.engine._kv_shared import KEEP_SECONDS, SharedKV, SharedLayout, kv_specs
from onnxsample.engine._loaded import load_model
from onnxsample.engine._options import checked_options, positions_limit
from onnxsample.engine._requests import Requests
from onnxsample.engine._runner import Runner
from onnxsample.engine._scheduler import Scheduler
from onnxsample.engine._sequence import Sequence
from onnxsample.engine._slots import SlotState, slots_symbolic
from onnxsample.engine._stats import Stats
from onnxsample.engine.request import Request
from onnxsample.errors import EngineClosed, GenerationError, InvalidParameter, QueueFull
from onnxsample.params import SamplingParams
from onnxsample.text._grammar import GrammarVocabulary
from onnxsample.text._prompt import Prompt

__all__ = [
    "DEFAULT_DRAFT_TOKENS",
    "DEFAULT_NGRAM",
    "DEFAULT_PREFILL_CHUNK",
    "Engine",
    "Prompt",
]

log = logging.getLogger(__name__)

# Prompt tokens per step while other sequences decode: every streaming client waits for each
# chunk, so it bounds their worst gap. On the embedded model (2 cores, 2 threads): 8 chat clients
# got 1.25x the tokens/s, half the TTFT p50 and 0.5-0.65x the ITL p99 with 32 than with 128; two
# streams' longest gap during a 2,000-token admission is 0.10 s with 32 against 0.28 s with 128,
# for an admission of 6.0 s against 3.9 s.
DEFAULT_PREFILL_CHUNK = 32
_CLOSE, _WAKE = object(), object()


class Engine:
    """Serves a composed model (see :func:`onnxsample.compose`) to any number of threads.

    `model` is a composed ``.onnx`` file; the tokenizer, generation config and export manifest are
    read from `tokenizer` (default: the model's folder); `chat_template` (jinja text) replaces the
    folder's chat template. `provider` is ``auto``, ``cpu`` or ``cuda``;
    `threads` sets ONNX Runtime's intra-op threads. `max_len` caps the KV positions of a sequence
    (default, and at most: the model's context). `max_queue` bounds the requests waiting for a
    slot (None: no bound). `prefill_chunk` is how many prompt tokens a step computes while other
    sequences decode (None or 0: a whole prompt at once). `prefix_reuse` lets a request reuse the
    cached prefix a finished request left in its slot (llama-server's ``cache_prompt``). `speculative` ``"ngram"`` turns
    on speculative decoding with drafts from n-gram prompt lookup: up to `draft_tokens` tokens per
    step (default 8, at most what the model was composed for), matched on the last `ngram`
    tokens or fewer; the graph verifies them with each request's own sampler chain, so the
    output's distribution is unchanged, and on an export with exact attention (``onnxsample
    export --attention exact``) the output is plain decoding's token for token (with
    GroupQueryAttention a verified token's logits differ in their last bits: a warning says so). `cuda_graph` (CUDA
    provider, a model composed with ``static=True``) replays each decode step as a captured CUDA
    graph: the running slots decode with one shape, inputs written in place into fixed device
    buffers; prefill runs uncaptured. Left at None it is on where it can be, measured faster at
    every batch size on an H100: ``provider="cuda"``, a static chain, no speculation, attention on
    CUDA. Its steps bind the first 1, 2, 4, 8… rows, enough for the occupied slots (a graph per
    row bucket; sequences move down when slots below them free). `row_buckets` False binds all
    the composed slots instead, every step: on a GPU, where cuBLAS picks its kernels by the
    number of rows, a sequence's numbers then never depend on how many others run (greedy tokens
    alone and batched the same), at the cost of computing every slot (it needs `cuda_graph`).

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        provider: str = "auto",
        threads: int | None = None,
        max_len: int | None = None,
        max_queue: int | None = 256,
        prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
        prefix_reuse: bool = True,
        tokenizer: str | Path | None = None,
        optimization: str = "all",
        speculative: str | None = None,
        draft_tokens: int | None = None,
        ngram: int = DEFAULT_NGRAM,
        cuda_graph: bool | None = None,
        row_buckets: bool = True,
        chat_template: str | None = None,
    ) -> None:
        prefill_chunk = checked_options(model, max_len, max_queue, prefill_chunk)
        check_method(speculative)  # before the model loads
        loaded = load_model(
            Path(model),
            provider=provider,
            threads=threads,
            optimization=optimization,
            cuda_graph=cuda_graph,
            row_buckets=row_buckets,
            speculative=speculative,
            tokenizer=Path(tokenizer) if tokenizer is not None else None,
            chat_template=chat_template,
        )
        self.path, self.session, self.device = loaded.path, loaded.session, loaded.device
        self.meta, self.info, self.cuda_graph = loaded.meta, loaded.info, loaded.cuda_graph
        self.concurrency = loaded.concurrency
        self._pasts, self._inputs = loaded.pasts, loaded.inputs
        self.threads, self.max_len, self.max_queue = threads, max_len, max_queue
        self.prefill_chunk, self.prefix_reuse = prefill_chunk, bool(prefix_reuse)
        self.row_buckets = bool(row_buckets)
        self.tokenizer = self.info.tokenizer
        self.limit = positions_limit(self.info.context_length, max_len)
        meta = self.meta
        grammars = GrammarVocabulary(self.tokenizer, meta.vocab_size, self.info.eos_ids)
        self._requests = Requests(
            meta, self.tokenizer, self.info.eos_ids, self.limit, max_len, self._wake, grammars
        )
        self.speculative, self.draft_tokens = speculation(meta, speculative, draft_tokens, ngram)
        if self.speculative and not meta.exact_positions:
            log.warning(
                "speculative decoding on %s: its attention (GroupQueryAttention) computes a "
                "verified token's logits with other kernels than a one-token step's, so greedy "
                "text can differ from plain decoding (a sequence decoding alone drafts every "
                "step, so all its calls agree with each other and with echo; sequences decoding "
                "together do not draft); on the CPU, an export with --attention exact gives "
                "plain decoding's tokens in any batch",
                self.path.name,
            )
        self.ngram = ngram
        self._lock = threading.Lock()
        self._pending = 0  # submitted, not yet given a slot
        self._free = self.concurrency
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._cancel_on_close = False
        self._dead: BaseException | None = None
        self._scheduler = self._build()
        give_back_freed_memory()  # the load's frees: ONNX Runtime's weight copies, the tokenizer's
        self._thread = threading.Thread(target=self._loop, name="onnxsample-engine", daemon=True)
        self._thread.start()

    # ---- facts --------------------------------------------------------------------------------

    @property
    def max_slots(self) -> int:
        return self.meta.max_slots

    @property
    def vocab_size(self) -> int:
        return self.meta.vocab_size

    @property
    def kv_layout(self) -> str:
        return self.meta.kv_layout

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.info.eos_ids

    @property
    def context_length(self) -> int | None:
        return self.info.context_length

    @property
    def failure(self) -> BaseException | None:
        """Why the engine's thread stopped, if it failed (None while it runs or after close)."""
        return self._dead

    def stats(self) -> Stats:
        """A snapshot of what the engine has done (times, calls, tokens)."""
        return replace(self._scheduler.stats)

    def load(self) -> dict[str, int]:
        """Requests running and waiting, and slots busy, right now (approximate between steps)."""
        with self._lock:
            busy = self.concurrency - self._free
            return {"running": busy, "waiting": self._pending, "slots_busy": busy}

    # ---- requests -----------------------------------------------------------------------------

    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        max_new_tokens: int | None = 256,
        stop: str | Seq[str] | None = None,
        chat: bool | None = None,
        system: str | None = None,
        index: int = 0,
        prefix_reuse: bool = True,
    ) -> Request:
        """Queue one request; returns its :class:`~onnxsample.engine.request.Request` at once.

        `prompt` is a string (put through the chat template when `chat` is true or, with `chat`
        None, when the model has one), a list of token ids (used as they are), or a chat as a list
        of ``{"role": ..., "content": ...}`` messages. `stop` is one stop string or several.
        `max_new_tokens` None generates until end-of-sequence or the end of the context.
        `index` is copied into the request's events (the batch position of a
        :class:`~onnxsample.Generator` call). `prefix_reuse` False computes the whole prompt
        even where a slot holds a prefix of it (llama-server's ``cache_prompt: false``; the
        engine's own `prefix_reuse` False does so for every request). Bad input raises
        :class:`~onnxsample.errors.InvalidParameter` here, before any work.
        """
        if not isinstance(prefix_reuse, bool):
            raise InvalidParameter(f"prefix_reuse must be True or False, got {prefix_reuse!r}")
        seq = self.prepare(prompt, params, max_new_tokens, stop, chat, system, index)
        seq.reuse_prefix = prefix_reuse
        return self.enqueue([seq])[0]

    def enqueue(self, prepared: Seq[Sequence]) -> list[Request]:
        """Queue requests made by :meth:`prepare` (any thread), all or none: without room in the
        queue for every one, :class:`~onnxsample.errors.QueueFull` and nothing is queued (the
        choices of one API request, a batch of prompts). More than the slots and the queue can
        ever hold together is :class:`~onnxsample.errors.InvalidParameter`, not QueueFull."""
        with self._lock:
            if self._closed or self._dead is not None:
                raise EngineClosed("the engine is closed")
            if self.max_queue is not None and len(prepared) > self.concurrency + self.max_queue:
                raise InvalidParameter(
                    f"{len(prepared)} sequences can never be queued together: the engine runs "
                    f"{self.concurrency} and queues {self.max_queue} (max_queue); ask for fewer"
                )
            waiting = self._pending + len(prepared) - self._free
            if self.max_queue is not None and waiting > self.max_queue:
                raise QueueFull(
                    f"all {self.concurrency} slots are busy and "
                    f"{max(0, self._pending - self._free)} requests are waiting "
                    f"(max_queue={self.max_queue}); try again later"
                )
            self._pending += len(prepared)
        for seq in prepared:
            self._inbox.put(seq)
        return [seq.request for seq in prepared]

    def prepare(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        max_new_tokens: int | None,
        stop: str | Seq[str] | None,
        chat: bool | None,
        system: str | None,
        index: int = 0,
    ) -> Sequence:
        """Validate and tokenise one request (any thread): the engine's view of it."""
        return self._requests.sequence(prompt, params, max_new_tokens, stop, chat, system, index)

    # ---- lifetime -----------------------------------------------------------------------------

    def close(self, *, cancel: bool = False, timeout: float | None = None) -> None:
        """Stop taking requests; let the running and waiting ones finish (or, with `cancel`, stop
        them at the next step); join the engine thread. Idempotent."""
        with self._lock:
            self._closed = True
            self._cancel_on_close = cancel or self._cancel_on_close
        self._inbox.put(_CLOSE)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the engine thread did not stop within %s s", timeout)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close(cancel=kind is not None)

    def __repr__(self) -> str:
        spec = f", speculative={self.speculative}/{self.draft_tokens}" if self.speculative else ""
        return (
            f"Engine({self.path.name!r}, {self.device}, {self.max_slots} slots, "
            f"kv={self.kv_layout}, chunk={self.prefill_chunk}{spec})"
        )

    # ---- the engine thread --------------------------------------------------------------------

    def _build(self) -> Scheduler:
        """Fresh runtime state: slot state, cache layout, runner and scheduler."""
        meta = self.meta
        state = SlotState(
            meta,
            self._inputs,
            self.device,
            bucketed=slots_symbolic(self.session),
            buckets=self.row_buckets,
        )
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        specs = kv_specs(self._pasts, meta.kv_head_size, self.path.name)
        if meta.kv_layout == "gqa":
            layout: Any = SharedLayout(
                SharedKV(specs, self.device),
                meta.max_slots,
                pad,
                self.limit,
                fixed=self.cuda_graph,
                rows=state.rows,
                keep_seconds=KEEP_SECONDS if self.prefix_reuse else 0.0,  # nothing would reuse
            )
        else:
            if self.max_len is not None:
                log.info("max_len bounds the context of concat-layout models only through checks")
            layout = ConcatLayout(specs, meta.max_slots, self.device, self.prefix_reuse)
        return Scheduler(
            Runner(self.session, self.device, state, cuda_graph=self.cuda_graph),
            layout,
            state,
            slots=self.concurrency,
            chunk=self.prefill_chunk,
            prefix_reuse=self.prefix_reuse,
            drafter=NgramDrafter(self.draft_tokens, self.ngram) if self.speculative else None,
            on_change=self._on_change,
        )

    def _on_change(self, pending: int, free: int) -> None:
        with self._lock:
            self._pending += pending
            self._free += free

    def _wake(self) -> None:
        self._inbox.put(_WAKE)

    def _intake(self, block: bool, timeout: float | None = None) -> bool:
        """Move submitted requests to the scheduler (waiting for one when `block`, up to
        `timeout` seconds); True when asked to close."""
        closing = False
        try:
            item = self._inbox.get(block=block, timeout=timeout if block else None)
            while True:
                if item is _CLOSE:
                    closing = True
                elif isinstance(item, Sequence):
                    self._scheduler.add(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass
        return closing

    def _loop(self) -> None:
        closing = False
        try:
            while True:
                idle = not self._scheduler.busy and not closing
                wake = self._scheduler.idle() if idle else None  # memory back while idle too
                closing = self._intake(block=idle, timeout=wake) or closing
                if closing and self._cancel_on_close:
                    for seq in [*self._scheduler.waiting, *self._scheduler.prefilling]:
                        seq.request.cancel()
                    for seq in self._scheduler.decoding:
                        seq.request.cancel()
                if closing and not self._scheduler.busy:
                    return
                try:
                    self._scheduler.step()
                except Exception as exc:  # a bug: fail what is in flight, start afresh
                    log.exception("engine step failed")
                    self._scheduler.fail_all(GenerationError(f"internal error: {exc}"))
                    with self._lock:
                        self._pending, self._free = 0, self.concurrency
                    self._scheduler = self._build()
        except BaseException as exc:
            self._dead = exc
            log.exception("the engine thread stopped")
            raise
        finally:
            with self._lock:
                self._closed = True
            self._scheduler.fail_all(EngineClosed("the engine stopped"))
            # Let the session, the KV cache and the sampler state go now, not whenever the
            # garbage collector finds them: a closed engine holds no memory.
            self._scheduler.release()
            self.session = None
            try:
                while True:
                    item = self._inbox.get_nowait()
                    if isinstance(item, Sequence):
                        item.request._fail(EngineClosed("the engine stopped"))
            except queue.Empty:
                pass
