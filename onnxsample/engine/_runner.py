"""One session run per :class:`~onnxsample.engine._layout.Call`, with IOBinding.

The host sends token ids, the mask, positions, ``sampler.row_index``, one uniform per slot and the
prompt rows (and rewrites the allowed-tokens masks in place when a constrained row changed); it gets back token ids and logprobs (bound to preallocated host arrays) and, for a
concat cache, the ``present.*`` OrtValues. Everything else — the cache, the sampler parameters, the
penalty counts — is bound as device OrtValues.

A decode step of a shared-buffer graph binds the same cache rows, parameters and outputs as the step
before; building all of that anew costs Python time comparable to the sampler itself. Such calls
carry a ``reuse`` key, and their IOBindings are kept while the buffers and parameters they bind
hold.

With `cuda_graph` the decode steps go to :class:`~onnxsample.engine._graphs.CapturedDecode` and
every other call runs uncaptured.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from onnxsample.chain import TEMPERATURE_LAST
from onnxsample.engine._allowed import ALLOWED, DRAFT_ALLOWED, AllowedTokens
from onnxsample.engine._fallback import FALLBACK_FLAGS, FALLBACK_ROWS, HostFallback
from onnxsample.engine._graphs import UNCAPTURED, CapturedDecode, run_options
from onnxsample.engine._layout import Call
from onnxsample.engine._post_sampling import PROBS
from onnxsample.engine._row_copy import runs
from onnxsample.engine._slots import (
    COUNTS_OUT,
    SlotState,
    bind_rows,
    host_copy,
)

log = logging.getLogger(__name__)

# Outputs of a composed graph that come back to the host.
HOST_OUTPUTS = (
    "sampler.next_token",
    "sampler.logprob",
    "sampler.top_logprob_ids",
    "sampler.top_logprobs",
    "sampler.accepted",
    "sampler.draft_next_token",
    "sampler.draft_logprob",
    "sampler.draft_top_logprob_ids",
    "sampler.draft_top_logprobs",
    "sampler.candidate_ids",
    "sampler.candidate_logits",
    PROBS,
    FALLBACK_FLAGS,
)
DRAFT_TOKENS, DRAFT_UNIFORM = "sampler.draft_tokens", "sampler.draft_uniform"
PROMPT_OUTPUTS = (
    "sampler.prompt_logprob",
    "sampler.prompt_top_logprob_ids",
    "sampler.prompt_top_logprobs",
)
_TYPES = {"tensor(int64)": np.int64, "tensor(float)": np.float32, "tensor(bool)": np.bool_}


class Runner:
    """Runs calls on `session`; `slots` supplies the sampler inputs and the penalty state."""

    def __init__(self, session, device: str, slots: SlotState, *, cuda_graph: bool = False) -> None:
        self.session, self.device, self.slots = session, device, slots
        inputs = {i.name for i in session.get_inputs()}
        self.outputs = [o.name for o in session.get_outputs()]
        self.has_positions = "position_ids" in inputs
        self.has_uniform = "sampler.uniform" in inputs
        self.has_prompt = "sampler.prompt_rows" in inputs
        drafts = [i for i in session.get_inputs() if i.name == DRAFT_TOKENS]
        # K: how many drafts a slot can verify per run (0: a graph without speculation)
        self.draft_width = int(drafts[0].shape[1]) if drafts else 0
        self.has_draft_uniform = DRAFT_UNIFORM in inputs
        self._no_drafts = np.full((len(self.slots.params), self.draft_width), -1, np.int64)
        self._no_uniforms = np.full(self._no_drafts.shape, 0.5, np.float32)
        meta = slots.meta
        self.allowed = None
        if ALLOWED in inputs:
            width = self.draft_width if DRAFT_ALLOWED in inputs else 0
            self.allowed = AllowedTokens(
                meta.max_slots,
                meta.vocab_size,
                device,
                slots.rows_copy,
                static=meta.static,
                draft_width=width,
            )
        self.host: dict[str, np.ndarray] = {}
        for out in session.get_outputs():
            if out.name == PROBS and not meta.final_probs:
                continue  # a static chain's: read by nothing here
            if out.name in HOST_OUTPUTS:
                shape = list(out.shape)
                if slots.bucketed:  # the symbolic slot dimension: S rows on the host
                    shape[0] = meta.max_slots
                if not all(isinstance(d, int) for d in shape) or out.type not in _TYPES:
                    raise ValueError(f"{out.name} must have a fixed shape, got {out.shape}")
                self.host[out.name] = np.zeros(shape, _TYPES[out.type])
        self._bindings: dict[tuple | None, Any] = {}
        # A static chain's flagged slots: redrawn on the host from the rows the graph read.
        self.fallback: HostFallback | None = None
        self.device_outputs: dict[str, Any] = {}
        self.redrawn = 0  # slots redrawn so far
        if FALLBACK_ROWS in self.outputs:
            import onnxruntime as ort

            self.fallback = HostFallback(session.get_modelmeta().custom_metadata_map)
            shape = [meta.max_slots, meta.vocab_size]
            rows = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, device, 0)
            self.device_outputs[FALLBACK_ROWS] = rows
        # a static chain reads no temperature_last: the host draws those slots (_redraw)
        self._host_order = self.fallback is not None and TEMPERATURE_LAST not in slots.inputs
        self.graphs = (
            CapturedDecode(session, device, slots, self.host, self.allowed, self.device_outputs)
            if cuda_graph
            else None
        )
        self._options = run_options(UNCAPTURED) if cuda_graph else None

    def run(
        self, call: Call, uniform: np.ndarray, draft_uniform: np.ndarray | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run `call` with one uniform per slot (and, in a speculative graph, per draft position
        [S, K]): (host outputs by name, the presents it asked for). The host arrays are
        overwritten by the next call: read them before running another."""
        allowed = draft_allowed = None
        if self.allowed is not None:
            allowed, draft_allowed = self.allowed.for_call(call.sampling, call.drafts)
        rows = self.slots.sampler_rows()
        if self.graphs is not None and call.kind == "decode" and not call.drafts:
            host = self.graphs.run(call, uniform if self.has_uniform else None, rows)
            self._redraw(call, uniform, allowed, host)
            return host, {}
        self.slots.static()  # rewritten in place if a slot changed
        key = None if call.reuse is None else (rows, *call.reuse)
        reused = key in self._bindings
        if reused:
            binding, order = self._bindings[key], None
        else:
            binding, order = self._bind(call, rows)
            if key is not None:
                # Keep the bindings of the same KV buffers (a step may make several calls: each
                # drafting sequence's verification, then the others' decode).
                current = {k: b for k, b in self._bindings.items() if k[-1:] == key[-1:]}
                self._bindings = {**current, key: binding}
        binding.bind_cpu_input("input_ids", call.input_ids)
        binding.bind_cpu_input("attention_mask", call.mask)
        if self.has_positions:
            binding.bind_cpu_input("position_ids", call.positions)
        binding.bind_cpu_input("sampler.row_index", call.row_index[:rows])
        if allowed is not None:
            bind_rows(binding, ALLOWED, allowed, rows)
        if self.has_uniform:
            binding.bind_cpu_input("sampler.uniform", uniform[:rows])
        if self.draft_width:
            drafts = self._no_drafts
            if call.drafts:
                drafts = drafts.copy()
                for slot, draft in call.drafts.items():
                    drafts[slot, : len(draft)] = draft
            binding.bind_cpu_input(DRAFT_TOKENS, drafts)
            if self.has_draft_uniform:
                u = self._no_uniforms if draft_uniform is None else draft_uniform
                binding.bind_cpu_input(DRAFT_UNIFORM, u)
            if draft_allowed is not None:
                binding.bind_ortvalue_input(DRAFT_ALLOWED, draft_allowed)
        if self.has_prompt and not reused:
            binding.bind_cpu_input("sampler.prompt_rows", call.prompt_rows)
            binding.bind_cpu_input("sampler.prompt_targets", call.prompt_targets)
        self.slots.bind_counts(binding, rows)
        self.session.run_with_iobinding(binding, self._options)
        self.slots.advance()
        host: dict[str, Any] = dict(self.host)
        self._redraw(call, uniform, allowed, host)
        presents: dict[str, Any] = {}
        if order is not None and (call.presents or call.prompt_rows.size):
            values = dict(zip(order, binding.get_outputs(), strict=True))
            presents = {name: values[name] for name in call.presents}
            if call.prompt_rows.size:
                host.update({n: host_copy(values[n]) for n in PROMPT_OUTPUTS if n in values})
        return host, presents

    def _redraw(self, call: Call, uniform: np.ndarray, allowed, host: dict) -> None:
        """The token (and what goes with it) of each sampling slot the static chain flagged, from
        the branching chain on the host, written into `host`; the slot's count moves to it."""
        if self.fallback is None:
            return
        flags = host[FALLBACK_FLAGS]
        # and the slots whose temperature comes after the cuts, which a static chain cannot read
        flagged = [
            seq.slot
            for seq in call.sampling
            if flags[seq.slot] or (self._host_order and seq.params.temperature_moves)
        ]
        if not flagged:
            return
        counted = {s: int(host["sampler.next_token"][s]) for s in flagged}
        feeds = self.slots.host_inputs(counted)
        feeds["sampler.row_index"] = call.row_index
        feeds["sampler.uniform"] = uniform
        if allowed is not None:  # the host's copy of the masks bound
            feeds[ALLOWED] = self.allowed.rows
        rows = {}  # slot -> its row [1, V] of the logits, each run of slots one copy
        for lo, hi in runs(flagged):
            span = self.slots.rows_copy.to_host(self.device_outputs[FALLBACK_ROWS], lo, hi)
            rows.update({s: span[s - lo : s - lo + 1] for s in range(lo, hi)})
        moves = []
        for s in flagged:
            taken = int(host["sampler.next_token"][s])
            for name, value in self.fallback.redraw(rows[s], feeds, s).items():
                if name in host:
                    host[name][s] = value[0]
            moves.append((s, taken, int(host["sampler.next_token"][s])))
        self.slots.retake(moves)
        self.redrawn += len(flagged)
        log.debug("%d slot(s) past the static candidates drawn on the host", len(flagged))

    def invalidate(self) -> None:
        """Forget the kept bindings (after their buffers changed outside a key's knowledge)."""
        self._bindings = {}

    def _bind(self, call: Call, rows: int) -> tuple[Any, list[str]]:
        """A fresh binding with the cache, the parameters (their first `rows` rows) and every
        output bound; the outputs' names in the order ONNX Runtime returns them (the order they
        were first bound)."""
        import onnxruntime as ort

        binding = self.session.io_binding()
        order = call.bind_kv(binding)
        self.slots.bind_static(binding, rows)
        if self.slots.penalties:
            self.slots.bind_counts(binding, rows)
            order.append(COUNTS_OUT)
        for name in self.outputs:
            if name in order:
                continue
            if name in self.host:
                host = ort.OrtValue.ortvalue_from_numpy(self.host[name])
                bind_rows(binding, name, host, rows, output=True)
            elif name in self.device_outputs:
                bind_rows(binding, name, self.device_outputs[name], rows, output=True)
            elif name in PROMPT_OUTPUTS:
                binding.bind_output(name, "cpu")
            else:
                binding.bind_output(name, self.device)
            order.append(name)
        return binding, order
