"""The sampler chain's per-slot inputs and state, as the engine keeps them between steps.

:class:`SlotState` owns, for every slot of a composed graph: its :class:`SamplingParams` (packed
into the ``sampler.*`` parameter inputs and kept as device OrtValues until a slot changes), its
prompt mask, and the penalty counts (``sampler.output_counts``), which live on the device: in one
buffer that the graph reads and then adds the step's tokens to, where the composer found that safe
(``counts_in_place``), else in two that swap roles every call (the graph reads one and writes the
other, a copy of all S rows a step).

Every device buffer is allocated once and written in place afterwards, so its address never
changes: a bound IOBinding stays valid, and a captured CUDA graph reads the values of the step
it replays.

A static chain declares its slot dimension symbolic (``slots``): its rows are independent, so a
call binds only the first :meth:`SlotState.rows` rows of every per-slot input, state and output
(the occupied slots rounded up to a bucket: 1, 2, 4, 8… up to S), at the buffers' own addresses,
and its cost follows the running requests rather than the slots composed.

A branching chain may read ``sampler.logprobs``: how many logprobs each slot's request asks for
(−1 none), so that a step in which no request asks computes none (:func:`asked_logprobs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxsample.chain import GREEDY_BELOW, TEMPERATURE_LAST
from onnxsample.engine._row_copy import NUMPY_TYPES, RowCopy, runs
from onnxsample.errors import InvalidParameter
from onnxsample.metadata import TEMPERATURE_LAST_SINCE, ComposedMetadata
from onnxsample.params import SamplingParams, pack_sampling_params

COUNTS, COUNTS_OUT = "sampler.output_counts", "sampler.output_counts_out"
PROMPT_MASK = "sampler.prompt_mask"
ROW_INDEX = "sampler.row_index"
LOGPROBS = "sampler.logprobs"


def asked_logprobs(slots: list[SamplingParams | None]) -> np.ndarray:
    """INT64[S] ``sampler.logprobs``: −1 for a free slot or a request without logprobs, else the
    number of top logprobs it asks for (0: the chosen token's only)."""
    asked = [
        -1 if p is None or not (p.logprobs or p.top_logprobs) else p.top_logprobs for p in slots
    ]
    return np.array(asked, np.int64)


def host_copy(value) -> np.ndarray:
    """An OrtValue's contents as a numpy array of its own. ``OrtValue.numpy()`` of a CPU tensor is
    a view of the tensor's memory that does not keep the tensor alive: keep only copies."""
    return np.array(value.numpy(), copy=True)


def ortvalue(array: np.ndarray, device: str):
    """`array` as an OrtValue on `device` ("cpu" or "cuda")."""
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device, 0)


def bucket(rows: int, limit: int) -> int:
    """`rows` rounded up to a power of two, at most `limit` (one captured graph per bucket)."""
    return min(limit, 1 << max(0, rows - 1).bit_length())


def slots_symbolic(session) -> bool:
    """Whether `session`'s slot dimension is symbolic (a static chain: bind only the rows run)."""
    rows = [i for i in session.get_inputs() if i.name == ROW_INDEX]
    return bool(rows) and not isinstance(rows[0].shape[0], int)


def bind_rows(binding, name: str, value, rows: int, *, output: bool = False) -> None:
    """Bind the first `rows` rows of OrtValue `value` as input (or `output`) `name`, at the
    value's own address."""
    shape = value.shape()
    if rows == shape[0]:
        bind = binding.bind_ortvalue_output if output else binding.bind_ortvalue_input
        bind(name, value)
        return
    args = (name, value.device_name(), 0, NUMPY_TYPES[value.element_type()], [rows, *shape[1:]])
    bind = binding.bind_output if output else binding.bind_input
    bind(*args, value.data_ptr())


def check_params(meta: ComposedMetadata, params: SamplingParams) -> None:
    """Raise :class:`~onnxsample.errors.InvalidParameter` unless the graph can serve `params`
    (ranges, samplers in the chain, table sizes); safe from any thread."""
    pack_slots(meta, [params])
    if params.temperature_moves and not serves_temperature_last(meta):
        raise InvalidParameter(
            f"temperature_last needs a model composed by onnxsample revision "
            f"{TEMPERATURE_LAST_SINCE} or later (this one: {meta.composer_revision or 'unknown'}): "
            "compose it again"
        )
    if params.constraint is not None and not meta.allowed_tokens:
        raise InvalidParameter(
            "structured output (a constraint) needs a model composed with the allowed-tokens "
            "mask (onnxsample compose --allowed-tokens)"
        )
    if params.constraint is not None and params.min_tokens:
        raise InvalidParameter(
            "min_tokens cannot be combined with an output constraint: the grammar decides where "
            "the answer may end"
        )
    if params.host_sampler is not None and not meta.output_candidates:
        raise InvalidParameter(
            "a host sampler needs a model composed with candidates "
            "(onnxsample compose --candidates K)"
        )
    k, post = meta.output_candidates, params.post_sampling_probs
    drawing = post is not None and params.temperature >= GREEDY_BELOW
    if drawing and not meta.final_probs and (not k or post > k):
        static = (
            " (this one's sampler.probs is a static chain's, which the host draws again past its "
            "candidates: compose it without --static)"
            if meta.output_probs
            else ""
        )
        raise InvalidParameter(
            f"post_sampling_probs={post} needs a model composed with the final distribution of "
            f"a branching chain{static} (onnxsample compose --output-probs, or serve "
            f"--output-probs) or at least {max(post, 1)} candidates (this one: {k}; onnxsample "
            "compose --candidates K, or serve --candidates K): it is read from them"
        )
    uncut = (
        params.constraint is None
        and (params.top_k == 0 or params.top_k >= k)
        and params.top_p >= 1.0
        and params.min_p <= 0.0
        and params.typical_p >= 1.0
    )
    if drawing and not meta.final_probs and k < meta.vocab_size and uncut:
        raise InvalidParameter(  # each step would keep every token, past the candidates
            f"post_sampling_probs: with no filter the distribution keeps every token, past the "
            f"model's {k} candidates it is read from; set a filter (top_k below {k}, top_p, "
            "min_p or typical_p), or serve the model with the whole distribution "
            "(serve --output-probs)"
        )
    if params.prompt_logprobs is not None and not meta.prompt_logprobs:
        raise InvalidParameter(
            "prompt_logprobs needs a model composed with prompt logprobs "
            "(onnxsample compose --prompt-logprobs)"
        )


def serves_temperature_last(meta: ComposedMetadata) -> bool:
    """Whether the model serves ``temperature_last``: its branching chain (the graph's own, or
    the fallback a static chain carries) reads ``sampler.temperature_last``."""
    revision = meta.composer_revision
    return revision.isdigit() and int(revision) >= TEMPERATURE_LAST_SINCE


def pack_slots(meta: ComposedMetadata, slots: list[SamplingParams | None]) -> dict:
    """The ``sampler.*`` parameter arrays of a graph described by `meta`, the same names every
    call (they are bound once): ``sampler.temperature_last`` too where the chain reorders."""
    arrays = pack_sampling_params(
        slots,
        meta.chain,
        meta.max_slots,
        max_bias=meta.max_bias,
        vocab_size=meta.vocab_size,
        top_logprobs=meta.top_logprobs,
    )
    if meta.chain.reorders_temperature:
        arrays.setdefault(TEMPERATURE_LAST, np.zeros(meta.max_slots, dtype=np.bool_))
    return arrays


class SlotState:
    """Parameters, prompt masks and penalty counts of the S slots of one session.

    ``parity`` says which of the two count buffers the next call reads (0 or 1).
    """

    def __init__(
        self,
        meta: ComposedMetadata,
        inputs: set[str],
        device: str,
        *,
        bucketed: bool = False,
        buckets: bool = True,
    ) -> None:
        self.meta = meta
        self.buckets = buckets  # False: a fixed-shape call runs all S rows (rows())
        self.device = device
        self.inputs = inputs
        self.bucketed = bucketed  # the sampler binds sampler_rows() rows only (module docs)
        self.params: list[SamplingParams | None] = [None] * meta.max_slots
        self._static: dict[str, Any] | None = None
        self._stale = True
        S, V = meta.max_slots, meta.vocab_size
        self.penalties = COUNTS in inputs
        self.in_place = self.penalties and meta.counts_in_place
        self._mask = np.zeros((S, V), bool) if self.penalties else None
        self.counts = ortvalue(np.zeros((S, V), np.int32), device) if self.penalties else None
        self._spare = None
        if self.penalties and not self.in_place:
            self._spare = ortvalue(np.zeros((S, V), np.int32), device)
        self.parity = 0
        self.rows_copy = RowCopy(device)  # row copies on the device, shared by the engine's buffers
        self._mask_rows: set[int] = set()  # prompt-mask rows changed since last written

    def assign(self, slot: int, params: SamplingParams, prompt: list[int]) -> None:
        """A new sequence takes `slot`: its parameters, its prompt's tokens, zero output counts."""
        self.params[slot] = params
        self._stale = True
        if self.penalties:
            self._mask[slot] = False
            self._mask[slot, prompt] = True
            self._mask_rows.add(slot)
            self.rows_copy.from_host(
                self.counts, slot, np.zeros((1, self.meta.vocab_size), np.int32)
            )

    def update(self, slot: int, params: SamplingParams) -> None:
        """New parameters for the sequence in `slot`; its prompt mask and counts stay."""
        self.params[slot] = params
        self._stale = True

    def copy(self, src: int, dst: int) -> None:
        """Copy slot `src`'s penalty counts into the free slot `dst` (on the device)."""
        if self.penalties:
            self.rows_copy(self.counts, src, dst)

    def move(self, src: int, dst: int) -> None:
        """The sequence in slot `src` continues in `dst`, where :meth:`copy` put its counts: its
        parameters and prompt mask go with it."""
        self.params[dst], self.params[src] = self.params[src], None
        self._stale = True
        if self.penalties:
            self._mask[dst] = self._mask[src]
            self._mask_rows.add(dst)

    def release(self, slot: int) -> None:
        """The slot's sequence left; its inputs stay as they are until the slot is assigned again
        (an inactive slot's row is never computed)."""
        self.params[slot] = None

    def rows(self, also: int = -1) -> int:
        """The rows a fixed-shape decode call runs the model over: every slot up to the highest
        occupied one (and `also`), rounded up to a bucket (1, 2, 4, 8… up to S); all S without
        buckets."""
        if not self.buckets:
            return self.meta.max_slots
        top = max([also, *(s for s, p in enumerate(self.params) if p is not None)])
        return bucket(top + 1, self.meta.max_slots)

    def sampler_rows(self) -> int:
        """The slots a call binds for the sampler: :meth:`rows`, or all S where the graph's
        slot dimension is fixed. Rows past them hold no occupied slot's state."""
        return self.rows() if self.bucketed else self.meta.max_slots

    def bind_static(self, binding, rows: int) -> None:
        """Bind the first `rows` rows of the parameter inputs and the prompt mask."""
        for name, value in self.static().items():
            bind_rows(binding, name, value, rows)

    def static(self) -> dict[str, Any]:
        """The parameter inputs (and the prompt mask) as device OrtValues: allocated once, then
        rewritten in place after a slot changed (the same objects, at the same addresses; of the
        prompt mask, only the rows of the slots assigned or moved into)."""
        if self._stale:
            arrays = pack_slots(self.meta, self.params)
            if self.penalties:
                arrays[PROMPT_MASK] = self._mask
            arrays[LOGPROBS] = asked_logprobs(self.params)
            arrays = {k: v for k, v in arrays.items() if k in self.inputs}
            if self._static is None:
                self._static = {k: ortvalue(v, self.device) for k, v in arrays.items()}
            else:
                for name, value in arrays.items():
                    if name != PROMPT_MASK:  # [S] vectors, rewritten whole
                        self._static[name].update_inplace(np.ascontiguousarray(value))
                    else:  # [S, V]: the rows that changed, a run of slots in one copy
                        for lo, hi in runs(self._mask_rows):
                            self.rows_copy.from_host(self._static[name], lo, value[lo:hi])
            self._mask_rows.clear()
            self._stale = False
        return self._static

    def host_inputs(self, counted: dict[int, int]) -> dict[str, np.ndarray]:
        """Host copies of what the last call read: the parameter inputs, the prompt mask and,
        after :meth:`advance`, the counts (the host's fallback runs the chain on them again).
        `counted`: slot -> the token the call counted for it; the counts of those slots are the
        ones the call read (in place, the call's own token is taken off again). Only their rows
        come back from the device, a run of consecutive slots in one copy; the others read 0."""
        arrays = pack_slots(self.meta, self.params)
        if self.penalties:
            arrays[PROMPT_MASK] = self._mask
            read = self.counts if self.in_place else self._spare
            counts = np.zeros(read.shape(), np.int32)  # [S, V]: only `counted`'s rows are read
            for lo, hi in runs(counted):
                counts[lo:hi] = self.rows_copy.to_host(read, lo, hi)
            if self.in_place:
                for slot, token in counted.items():
                    counts[slot, token] -= 1
            arrays[COUNTS] = counts
        return arrays

    def bind_counts(self, binding, rows: int | None = None) -> None:
        """Bind the counts the graph reads and the buffer it writes (swapped by :meth:`advance`),
        their first `rows` rows (all by default)."""
        if not self.penalties:
            return
        rows = self.meta.max_slots if rows is None else rows
        bind_rows(binding, COUNTS, self.counts, rows)
        written = self.counts if self.in_place else self._spare
        bind_rows(binding, COUNTS_OUT, written, rows, output=True)

    def retake(self, moves: list[tuple[int, int, int]]) -> None:
        """Each (slot, taken, instead): the slot's last token is `instead`, not the `taken` the
        graph counted (a host sampler or the host's fallback chose): move its count."""
        moves = [m for m in moves if m[1] != m[2]]
        if not self.penalties or not moves:
            return
        for lo, hi in runs(m[0] for m in moves):  # the moved slots' rows, both ways
            counts = self.rows_copy.to_host(self.counts, lo, hi)
            for slot, taken, instead in moves:
                if lo <= slot < hi:
                    counts[slot - lo, taken] -= 1
                    counts[slot - lo, instead] += 1
            self.rows_copy.from_host(self.counts, lo, counts)

    def advance(self) -> None:
        """After a successful call: the written counts become the state."""
        if self.penalties and not self.in_place:
            self.counts, self._spare = self._spare, self.counts
            self.parity ^= 1
