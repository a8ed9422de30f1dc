"""`Generator`: text out of a composed model, sampled inside the graph.

One ONNX Runtime session runs model + sampler chain. Each sequence owns one of the graph's slots, with
its own :class:`SamplingParams` (packed into the ``sampler.*`` parameter inputs) and its own seeded
``numpy.random.Generator(Philox(seed))`` for ``sampler.uniform``, so the same seed and prompt give the
same tokens whatever else is in the batch. Sequences wait for a free slot, are prefilled together
(left-padded), join the running batch, and leave it when they finish (continuous batching).

Per step the host sends token ids, the attention mask, positions, row indices and one uniform per
slot, and gets back token ids (and logprobs). The KV cache (``present.*``) and the penalty state
(``sampler.output_counts_out``) stay bound to device OrtValues and are fed back as the next step's
inputs. Two cache layouts (composed metadata ``kv_layout``): ``concat`` (optimum: explicit positions,
left padding, the cache grows by concatenation; :mod:`onnxsample._batch`) and ``gqa``
(GroupQueryAttention: one preallocated buffer per layer, right padding, written in place;
:mod:`onnxsample._kv`).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnxsample._batch import KVBatch, _ortvalue
from onnxsample._kv import (
    _ORT_DTYPES,
    COUNTS,
    COUNTS_OUT,
    HOST_OUTPUTS,
    DecodeBinding,
    SharedKV,
    SlotBatch,
    bind_step,
    buffer_length,
    contiguous_runs,
    kv_specs,
)
from onnxsample._session import create_session
from onnxsample._text import Detokenizer, StopMatcher
from onnxsample.errors import InvalidParameter, ModelError
from onnxsample.metadata import ComposedMetadata
from onnxsample.params import SamplingParams, pack_sampling_params

__all__ = ["Completion", "Generator", "StreamEvent", "Timings"]

log = logging.getLogger(__name__)

_PAST = "past_key_values."
_PROMPT = "sampler.prompt_mask"
_U_MAX = np.nextafter(np.float32(1), np.float32(0))


@dataclass
class Timings:
    """Prefill and decode timings, llama.cpp style: time to first token and tokens per second."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    sequences: int = 1
    ttft_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        decoded = max(self.generated_tokens - self.sequences, 0)  # first tokens come from prefill
        return decoded / self.decode_s if self.decode_s else 0.0

    def to_json(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "sequences": self.sequences,
            "ttft_ms": round(self.ttft_s * 1000, 2),
            "prefill_ms": round(self.prefill_s * 1000, 2),
            "decode_ms": round(self.decode_s * 1000, 2),
            "prompt_tokens_per_s": round(self.prompt_tps, 2),
            "decode_tokens_per_s": round(self.decode_tps, 2),
        }


@dataclass
class Completion:
    """One prompt's result."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (stop string), "eos", or "length"
    prompt_token_ids: list[int]
    seed: int
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    timings: Timings = field(default_factory=Timings)

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
        return data


@dataclass
class StreamEvent:
    """A piece of one prompt's text; `completion` is set on the event that finishes it."""

    index: int
    text: str
    token_id: int | None
    completion: Completion | None = None


@dataclass
class _Sequence:
    index: int
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    detok: Detokenizer
    stops: StopMatcher
    rng: np.random.Generator
    seed: int
    submitted: float
    slot: int = -1
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: str | None = None
    timings: Timings = field(default_factory=Timings)


class Generator:
    """Runs a composed model (see :func:`onnxsample.compose`) with IOBinding and per-sequence slots.

    `model` is a composed ``.onnx`` file; the tokenizer, generation config and export manifest are
    read from `tokenizer` (default: the model's folder). `provider` is ``auto``, ``cpu`` or ``cuda``;
    `threads` sets ONNX Runtime's intra-op threads (default: its own choice). `max_len` bounds the KV
    buffer of GroupQueryAttention models in positions, prompt included (default: the context).
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
    ) -> None:
        from transformers import AutoTokenizer

        if max_len is not None and (
            not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 2
        ):
            raise InvalidParameter(f"max_len must be an integer >= 2, got {max_len!r}")
        self.max_len = max_len
        self.path = Path(model)
        if not self.path.is_file():
            raise ModelError(f"no such composed model: {self.path}")
        self.threads = threads
        self.session, self.device = create_session(
            self.path, provider, threads=threads, optimization=optimization
        )
        # The metadata from the session: no second read of a file that holds all the weights.
        meta = ComposedMetadata.from_session(self.session)
        if meta is None:
            raise ModelError(
                f"{self.path.name} is not a composed model: run `onnxsample compose` on it first"
            )
        self.meta = meta
        self.chain = meta.chain
        self.max_slots = meta.max_slots
        self.vocab_size = meta.vocab_size
        self.top_logprobs = meta.top_logprobs
        self.max_bias = meta.max_bias
        self._head_size = meta.kv_head_size
        folder = Path(tokenizer) if tokenizer is not None else self.path.parent
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except Exception as exc:
            raise ModelError(
                f"no tokenizer in {folder}: pass tokenizer= the export folder ({exc})"
            ) from exc
        self.eos_ids, self.context_length = _stop_ids_and_context(folder, self.tokenizer)
        inputs = {i.name: i for i in self.session.get_inputs()}
        self._inputs = set(inputs)
        self._pasts = {name: i for name, i in inputs.items() if name.startswith(_PAST)}
        self._outputs = [o.name for o in self.session.get_outputs()]
        self.kv_layout = meta.kv_layout
        self._limit = self.context_length
        if self.kv_layout == "gqa":
            self.concurrency = self.max_slots
            self._kv = SharedKV(kv_specs(self._pasts, self._head_size, self.path.name), self.device)
            limits = [x for x in (self.context_length, max_len) if x]
            self._limit = min(limits) if limits else None
        else:
            # Left-padded batches need explicit positions (optimum's layout).
            self.concurrency = self.max_slots if "position_ids" in self._inputs else 1
            if self.concurrency == 1 and self.max_slots > 1:
                log.info(
                    "%s has no position_ids input: sequences run one at a time", self.path.name
                )
            if max_len is not None:
                log.info("max_len applies to GroupQueryAttention models only: ignored")
        self._pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.last_timings = Timings()
        # GQA decode steps reuse one IOBinding: only ids, mask and the per-step sampler inputs change.
        self._fast = (
            DecodeBinding.for_session(self.session, self.device)
            if self.kv_layout == "gqa"
            else None
        )

    # ---- public API ---------------------------------------------------------------------------

    def generate(
        self,
        prompts: str | Sequence[str],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        chat: bool | None = None,
        system: str | None = None,
    ) -> list[Completion]:
        """Generate for every prompt (one batch; prompts beyond `max_slots` wait for a free slot)."""
        done: dict[int, Completion] = {}
        for event in self.stream(
            prompts, params, max_new_tokens=max_new_tokens, stop=stop, chat=chat, system=system
        ):
            if event.completion is not None:
                done[event.index] = event.completion
        return [done[i] for i in sorted(done)]

    def stream(
        self,
        prompts: str | Sequence[str],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        chat: bool | None = None,
        system: str | None = None,
    ) -> Iterator[StreamEvent]:
        """Yield text pieces as they are decoded (never half a UTF-8 character), prompt by index."""
        sequences = self._prepare(prompts, params, max_new_tokens, stop, chat, system)
        run = Timings(prompt_tokens=sum(len(s.prompt) for s in sequences), sequences=len(sequences))
        began = time.perf_counter()
        waiting, batch = deque(sequences), self._new_batch(sequences)
        free = list(range(min(self.concurrency, len(sequences))))
        self._reset_state()
        shared = isinstance(batch, SlotBatch)
        prefill, decode = (
            (self._prefill_slots, self._decode_slots) if shared else (self._prefill, self._decode)
        )
        while waiting or batch.rows:
            admitted = []
            while waiting and free:
                seq = waiting.popleft()
                seq.slot = free.pop(0)
                admitted.append(seq)
            start = time.perf_counter()
            if admitted:
                events = prefill(admitted, batch)
                elapsed = time.perf_counter() - start
                run.prefill_s += elapsed
                for seq in admitted:
                    seq.timings.prefill_s = elapsed
                    seq.timings.ttft_s = time.perf_counter() - seq.submitted
                run.ttft_s = run.ttft_s or time.perf_counter() - began
            else:
                events = decode(batch)
                elapsed = time.perf_counter() - start
                run.decode_s += elapsed
                for seq in batch.rows:
                    seq.timings.decode_s += elapsed
            yield from events
            keep = [i for i, seq in enumerate(batch.rows) if seq.finish is None]
            for seq in batch.rows:
                if seq.finish is not None:
                    free.append(seq.slot)
            free.sort()
            batch.keep(keep)
        run.generated_tokens = sum(len(s.ids) + (s.finish == "eos") for s in sequences)
        self.last_timings = run

    # ---- preparation ----------------------------------------------------------------------------

    def _prepare(self, prompts, params, max_new_tokens, stop, chat, system) -> list[_Sequence]:
        """Validate everything and tokenise before any work, so bad input costs nothing."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise InvalidParameter("at least one prompt is needed")
        if isinstance(params, SamplingParams) or params is None:
            params = [params or SamplingParams()] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise InvalidParameter(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InvalidParameter(
                f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}"
            )
        for p in params:
            pack_sampling_params(
                [p],
                self.chain,
                self.max_slots,
                max_bias=self.max_bias,
                vocab_size=self.vocab_size,
                top_logprobs=self.top_logprobs,
            )
        use_chat = bool(self.tokenizer.chat_template) if chat is None else chat
        if use_chat and not self.tokenizer.chat_template:
            raise InvalidParameter("chat=True, but this model's tokenizer has no chat template")
        now, sequences = time.perf_counter(), []
        for index, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            ids = self._tokenize(prompt, use_chat, system)
            if not ids:
                raise InvalidParameter(f"prompt {index} is empty after tokenisation")
            if self._limit and len(ids) >= self._limit:
                room = (
                    f"the model's context of {self._limit} tokens"
                    if self._limit == self.context_length
                    else f"max_len={self._limit}"
                )
                raise InvalidParameter(
                    f"prompt {index} is {len(ids)} tokens, which does not fit {room} "
                    f"(it must be at most {self._limit - 1})"
                )
            seed = p.seed if p.seed is not None else int(np.random.SeedSequence().entropy % 2**63)
            sequences.append(
                _Sequence(
                    index,
                    ids,
                    p,
                    max_new_tokens,
                    Detokenizer(self.tokenizer),
                    StopMatcher(list(stop or [])),
                    np.random.Generator(np.random.Philox(seed)),
                    seed,
                    now,
                    timings=Timings(prompt_tokens=len(ids)),
                )
            )
        return sequences

    def _tokenize(self, prompt: str, chat: bool, system: str | None) -> list[int]:
        if chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}
            ]
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
        else:
            if system:
                raise InvalidParameter("a system prompt needs chat mode")
            ids = self.tokenizer(prompt).input_ids
        return [int(i) for i in ids]

    # ---- KV cache -------------------------------------------------------------------------------

    def _new_batch(self, sequences: list[_Sequence]) -> KVBatch | SlotBatch:
        """An empty running batch; for GQA, shared buffers with a row per slot and room for all."""
        if self.kv_layout != "gqa":
            return KVBatch(self.device)
        need = max(len(s.prompt) + s.max_new_tokens for s in sequences)
        self._kv.ensure(min(self.concurrency, len(sequences)), buffer_length(need, self._limit))
        return SlotBatch(self._kv, self._pad, self.max_slots)

    # ---- sampler state ----------------------------------------------------------------------------

    def _reset_state(self) -> None:
        S, V = self.max_slots, self.vocab_size
        self._slot_params: list[SamplingParams | None] = [None] * S
        self._prompt_mask = np.zeros((S, V), bool)
        self._counts = (
            _ortvalue(np.zeros((S, V), np.int32), self.device) if COUNTS in self._inputs else None
        )
        self._static: dict = {}

    def _assign(self, sequences: list[_Sequence]) -> None:
        """Give newly admitted sequences their slots' parameters, prompt mask and fresh counts."""
        for seq in sequences:
            self._slot_params[seq.slot] = seq.params
            self._prompt_mask[seq.slot] = False
            self._prompt_mask[seq.slot, seq.prompt] = True
        arrays = pack_sampling_params(
            self._slot_params,
            self.chain,
            self.max_slots,
            max_bias=self.max_bias,
            vocab_size=self.vocab_size,
            top_logprobs=self.top_logprobs,
        )
        self._static = {
            k: _ortvalue(v, self.device) for k, v in arrays.items() if k in self._inputs
        }
        if self._fast is not None:
            self._fast.invalidate()
        if self._counts is not None:
            counts = self._counts.numpy().copy()
            counts[[s.slot for s in sequences]] = 0
            self._counts = _ortvalue(counts, self.device)
            self._static[_PROMPT] = _ortvalue(self._prompt_mask, self.device)

    def _uniforms(self, sequences) -> np.ndarray:
        u = np.full(self.max_slots, 0.5, np.float32)
        for seq in sequences:
            u[seq.slot] = min(np.float32(seq.rng.random()), _U_MAX)
        return u

    # ---- steps ------------------------------------------------------------------------------------

    def _run(self, input_ids, mask, positions, pasts, row_index, uniform):
        binding = self.session.io_binding()
        bind_step(
            binding, input_ids, mask, positions, row_index, uniform, "position_ids" in self._inputs
        )
        kv_outputs = []
        if callable(pasts):  # GQA: shared buffers bound as past and present alike
            kv_outputs = pasts(binding)
        else:
            for name, value in pasts.items():
                if isinstance(value, np.ndarray):
                    binding.bind_cpu_input(name, value)
                else:
                    binding.bind_ortvalue_input(name, value)
        for name, value in self._static.items():
            binding.bind_ortvalue_input(name, value)
        if self._counts is not None:
            binding.bind_ortvalue_input(COUNTS, self._counts)
        outputs = [name for name in self._outputs if name not in kv_outputs]
        for name in outputs:
            binding.bind_output(name, "cpu" if name in HOST_OUTPUTS else self.device)
        self.session.run_with_iobinding(binding)
        # Outputs come back in the order they were first bound.
        out = dict(zip(kv_outputs + outputs, binding.get_outputs(), strict=True))
        if self._counts is not None:
            self._counts = out[COUNTS_OUT]
        presents = {name: out["present." + name[len(_PAST) :]] for name in self._pasts}
        host = {name: out[name].numpy() for name in HOST_OUTPUTS if name in out}
        return host, presents

    def _prefill(self, sequences: list[_Sequence], batch: KVBatch) -> list[StreamEvent]:
        self._assign(sequences)
        length = max(len(s.prompt) for s in sequences)
        ids = np.full((len(sequences), length), self._pad, np.int64)
        mask = np.zeros((len(sequences), length), np.int64)
        for b, seq in enumerate(sequences):
            ids[b, length - len(seq.prompt) :] = seq.prompt
            mask[b, length - len(seq.prompt) :] = 1
        positions = np.maximum(mask.cumsum(axis=1) - 1, 0)
        pasts = {
            name: np.zeros(
                (len(sequences), i.shape[1], 0, self._head_size or i.shape[3]),
                _ORT_DTYPES.get(i.type, np.float32),
            )
            for name, i in self._pasts.items()
        }
        rows = np.zeros(self.max_slots, np.int64)
        for b, seq in enumerate(sequences):
            rows[seq.slot] = 1 + b * length + length - 1
        host, presents = self._run(ids, mask, positions, pasts, rows, self._uniforms(sequences))
        batch.join(sequences, presents, mask)
        return [self._accept(seq, host) for seq in sequences]

    def _decode(self, batch: KVBatch) -> list[StreamEvent]:
        ids = np.asarray([[seq.ids[-1]] for seq in batch.rows], np.int64)
        positions = batch.positions()[:, None]
        mask = np.concatenate([batch.mask, np.ones((batch.size, 1), np.int64)], axis=1)
        rows = np.zeros(self.max_slots, np.int64)
        for b, seq in enumerate(batch.rows):
            rows[seq.slot] = 1 + b
        host, presents = self._run(
            ids, mask, positions, batch.pasts, rows, self._uniforms(batch.rows)
        )
        batch.advance(presents)
        return [self._accept(seq, host) for seq in batch.rows]

    def _prefill_slots(self, sequences: list[_Sequence], batch: SlotBatch) -> list[StreamEvent]:
        """GQA: one call per run of consecutive slots, written into those rows of the buffers."""
        self._assign(sequences)
        events = []
        for run in contiguous_runs(sequences):
            host, _ = self._run(*batch.prefill(run), self._uniforms(run))
            events += [self._accept(seq, host) for seq in run]
        return events

    def _decode_slots(self, batch: SlotBatch) -> list[StreamEvent]:
        step = batch.decode()
        uniform = self._uniforms(batch.rows)
        if self._fast is None:
            host, _ = self._run(*step, uniform)
        else:
            host, counts = self._fast.run(step, uniform, self._kv, self._static, self._counts)
            self._counts = counts
        batch.advance()
        return [self._accept(seq, host) for seq in batch.rows]

    def _accept(self, seq: _Sequence, host: dict) -> StreamEvent:
        """Record the slot's sampled token; decide whether the sequence is finished."""
        token = int(host["sampler.next_token"][seq.slot])
        seq.timings.generated_tokens += 1
        if token in self.eos_ids:
            seq.finish = "eos"
            return self._finished(seq, seq.stops.add(seq.detok.flush()) + seq.stops.flush(), token)
        seq.ids.append(token)
        if seq.params.logprobs or seq.params.top_logprobs:
            seq.logprobs.append(float(host["sampler.logprob"][seq.slot]))
        if seq.params.top_logprobs:
            n = seq.params.top_logprobs
            ids, lps = (
                host["sampler.top_logprob_ids"][seq.slot][:n],
                host["sampler.top_logprobs"][seq.slot][:n],
            )
            seq.tops.append([(int(t), float(lp)) for t, lp in zip(ids, lps, strict=True)])
        piece = seq.stops.add(seq.detok.add(token))
        if seq.stops.stopped:
            seq.finish = "stop"
        elif len(seq.ids) >= seq.max_new_tokens or (
            self._limit and len(seq.prompt) + len(seq.ids) >= self._limit
        ):
            seq.finish = "length"
            piece += seq.stops.add(seq.detok.flush()) + seq.stops.flush()
        if seq.finish:
            return self._finished(seq, piece, token)
        return StreamEvent(seq.index, piece, token)

    def _finished(self, seq: _Sequence, piece: str, token: int) -> StreamEvent:
        want_logprobs = seq.params.logprobs or seq.params.top_logprobs
        completion = Completion(
            index=seq.index,
            text=seq.stops.text,
            token_ids=list(seq.ids),
            finish_reason=seq.finish,
            prompt_token_ids=seq.prompt,
            seed=seq.seed,
            logprobs=list(seq.logprobs) if want_logprobs else None,
            top_logprobs=list(seq.tops) if seq.params.top_logprobs else None,
            timings=seq.timings,
        )
        return StreamEvent(seq.index, piece, token, completion)


def _stop_ids_and_context(folder: Path, tokenizer) -> tuple[set[int], int | None]:
    """EOS/EOG ids and the context length, from the export manifest or the HF config files."""
    ids: set[int] = set()
    context = None
    manifest = folder / "onnxsample.json"
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        ids.update(data.get("tokens", {}).get("eos_token_ids", []))
        context = data.get("model", {}).get("max_position_embeddings") or None
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if path.is_file():
            data = json.loads(path.read_text())
            eos = data.get("eos_token_id")
            ids.update([eos] if isinstance(eos, int) else eos or [])
            if name == "config.json" and context is None:
                context = data.get("max_position_embeddings")
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids, context
