"""Per-request sampling parameters and their packing into the graph's per-slot ``sampler.*`` inputs.

:class:`SamplingParams` carries what a request of vLLM or the OpenAI API carries;
:meth:`SamplingParams.validate` checks it on the host, with vLLM's wording, so that the graph never
sees an invalid value. :func:`pack_sampling_params` turns one ``SamplingParams`` (or ``None`` for an
inactive slot) per slot into the arrays that a graph built for a given chain reads.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from onnxsample.chain import GREEDY_BELOW, TEMPERATURE_LAST, SamplerChain
from onnxsample.constraint import Constraint
from onnxsample.errors import InvalidParameter, check_count

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_TOP_LOGPROBS",
    "SamplingParams",
    "pack_sampling_params",
    "sampler_fields",
    "samplers_on",
    "temperature_moves",
]

MAX_TOP_LOGPROBS = 20
_PREFIX = "sampler."


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """The sampling parameters of one request. Every default is the neutral value: the defaults
    sample from the model's distribution at temperature 1.

    ``temperature`` 0 is greedy decoding. ``top_k`` 0, ``top_p`` 1, ``min_p`` 0, ``typical_p`` 1,
    ``repetition_penalty`` 1 and ``presence_penalty`` / ``frequency_penalty`` 0 are off.
    ``temperature_last`` applies the temperature after top-k, top-p, min-p and typical-p, where
    llama.cpp's default order puts it (text-generation-webui's field): the cuts then read the
    untempered distribution, in their own order (llama.cpp runs typical-p before top-p and
    min-p); by default the temperature comes first, as in transformers and vLLM.
    ``logit_bias`` maps token ids to values added to their logits. ``seed`` (an integer in
    [0, 2**64)) seeds the slot's own generator (the runtime draws one uniform per step from it);
    ``logprobs`` / ``top_logprobs`` ask for the chosen token's logprob and the ``top_logprobs`` most
    likely tokens. ``prompt_logprobs`` (None = off) asks for the logprob of every prompt token and
    its ``prompt_logprobs`` most likely alternatives (vLLM's field; OpenAI's ``echo``).
    ``ignore_eos`` keeps generating past end-of-sequence tokens (benchmarks, as vLLM's);
    ``min_tokens`` keeps end-of-sequence tokens out of the first ``min_tokens`` (vLLM's field: their
    logits get a -100 bias, which needs free logit-bias entries in the graph), and stop strings
    too, as vLLM: one must end in a later token's text, though it may begin in theirs.
    ``constraint`` (a :class:`~onnxsample.Constraint`: JSON schema, JSON object, regex, grammar,
    choice) restricts the output to what it matches (structured output; the graph needs
    ``sampler.allowed``). ``host_sampler`` finishes the choice on the host: a callable that gets
    the slot's candidates after the graph's filters (``ids`` int64 [K], ``logits`` float32 [K],
    most likely first, −inf where a filter dropped the token) and returns the token to take (one
    the filters kept, or one of the model's end-of-sequence ids); the graph needs
    ``sampler.candidate_ids`` (``onnxsample compose --candidates K``).
    ``post_sampling_probs`` (None = off) asks, in place of the model's logprobs, for the chosen
    token's log-probability and the ``post_sampling_probs`` most likely tokens' under the
    distribution the draw uses, after every filter and at the draw's temperature (llama-server's
    ``post_sampling_probs``): tokens of probability 0 are left out, and greedy decoding gives the
    chosen token alone, at 0. They come as the events' and the completion's logprobs. Unless the
    temperature is 0, the graph needs the whole final distribution of a branching chain
    (``onnxsample compose --output-probs``: any filters), or at least that many candidates
    (``onnxsample compose --candidates K``), where the filters must keep fewer than K tokens: a
    step where they keep K or more fails the request with :class:`InvalidParameter`.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    temperature_last: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    constraint: Constraint | None = None
    host_sampler: Callable[[np.ndarray, np.ndarray], int] | None = None
    post_sampling_probs: int | None = None

    def validate(self, vocab_size: int | None = None) -> SamplingParams:
        """Raise :class:`InvalidParameter` for the first value outside its range; return ``self``.

        Token ids of ``logit_bias`` are checked against ``vocab_size`` when it is given.
        """
        _check_range("temperature", self.temperature, 0.0, _FLOAT32_MAX, "a finite float32 >= 0")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise InvalidParameter(f"top_k must be an integer >= 0 (0 disables), got {self.top_k}")
        _check_range("top_p", self.top_p, 0.0, 1.0, "in (0, 1]", low_open=True)
        _check_range("min_p", self.min_p, 0.0, 1.0, "in [0, 1]")
        _check_range("typical_p", self.typical_p, 0.0, 1.0, "in (0, 1]", low_open=True)
        _check_range(
            "repetition_penalty",
            self.repetition_penalty,
            0.0,
            _FLOAT32_MAX,
            "a finite float32 > 0",
            True,
        )
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0, "in [-2, 2]")
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, "in [-2, 2]")
        if not isinstance(self.logit_bias, dict):
            raise InvalidParameter(
                f"logit_bias must be a dict of token id to value, got {type(self.logit_bias).__name__}"
            )
        for token, value in self.logit_bias.items():
            high = vocab_size if vocab_size is not None else 2**63  # an int64 id at most
            if not _is_int(token) or not 0 <= token < high:
                bound = f"in [0, {vocab_size})" if vocab_size is not None else "in [0, 2**63)"
                raise InvalidParameter(f"logit_bias token id must be {bound}, got {_shown(token)}")
            _check_range(f"logit_bias[{token}]", value, -100.0, 100.0, "in [-100, 100]")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**64):
            shown = repr(self.seed) if isinstance(self.seed, str) else _shown(self.seed)
            raise InvalidParameter(f"seed must be an integer in [0, 2**64), got {shown}")
        if not isinstance(self.temperature_last, (bool, np.bool_)):
            raise InvalidParameter(
                f"temperature_last must be a bool, got {self.temperature_last!r}"
            )
        if not isinstance(self.logprobs, (bool, np.bool_)):
            raise InvalidParameter(
                f"logprobs must be a bool, got {self.logprobs!r} (top_logprobs is how many of the "
                "most likely tokens each step reports)"
            )
        check_count("top_logprobs", self.top_logprobs, 0, MAX_TOP_LOGPROBS)
        prompt = self.prompt_logprobs
        if prompt is not None and (not _is_int(prompt) or not 0 <= prompt <= MAX_TOP_LOGPROBS):
            raise InvalidParameter(
                f"prompt_logprobs must be None or in [0, {MAX_TOP_LOGPROBS}], got {prompt}"
            )
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise InvalidParameter(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        check_count("min_tokens", self.min_tokens, 0)
        if self.constraint is not None:
            if not isinstance(self.constraint, Constraint):
                raise InvalidParameter(
                    f"constraint must be a Constraint, got {type(self.constraint).__name__}"
                )
            self.constraint.validate()
        if self.host_sampler is not None:
            if not callable(self.host_sampler):
                raise InvalidParameter(
                    f"host_sampler must be callable, got {type(self.host_sampler).__name__}"
                )
            if self.logprobs or self.top_logprobs:
                raise InvalidParameter(
                    "logprobs are not reported for a host-sampled request (the host picks the "
                    "token from the candidates, whose logits are the filtered ones)"
                )
        post = self.post_sampling_probs
        if post is not None:
            if not _is_int(post) or post < 0:
                raise InvalidParameter(
                    f"post_sampling_probs must be None or an integer >= 0, got {post!r}"
                )
            if self.logprobs or self.top_logprobs:
                raise InvalidParameter(
                    "post_sampling_probs replaces logprobs and top_logprobs: ask for one of them"
                )
            if self.host_sampler is not None:
                raise InvalidParameter(
                    "post_sampling_probs cannot be combined with a host sampler, which picks the "
                    "token after the graph's distribution"
                )
        return self

    @property
    def reports_logprobs(self) -> bool:
        """Whether each token comes with a logprob (the model's, or the final distribution's)."""
        return bool(self.logprobs or self.top_logprobs or self.post_sampling_probs is not None)

    @property
    def reported_tops(self) -> int:
        """How many most likely tokens come with each token."""
        return self.top_logprobs or self.post_sampling_probs or 0

    @property
    def temperature_moves(self) -> bool:
        """Whether ``temperature_last`` changes what is drawn (:func:`temperature_moves`)."""
        p = self
        return bool(
            temperature_moves(
                p.temperature_last, p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p
            )
        )


def temperature_moves(
    last: ArrayLike,
    temperature: ArrayLike,
    top_k: ArrayLike,
    top_p: ArrayLike,
    min_p: ArrayLike,
    typical_p: ArrayLike,
) -> Any:
    """Whether the temperature's place changes what is drawn, per slot (numbers or arrays): it
    comes last, draws (≥ 1e-5) at other than 1, and some cut is on."""
    cut = (top_k != 0) | (top_p != 1) | (min_p != 0) | (typical_p != 1)
    drawn = (temperature >= GREEDY_BELOW) & (temperature != 1)
    return last & drawn & cut


_FLOAT32_MAX = float(np.finfo(np.float32).max)  # the graph's parameters are float32


def _shown(value: object) -> str:
    """`value` for a message: an integer past 128 bits by its size (``str`` refuses past 4,300
    digits), anything else cut to 40 characters."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    text = str(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({type(value).__name__})"


def _check_range(
    name: str, value: object, low: float, high: float, rule: str, low_open: bool = False
) -> None:
    try:
        ok = _is_number(value) and math.isfinite(float(value))  # type: ignore[arg-type]
    except OverflowError:  # an integer past every float (10**400)
        ok = False
    if ok:
        number = float(value)  # type: ignore[arg-type]
        ok = (low < number if low_open else low <= number) and number <= high
    if not ok:
        raise InvalidParameter(f"{name} must be {rule}, got {_shown(value)}")


def pack_sampling_params(
    slots: Sequence[SamplingParams | None],
    chain: SamplerChain | str,
    max_slots: int,
    *,
    max_bias: int = 0,
    vocab_size: int | None = None,
    top_logprobs: int | None = None,
) -> dict[str, np.ndarray]:
    """The per-slot parameter inputs (``sampler.temperature``, ``sampler.top_k``, …) of a graph built
    for ``chain``, ``max_slots`` and ``max_bias``; ``None`` (or a missing trailing slot) is an
    inactive slot and gets neutral values.

    Each ``SamplingParams`` is validated. A slot that sets a sampler the chain lacks to a non-neutral
    value (``top_k=40`` on a chain without ``top_k``), more logit-bias entries than ``max_bias``, or
    more ``top_logprobs`` than the graph's ``top_logprobs`` raises :class:`InvalidParameter`.
    The uniforms, row indices, prompt mask and output counts are runtime state, not packed here.
    ``sampler.temperature_last`` is packed only where a slot sets ``temperature_last``: a graph
    that reads it defaults it to false, and one that cannot (a static chain, a model composed
    before it) refuses the input by name rather than draw in the other order.
    """
    chain = SamplerChain(chain)
    check_count("max_slots", max_slots, 1)
    check_count("max_bias", max_bias, 0)
    if len(slots) > max_slots:
        raise InvalidParameter(f"{len(slots)} slots given, more than max_slots={max_slots}")
    if bad := [p for p in slots if p is not None and not isinstance(p, SamplingParams)]:
        raise InvalidParameter(f"each slot is SamplingParams or None, got {type(bad[0]).__name__}")
    bias_on = "logit_bias" in chain and max_bias > 0
    arrays = _neutral_arrays(chain, max_slots, max_bias if bias_on else 0)
    for s, params in enumerate(slots):
        if params is None:
            continue
        params.validate(vocab_size)
        _check_chain_supports(params, chain, max_bias if bias_on else 0, top_logprobs)
        for name in _SCALARS:
            key = _PREFIX + name
            if key in arrays:
                value = getattr(params, name)
                if name == "top_k":  # k ≥ V keeps every token, as k = 0 does (the static
                    # chain flags a k past its candidates for the host: this one need not go)
                    value = 0 if vocab_size is not None and value >= vocab_size else value
                    value = min(value, _TOP_K_ALL)
                arrays[key][s] = value
        if chain.reorders_temperature and params.temperature_last:
            last = arrays.setdefault(TEMPERATURE_LAST, np.zeros(max_slots, dtype=np.bool_))
            last[s] = True
        if bias_on:
            for j, (token, value) in enumerate(sorted(params.logit_bias.items())):
                arrays[_PREFIX + "bias_ids"][s, j] = token
                arrays[_PREFIX + "bias_values"][s, j] = value
    return arrays


_TOP_K_ALL = 2**62
_NEUTRAL = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
_SCALARS = tuple(_NEUTRAL)
_OWNER = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "repetition_penalty": "penalties",
    "presence_penalty": "penalties",
    "frequency_penalty": "penalties",
}


def sampler_fields(sampler: str) -> tuple[str, ...]:
    """The fields of :class:`SamplingParams` that set the chain's `sampler` (``penalties``: the
    three penalties)."""
    return tuple(name for name, owner in _OWNER.items() if owner == sampler)


def samplers_on(source: Any) -> dict[str, Any]:
    """The chain's samplers that `source` turns on (SamplingParams, or a request with fields of
    the same names, where an absent or None field is at its neutral value): {sampler: the value
    of the first of its fields that is on}."""
    on: dict[str, Any] = {}
    for name, neutral in _NEUTRAL.items():
        value = getattr(source, name, None)
        if value is not None and value != neutral:
            on.setdefault(_OWNER[name], value)
    return on


def _neutral_arrays(chain: SamplerChain, max_slots: int, max_bias: int) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for name, neutral in _NEUTRAL.items():
        if _OWNER[name] in chain:
            dtype = np.int64 if name == "top_k" else np.float32
            arrays[_PREFIX + name] = np.full(max_slots, neutral, dtype=dtype)
    if max_bias > 0:
        arrays[_PREFIX + "bias_ids"] = np.full((max_slots, max_bias), -1, dtype=np.int64)
        arrays[_PREFIX + "bias_values"] = np.zeros((max_slots, max_bias), dtype=np.float32)
    return arrays


def _check_chain_supports(
    params: SamplingParams, chain: SamplerChain, max_bias: int, top_logprobs: int | None
) -> None:
    if not chain.samples and params.temperature != 0:
        raise InvalidParameter(
            f"temperature={params.temperature} needs the dist sampler: the chain {str(chain)!r} "
            "decodes greedily; use temperature=0 or add dist to the chain"
        )
    missing = [  # every value the chain cannot apply, named at once
        (name, getattr(params, name))
        for name, neutral in _NEUTRAL.items()
        if not (name == "temperature" and not chain.samples)
        and _OWNER[name] not in chain
        and getattr(params, name) != neutral
    ]
    if missing:
        values = ", ".join(f"{name}={value}" for name, value in missing)
        owners = list(dict.fromkeys(_OWNER[name] for name, _ in missing))
        needs = "needs" if len(missing) == 1 else "need"
        samplers = "sampler" if len(owners) == 1 else "samplers"
        raise InvalidParameter(
            f"{values} {needs} the {', '.join(owners)} {samplers}, which the chain "
            f"{str(chain)!r} does not contain"
        )
    if len(params.logit_bias) > max_bias:
        if "logit_bias" not in chain or max_bias == 0:
            raise InvalidParameter(
                f"logit_bias needs the logit_bias sampler with max_bias >= 1; the chain "
                f"{str(chain)!r} was built with max_bias={max_bias}"
            )
        raise InvalidParameter(
            f"logit_bias has {len(params.logit_bias)} entries, more than max_bias={max_bias}"
        )
    if top_logprobs is not None and params.top_logprobs > top_logprobs:
        raise InvalidParameter(
            f"top_logprobs={params.top_logprobs} is more than the graph returns ({top_logprobs})"
        )
    if top_logprobs is not None and (params.prompt_logprobs or 0) > top_logprobs:
        raise InvalidParameter(
            f"prompt_logprobs={params.prompt_logprobs} is more than the graph returns "
            f"({top_logprobs})"
        )
