"""One request's state inside the engine: its prompt, its place in the cache, what it generated.

:meth:`Sequence.accept` takes one sampled token (and its logprobs) and returns the
:class:`~onnxsample.engine.request.StreamEvent` it produces: end-of-sequence, stop strings, the token
limit and the end of the KV buffer are decided here, without ONNX Runtime, so they can be tested
on their own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from onnxsample.engine._drafter import DraftStats
from onnxsample.engine.request import (
    Completion,
    PromptProgress,
    Request,
    StreamEvent,
    Timings,
    TopLogprobs,
)
from onnxsample.errors import GenerationError, InvalidParameter
from onnxsample.params import SamplingParams
from onnxsample.text import TextStream
from onnxsample.text._grammar import Matcher
from onnxsample.text._stops import StopMatcher

_U_MAX = np.nextafter(np.float32(1), np.float32(0))


@dataclass(eq=False)
class Sequence:
    """A request as the scheduler sees it.

    ``computed`` counts the prompt tokens whose keys and values are in the slot's cache (the reused
    prefix included); the prompt is done when it reaches ``len(prompt)``. ``limit`` is the number of
    positions the request may fill (context or KV buffer length), prompt included.
    ``early_params`` (for ``min_tokens``) are the parameters the slot uses until ``min_tokens``
    tokens are out; ``open_ended`` marks a request without its own token limit, whose cache grows
    as it goes instead of being reserved up front. ``matcher`` follows the request's constraint
    (structured output): it names the tokens allowed next and hears every token taken.
    """

    request: Request
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    detok: TextStream
    stops: StopMatcher
    seed: int
    eos_ids: frozenset[int]
    limit: int | None = None
    slot: int = -1
    computed: int = 0
    passed_over: int = 0  # steps in a row its prompt waited while another's was computed
    ids: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # where each token's text begins
    logprobs: list[float] = field(default_factory=list)
    tops: list[TopLogprobs] = field(default_factory=list)
    prompt_logprobs: list[float | None] = field(default_factory=list)
    prompt_tops: list[TopLogprobs | None] = field(default_factory=list)
    finish: str | None = None
    timings: Timings = field(default_factory=Timings)
    admitted: float = 0.0
    early_params: SamplingParams | None = None
    open_ended: bool = False
    draft: DraftStats = field(default_factory=DraftStats)
    matcher: Matcher | None = None
    end_token: int | None = None  # the end-of-sequence token that finished it
    end_logprob: float | None = None  # and its logprob and alternatives, when asked for
    end_tops: TopLogprobs | None = None
    t_max_predict_ms: float = 0  # > 0: end at a new line once generating took longer (ms)
    report_progress: bool = False  # an event when it gets its slot and after each prompt call
    report_timings: bool = False  # each event with the request's timings when it came
    reuse_prefix: bool = True  # may start from a cached prefix (llama-server's cache_prompt)
    rng: np.random.Generator = field(init=False)
    _decoded: int = field(init=False, default=0)  # characters the tokens decoded to so far

    def __post_init__(self) -> None:
        self.rng = np.random.Generator(np.random.Philox(self.seed))
        self.timings.prompt_tokens = len(self.prompt)
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs, self.prompt_tops = (
                [None],
                [None],
            )  # the first token has no context

    @property
    def index(self) -> int:
        return self.request.index

    @property
    def prefilled(self) -> bool:
        return self.computed >= len(self.prompt)

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None

    def uniform(self) -> np.float32:
        """The next U(0, 1) draw of this sequence's own generator (one per sampled token)."""
        return min(np.float32(self.rng.random()), _U_MAX)

    def uniforms(self, n: int) -> np.ndarray:
        """The next `n` draws (float32 [n]) for a step that may emit up to `n` tokens; call
        :meth:`keep_uniforms` once it is known how many it emitted."""
        self._saved = self.rng.bit_generator.state
        return np.minimum(self.rng.random(n).astype(np.float32), _U_MAX)

    def keep_uniforms(self, used: int) -> None:
        """Of the last :meth:`uniforms` draws, only the first `used` were spent: the generator
        goes on from there, exactly as if one draw per emitted token had been taken."""
        self.rng.bit_generator.state = self._saved
        if used:
            self.rng.random(used)

    def history(self) -> np.ndarray:
        """Prompt and output token ids, int64 [L] (what n-gram drafts are looked up in)."""
        return np.asarray(self.prompt + self.ids, dtype=np.int64)

    def record_prompt(self, logprobs: np.ndarray, ids: np.ndarray | None, lps) -> None:
        """Logprobs of prompt tokens computed by one prefill call, in prompt order."""
        n = self.params.prompt_logprobs or 0
        for i, value in enumerate(logprobs):
            self.prompt_logprobs.append(float(value))
            tops: TopLogprobs | None = [] if not n else None  # None: only the first's
            if ids is not None and n:
                tops = [(int(t), float(v)) for t, v in zip(ids[i][:n], lps[i][:n], strict=True)]
            self.prompt_tops.append(tops)

    def accept(
        self, token: int, logprob: float | None = None, tops: TopLogprobs | None = None
    ) -> StreamEvent:
        """Record a sampled token; decide whether the sequence is finished; the event to send."""
        now = time.perf_counter()
        if not self.ids and self.finish is None:
            self.timings.ttft_s = now - self.request.submitted
        self.timings.generated_tokens += 1
        early = len(self.ids) < self.params.min_tokens
        if token in self.eos_ids and not self.params.ignore_eos and not early:
            self.finish, self.end_token = "eos", token
            if self.params.reports_logprobs and logprob is not None:
                self.end_logprob = float(logprob)
            if self.params.reported_tops and tops is not None:
                self.end_tops = tops[: self.params.reported_tops]
            return self._finished(self._flush(), token)
        self.ids.append(token)
        if self.matcher is not None:
            self.matcher.consume(token)
        if self.params.reports_logprobs:
            self.logprobs.append(float(logprob) if logprob is not None else float("nan"))
        if self.params.reported_tops and tops is not None:
            self.tops.append(tops[: self.params.reported_tops])
        self.offsets.append(self._decoded + self.detok.holding)
        decoded = self.detok.add(token)
        self._decoded += len(decoded)
        piece = self.stops.add(decoded, stops=self._searching)
        if self.stops.stopped:
            self.finish = "length" if self.stops.indented else "stop"
        elif (
            len(self.ids) >= self.max_new_tokens
            or (self.limit and len(self.prompt) + len(self.ids) >= self.limit)
            or self._out_of_time(piece, now)
        ):
            self.finish = "length"
            piece += self._flush()
            if self.stops.stopped:  # the held text's end made one
                self.finish = "length" if self.stops.indented else "stop"
        event = (
            self._finished(piece, token)
            if self.finish
            else StreamEvent(self.index, piece, token, timings=self._timings_now())
        )
        event.offset = self.offsets[-1]
        if self.params.reports_logprobs:
            event.logprob = self.logprobs[-1]
            event.top_logprobs = self.tops[-1] if self.params.reported_tops else None
        return event

    def host_choice(self, ids: np.ndarray, logits: np.ndarray) -> int:
        """The token the request's host sampler chooses among the graph's candidates (`ids`,
        `logits` [K]); :class:`GenerationError` when it fails or chooses outside what the filters
        kept (end-of-sequence aside)."""
        try:
            token = self.params.host_sampler(ids, logits)
            if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
                raise TypeError(f"it returned {token!r}, not a token id")
            if token not in ids[np.isfinite(logits)] and token not in self.eos_ids:
                raise ValueError(
                    f"it returned {token}, which is not among the candidates the filters kept "
                    "nor an end-of-sequence token"
                )
        except Exception as exc:
            raise GenerationError(f"the host sampler failed: {exc}") from exc
        return int(token)

    def constraint_failure(self, token: int) -> InvalidParameter | None:
        """The error that ends the sequence before it takes `token`, once its grammar cannot go
        on (llguidance failed, or allows no token where the text does not complete it), when
        `token` would end it where the text does not complete the grammar (a draft's dead end,
        a host sampler's end-of-sequence), or when the grammar refuses `token`: the sequence's
        text never holds what does not match."""
        if self.matcher is None:
            return None
        if token in self.eos_ids and not self.params.ignore_eos:
            self.matcher.check_end()
        else:  # never a token the grammar refuses in the text, even where a mask let it through
            self.matcher.check_token(token)
        if self.matcher.failure is None:
            return None
        where = f"after {len(self.ids)} tokens"
        return InvalidParameter(f"invalid constraint: {self.matcher.failure}, {where}")

    def end_lines(self, n_indent: int, t_max_predict_ms: float) -> None:
        """llama-server's endings for code completion, set before the sequence is queued: a line
        indented less than `n_indent` ends the text before it (:class:`StopMatcher`), and a piece
        with a new line ends it once generating took more than `t_max_predict_ms`; either ends
        it as the token limit does (``length``). 0 turns one off."""
        self.stops.indent, self.t_max_predict_ms = n_indent, t_max_predict_ms

    def _out_of_time(self, piece: str, now: float) -> bool:
        """llama-server's ``t_max_predict_ms``: a piece with a new line ends the text once more
        than that many ms went by since the first token."""
        if self.t_max_predict_ms <= 0 or "\n" not in piece:
            return False
        first = self.request.submitted + self.timings.ttft_s
        return (now - first) * 1e3 > self.t_max_predict_ms

    def progress(self) -> StreamEvent:
        """An event that says how far the prompt is (llama-server's ``return_progress``)."""
        spent_ms = int((time.perf_counter() - self.admitted) * 1000)
        state = PromptProgress(
            len(self.prompt), self.timings.cached_tokens, self.computed, spent_ms
        )
        return StreamEvent(self.index, "", None, timings=self._timings_now(), progress=state)

    def cancel(self) -> StreamEvent:
        """Finish now, with what was generated so far (``finish_reason`` ``cancelled``)."""
        self.finish = "cancelled"
        return self._finished(self._flush(), None)

    @property
    def _searching(self) -> bool:
        """Whether stop strings are looked for in the last token's text: as vLLM's
        ``min_tokens``, only past the first ``min_tokens`` tokens."""
        return len(self.ids) > self.params.min_tokens

    def _flush(self) -> str:
        """The text still held back (by the detokeniser, then by the stop strings) as the
        sequence ends: the last token's, searched for stop strings as its own text is."""
        return self.stops.add(self.detok.flush(), stops=self._searching) + self.stops.flush()

    def completion(self) -> Completion:
        want_logprobs = self.params.reports_logprobs
        prompt = self.wants_prompt_logprobs
        return Completion(
            index=self.index,
            text=self.stops.text,
            token_ids=list(self.ids),
            finish_reason=self.finish or "length",
            prompt_token_ids=self.prompt,
            seed=self.seed,
            logprobs=list(self.logprobs) if want_logprobs else None,
            top_logprobs=list(self.tops) if self.params.reported_tops else None,
            prompt_logprobs=list(self.prompt_logprobs) if prompt else None,
            prompt_top_logprobs=list(self.prompt_tops) if prompt else None,
            timings=self.timings,
            end_token=self.end_token,
            end_logprob=self.end_logprob,
            end_top_logprobs=self.end_tops,
            token_offsets=list(self.offsets),
            constraint_complete=None if self.matcher is None else self.matcher.complete,
        )

    def _finished(self, piece: str, token: int | None) -> StreamEvent:
        return StreamEvent(self.index, piece, token, self.completion(), timings=self._timings_now())

    def _timings_now(self) -> Timings | None:
        """A copy of the timings as they are, for a sequence that asked (``report_timings``)."""
        return replace(self.timings) if self.report_timings else None
