"""The engine's stepping logic: admission, prefix reuse, chunked prefill, decode, cancel.

Only the engine's thread calls a :class:`Scheduler`. One :meth:`~Scheduler.step`:

1. finishes the sequences whose requests were cancelled (their slots are free at once);
2. admits waiting sequences (FIFO) into free slots — the free slot whose cache shares the longest
   prefix with the prompt, whose tokens are then not computed again (see
   :mod:`~onnxsample.engine._placement`, which also moves running sequences down where steps
   bind a fixed number of rows);
3. prefills: up to ``chunk`` prompt tokens per step over the admitted sequences, one call per
   sequence and chunk, so a long prompt is admitted over several steps while running streams keep
   decoding between them (``chunk=None`` prefills each prompt in one call);
4. decodes: one call feeds every decoding sequence its last token and samples its next one.

A failure inside a call (an allocation, ONNX Runtime) fails the requests in that call and nothing
else.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from onnxsample.engine._drafter import NgramDrafter, draft_for
from onnxsample.engine._layout import Call, KVLayout
from onnxsample.engine._placement import Placement
from onnxsample.engine._post_sampling import post_sampling
from onnxsample.engine._runner import Runner
from onnxsample.engine._sequence import Sequence
from onnxsample.engine._slots import SlotState
from onnxsample.engine._stats import Stats
from onnxsample.errors import GenerationError, InvalidParameter, OnnxSampleError, first_line

log = logging.getLogger(__name__)

# Host outputs of a slot's first token, and of the tokens at its draft positions.
_FIRST = (
    "sampler.next_token",
    "sampler.logprob",
    "sampler.top_logprob_ids",
    "sampler.top_logprobs",
)
_DRAFTED = tuple(name.replace("sampler.", "sampler.draft_") for name in _FIRST)
# Positions reserved beyond the prompt for a request without its own token limit (it grows later).
_AHEAD = 256


_PATIENCE = 4  # steps a prompt may wait behind shorter ones before its next chunk goes first


def _prefill_order(seq: Sequence) -> tuple[int, int]:
    """Prompts passed over `_PATIENCE` steps in a row first, the longest waiting first; then the
    others, the fewest tokens left first."""
    if seq.passed_over >= _PATIENCE:
        return (0, -seq.passed_over)
    return (1, len(seq.prompt) - seq.computed)


class Scheduler:
    """Sequences waiting, prefilling and decoding on one session.

    `slots` is how many sequences may run at once (the graph's slots, or 1 for a concat graph
    without positions); `on_change(pending, free)` hears of every change in the number of waiting
    requests and free slots (for the engine's queue bound).
    """

    def __init__(
        self,
        runner: Runner,
        layout: KVLayout,
        state: SlotState,
        *,
        slots: int,
        chunk: int | None,
        prefix_reuse: bool,
        drafter: NgramDrafter | None = None,
        on_change: Callable[[int, int], None] = lambda pending, free: None,
    ) -> None:
        self.runner, self.layout, self.state = runner, layout, state
        self.drafter = drafter
        self.chunk, self.on_change = chunk, on_change
        self.slots = Placement(slots, layout, state, prefix_reuse=prefix_reuse)
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []
        self.decoding: list[Sequence] = []
        self.stats = Stats()

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def step(self) -> None:
        self._cancel()
        self._admit()
        self.stats.moved += self.slots.compact([*self.prefilling, *self.decoding])
        self._prefill()
        self._decode()

    def idle(self) -> float | None:
        """Nothing runs: let the KV layout give memory back; seconds until it may again."""
        idle = getattr(self.layout, "idle", None)
        return idle() if idle is not None else None

    def release(self) -> None:
        """Drop the session's runner, the cache and the slot state (the engine is closing)."""
        self.runner = self.layout = self.state = None  # type: ignore[assignment]

    def fail_all(self, error: BaseException) -> None:
        """Fail every sequence the scheduler holds (the engine closes, or a bug)."""
        for seq in [*self.waiting, *self.prefilling, *self.decoding]:
            self._fail(seq, error)
        self.on_change(-len(self.waiting), 0)
        self.waiting.clear()

    # ---- admission ----------------------------------------------------------------------------

    def _admit(self) -> None:
        while self.waiting and self.slots.free:
            seq = self.waiting[0]
            slot, reused = self.slots.pick(seq)
            need = len(seq.prompt) + (_AHEAD if seq.open_ended else seq.max_new_tokens)
            try:
                self.layout.reserve(slot, min(need, seq.limit) if seq.limit else need)
            except OnnxSampleError as exc:
                log.warning("request %s: %s", seq.request.id, exc)
                self.waiting.popleft()
                self.stats.failed += 1
                seq.request._fail(exc)
                self.on_change(-1, 0)
                continue
            self.waiting.popleft()
            self.on_change(-1, -1)
            self.slots.take(seq, slot)
            try:
                self.layout.start(seq, reused)
                self.state.assign(slot, seq.early_params or seq.params, seq.prompt)
            except Exception as exc:  # a bug: this request fails, the others go on
                log.exception("request %s could not start", seq.request.id)
                self._fail(seq, GenerationError(f"internal error: {exc}"))
                continue
            seq.admitted = time.perf_counter()
            seq.timings.queue_s = seq.admitted - seq.request.submitted
            seq.timings.cached_tokens = seq.computed
            self.stats.cached_tokens += seq.computed
            self.prefilling.append(seq)
            if seq.report_progress:
                seq.request._push(seq.progress())

    # ---- prefill and decode -------------------------------------------------------------------

    def _prefill(self) -> None:
        """This step's prompt chunks, up to `chunk` tokens: the prompt with the fewest tokens left
        first, so a short request is not held behind a long prompt's every chunk; a prompt passed
        over `_PATIENCE` steps in a row goes before them (the one waiting longest first), so a
        stream of short ones cannot starve a long one. Each prompt's chunks are the same whatever
        runs beside it, so its tokens are too."""
        waiting = list(self.prefilling)
        order = sorted(waiting, key=_prefill_order)
        ran = self._prefill_chunks(order)
        for seq in waiting:
            seq.passed_over = 0 if seq in ran else seq.passed_over + 1

    def _prefill_chunks(self, order: list[Sequence]) -> list[Sequence]:
        """Prompt chunks of `order`'s sequences in turn, up to `chunk` tokens; those that ran."""
        spent, ran = 0, []
        for seq in order:
            while not seq.prefilled and seq.finish is None:
                n = self._chunk_of(seq)
                if self.chunk and spent and spent + n > self.chunk:
                    return ran
                spent += n
                ran.append(seq)
                self._run(self.layout.prefill(seq, seq.computed + n))
                if self.chunk and spent >= self.chunk:
                    return ran
        return ran

    def _chunk_of(self, seq: Sequence) -> int:
        """Tokens the next prefill call of `seq` computes: up to `chunk`, never leaving exactly one
        (a one-token call would take other kernels than the same tokens prefilled alone)."""
        remaining = len(seq.prompt) - seq.computed
        if not self.chunk or remaining <= self.chunk:
            return remaining
        n = self.chunk
        return n - 1 if remaining - n == 1 and n > 1 else n

    def _decode(self) -> None:
        for seq in [s for s in self.decoding if s.open_ended]:
            # Room for the next token, grown (doubling) as an open-ended sequence goes.
            try:
                self.layout.reserve(seq.slot, len(seq.prompt) + len(seq.ids) + 1)
            except OnnxSampleError as exc:
                self._fail(seq, exc)
        drafts = self._drafts()
        drafting = [s for s in self.decoding if s.slot in drafts]
        if drafting:
            # Every drafting sequence is verified in one call (shorter drafts padded): on exact
            # attention several rows' drafts; on GroupQueryAttention the one sequence decoding
            # alone (see _drafts). The others decode together in one call.
            self._run(self.layout.decode(drafting, {s.slot: drafts[s.slot] for s in drafting}))
        plain = [s for s in self.decoding if s.slot not in drafts]
        if plain:
            self._run(self.layout.decode(plain))

    def _drafts(self) -> dict[int, list[int]]:
        """Each decoding sequence's draft (speculative decoding), where it has one: none while
        ``min_tokens`` holds end-of-sequence back, none past its token limit. With other
        sequences decoding, only exact attention drafts (all drafts in one call, each sequence
        backing off while its drafts fail, see :class:`~onnxsample.engine._drafter.NgramDrafter`):
        GroupQueryAttention takes several new positions of one row per call only, and a call of
        its own per drafting row cost serving 23-27% of its tokens/s at 4-16 chat clients
        (``benchmarks/serve.py``, 2026-11-25), so there a sequence drafts only while alone.
        A constrained sequence drafts the tokens its grammar forces, else its n-gram draft cut at
        the first token the grammar rejects; each position is verified under its own mask (a
        graph without per-position masks: it does not draft)."""
        found: dict[int, list[int]] = {}
        if self.drafter is None:
            return found
        self.drafter.batched = len(self.decoding) > 1
        if self.drafter.batched and not self.state.meta.exact_positions:
            return found
        masks = self.runner.allowed is not None and self.runner.allowed.draft_width > 0
        for seq in self.decoding:
            if seq.early_params is not None or (seq.matcher is not None and not masks):
                continue
            if seq.params.host_sampler is not None:
                continue  # the host chooses each token itself
            draft = draft_for(self.drafter, seq)
            if draft and seq.open_ended:  # fed + drafts, and one position free after them
                try:
                    self.layout.reserve(seq.slot, len(seq.prompt) + len(seq.ids) + len(draft) + 1)
                except OnnxSampleError:
                    continue  # no room for the draft: decode plainly
            if draft:
                found[seq.slot] = draft
        return found

    def _run(self, call: Call) -> None:
        uniform = np.full(self.state.meta.max_slots, 0.5, np.float32)
        draft_uniform = None
        if call.drafts:
            draft_uniform = np.full((len(uniform), self.runner.draft_width), 0.5, np.float32)
        for seq in call.sampling:
            if seq.slot in call.drafts:
                u = seq.uniforms(1 + len(call.drafts[seq.slot]))
                uniform[seq.slot], draft_uniform[seq.slot, : len(u) - 1] = u[0], u[1:]
            else:
                uniform[seq.slot] = seq.uniform()
        involved = call.sampling if call.kind == "decode" else [call.prompt_seq]
        start = time.perf_counter()
        try:
            host, presents = self.runner.run(call, uniform, draft_uniform)
            if call.drafts:
                call.accepted = {s: int(host["sampler.accepted"][s]) for s in call.drafts}
            self.layout.commit(call, presents)
        except Exception as exc:
            self.runner.invalidate()
            reason = first_line(exc)
            error = (
                exc
                if isinstance(exc, OnnxSampleError)
                else GenerationError(f"the {call.kind} call failed: {reason}")
            )
            log.error("%s call failed for %d request(s): %s", call.kind, len(involved), reason)
            for seq in involved:
                self._fail(seq, error)
            return
        elapsed = time.perf_counter() - start
        self.stats.fallback_tokens = self.runner.redrawn
        if call.kind == "decode":
            self.stats.decode_s += elapsed
            self.stats.decode_steps += 1
            for seq in involved:
                seq.timings.decode_s += elapsed
        else:
            seq = call.prompt_seq
            self.stats.prefill_s += elapsed
            self.stats.prefill_calls += 1
            self.stats.prompt_tokens += call.end - seq.computed
            seq.timings.prefill_s += elapsed
            if call.prompt_rows.size:
                seq.record_prompt(
                    host["sampler.prompt_logprob"],
                    host.get("sampler.prompt_top_logprob_ids"),
                    host.get("sampler.prompt_top_logprobs"),
                )
            seq.computed = call.end
            if seq.report_progress:
                seq.request._push(seq.progress())
            if seq.prefilled:
                self.prefilling.remove(seq)
                self.decoding.append(seq)
        for seq in call.sampling:
            if seq.params.host_sampler is not None and not self._host_choice(seq, host):
                continue
            self._accept(seq, host, call)

    def _host_choice(self, seq: Sequence, host: dict) -> bool:
        """Let the sequence's host sampler choose its token from its candidates (written into
        `host` in place of the graph's); False when it failed (the request fails alone)."""
        s = seq.slot
        try:
            token = seq.host_choice(
                host["sampler.candidate_ids"][s].copy(), host["sampler.candidate_logits"][s].copy()
            )
        except GenerationError as exc:
            log.warning("request %s: %s", seq.request.id, exc)
            self._fail(seq, exc)
            return False
        taken = int(host["sampler.next_token"][s])
        self.state.retake([(s, taken, int(token))])
        host["sampler.next_token"][s] = int(token)
        return True

    def _accept(self, seq: Sequence, host: dict, call: Call) -> None:
        """Hand `seq` the tokens the call emitted for it: one, or with a draft the verified
        drafts and the token after them, each its own event, until the sequence finishes."""
        s = seq.slot
        drafted = len(call.drafts.get(s, ()))
        accepted = call.accepted.get(s, 0)
        if drafted:
            self.drafter.record(seq.draft, drafted, accepted)
            seq.keep_uniforms(accepted + 1)
        events = []
        for i in range(accepted + 1):
            names = _FIRST if i == 0 else _DRAFTED
            at = (s,) if i == 0 else (s, i - 1)
            token, logprob, tops = int(host[names[0]][at]), host[names[1]][at], None
            if (failure := seq.constraint_failure(token)) is not None:
                for event in events:  # what the grammar took, then the failure
                    seq.request._push(event)
                self._fail(seq, failure)
                return
            if seq.params.post_sampling_probs is not None:  # drafting: greedy (reads no candidates)
                try:
                    logprob, tops = post_sampling(seq.params, s, host, token, self.state.meta)
                except InvalidParameter as exc:
                    self._fail(seq, exc)
                    return
            elif seq.params.top_logprobs:
                ids, lps = host[names[2]][at], host[names[3]][at]
                tops = [(int(t), float(v)) for t, v in zip(ids, lps, strict=True)]
            events.append(seq.accept(token, logprob, tops))
            self.stats.generated_tokens += 1
            if seq.finish is not None:
                break
        if drafted:  # kept drafts the request did not take (it finished first) are not counted
            kept = min(accepted, len(events) - 1)
            self.stats.drafted_tokens += drafted
            self.stats.accepted_tokens += kept
            seq.timings.draft_tokens += drafted
            seq.timings.accepted_tokens += kept
        if seq.finish is not None:  # the slot is free before the request hears it has finished
            self.stats.finished += 1
            self._release(seq)
        elif seq.early_params is not None and len(seq.ids) >= seq.params.min_tokens:
            self.state.update(s, seq.params)  # min_tokens reached: end-of-sequence allowed again
            seq.early_params = None
        for event in events:
            seq.request._push(event)

    # ---- leaving ------------------------------------------------------------------------------

    def _cancel(self) -> None:
        for seq in [s for s in self.waiting if s.request.cancelled]:
            self.waiting.remove(seq)
            self.on_change(-1, 0)
            seq.request._push(seq.cancel())
        for seq in [s for s in (*self.prefilling, *self.decoding) if s.request.cancelled]:
            event = seq.cancel()
            self._release(seq)
            seq.request._push(event)

    def _release(self, seq: Sequence) -> None:
        for group in (self.prefilling, self.decoding):
            if seq in group:
                group.remove(seq)
        self.layout.finish(seq)
        self._free(seq.slot)

    def _fail(self, seq: Sequence, error: BaseException) -> None:
        self.stats.failed += 1
        seq.finish = "error"
        seq.request._fail(error)
        if seq.slot < 0 or seq.slot in self.slots.free:
            return
        for group in (self.prefilling, self.decoding):
            if seq in group:
                group.remove(seq)
        self.layout.discard(seq.slot)
        self._free(seq.slot)

    def _free(self, slot: int) -> None:
        self.slots.give(slot)
        self.on_change(0, 1)
