"""llama-server's request fields that this server reads with the request they come with: its
names for this server's fields (``n_predict`` for ``max_tokens``, and ``repeat_penalty`` for
``repetition_penalty`` where its window is the whole sequence), ``samplers`` (the order its chain
runs in) and ``repeat_last_n`` (the penalties' window).

This server's chain runs penalties, then top-k, top-p, min-p and typical-p, with the temperature
before them (:data:`onnxsample.chain.SAMPLER_NAMES`, transformers' and vLLM's order) or, per
request, after them (``temperature_last``, llama.cpp's default). llama-server runs the samplers a
request lists, in the listed order (by default top-k, typical-p, top-p, min-p, then temperature).
The two give the same distribution whenever every pair of samplers the request turns on either
runs in the same order in both or commutes: top-k commutes with temperature and with min-p (both
keep what is above a rank or a fraction of the largest probability, which the other leaves where
it was), and greedy decoding (temperature 0) commutes with every cut (each keeps the most likely
token). A listed order that one of the two orders gives is taken (with ``temperature_last`` where
only the second does); otherwise the field is refused, naming the pair. A sampler the request
turns on but the list leaves out (llama-server would skip it) is refused too.

llama-server's own routes (``/completion``, ``/infill``) take llama-server's defaults for what a
request leaves out (:func:`apply_llama_defaults`): temperature 0.8, top-k 40, top-p 0.95, min-p
0.05, and its sampler order. OpenAI's routes take OpenAI's (the neutral values), as vLLM's do.
Penalties are OpenAI's rules here, so llama-server's ``presence_penalty`` and
``frequency_penalty`` (counted over the prompt too, in its window) are refused on its routes.
"""

from __future__ import annotations

from typing import Any

from onnxsample.chain import CUTS, GREEDY_BELOW, SAMPLER_NAMES, SamplerChain
from onnxsample.engine._options import UNBOUNDED
from onnxsample.errors import InvalidParameter
from onnxsample.params import sampler_fields, samplers_on

__all__ = [
    "LLAMA_DEFAULTS",
    "apply_llama_defaults",
    "apply_llama_names",
    "order_refusal",
    "penalty_refusal",
    "post_sampling_bound",
    "take_infill",
    "take_post_sampling",
    "window_refusal",
]

# llama-server's name: (this server's fields it stands for, the type it takes)
_ALIASES = {
    "n_predict": (("max_tokens", "max_completion_tokens"), int),
    "repeat_penalty": (("repetition_penalty",), (int, float)),
}
_WINDOWS = ("repeat_last_n", "penalty_last_n")

# llama.cpp's names for its samplers (common_sampler_types_from_names), as this server calls them.
_CANONICAL = {
    "penalties": "penalties",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typ_p": "typical_p",
    "dry": "dry",
    "top_n_sigma": "top_n_sigma",
    "xtc": "xtc",
    "infill": "infill",
    "adaptive_p": "adaptive_p",
}
_NAMES = {
    **{k.replace("_", "-"): v for k, v in _CANONICAL.items()},
    **{k.replace("_", ""): v for k, v in _CANONICAL.items()},
    "nucleus": "top_p",
    "temp": "temperature",
    "typ": "typical_p",
    **_CANONICAL,
}
_LETTERS = {  # common_sampler_type_to_chr
    "e": "penalties",
    "t": "temperature",
    "k": "top_k",
    "p": "top_p",
    "m": "min_p",
    "y": "typical_p",
    "d": "dry",
    "s": "top_n_sigma",
    "x": "xtc",
    "i": "infill",
    "a": "adaptive_p",
}
# Listed, these change the draw whatever the request's parameters say.
_NOT_HERE = ("infill", "adaptive_p")
_ORDER = tuple(s for s in SAMPLER_NAMES if s not in ("logit_bias", "dist"))
_ORDER_LAST = (*(s for s in _ORDER if s != "temperature"), "temperature")

# llama-server's sampling where a request leaves it out (common_params_sampling's defaults) ...
LLAMA_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


class _DefaultOrder(list):
    """... and its sampler order (common_params_sampling's ``samplers``), as a request without
    ``samplers`` takes it."""


def _default_order() -> _DefaultOrder:
    return _DefaultOrder(
        [
            "penalties",
            "dry",
            "top_n_sigma",
            "top_k",
            "typ_p",
            "top_p",
            "min_p",
            "xtc",
            "temperature",
        ]
    )


def _commute(a: str, b: str, on: dict[str, float]) -> bool:
    pair = {a, b}
    if pair in ({"top_k", "temperature"}, {"top_k", "min_p"}):
        return True
    return "temperature" in pair and on["temperature"] == 0 and bool(pair & set(CUTS))


def _listed(value: Any) -> list[str] | str:
    """llama.cpp's sampler names (a list, unknown names dropped as llama-server drops them) or
    letters (a string), as this server's names; a message when it is neither."""
    if isinstance(value, str):
        return [_LETTERS[c] for c in value if c in _LETTERS]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [_NAMES[v.lower()] for v in value if v.lower() in _NAMES]
    return "give a list of sampler names or a string of sampler letters"


def take_infill(extra: dict[str, Any]) -> bool:
    """Whether llama-server's ``samplers`` in a request's `extra` fields lists llama.cpp's
    ``infill`` sampler, which ``/completion`` and ``/infill`` run on the host after the chain
    (:mod:`~onnxsample.serve.infill_sampler`): then it is taken out of the list. It must be the
    last sampler listed (editors list it last); :class:`InvalidParameter` otherwise."""
    value = extra.get("samplers")
    listed = _listed(value)
    if isinstance(listed, str) or "infill" not in listed:
        return False
    if listed[-1] != "infill" or listed.count("infill") > 1:
        raise InvalidParameter("samplers: infill runs once, after every other sampler, here")
    if isinstance(value, str):
        extra["samplers"] = value.replace("i", "")
    else:
        extra["samplers"] = [v for v in value if _NAMES.get(v.lower()) != "infill"]
    return True


def take_post_sampling(extra: dict[str, Any]) -> bool:
    """llama-server's ``post_sampling_probs``, taken out of a request's `extra` fields: whether
    its probabilities are those of the distribution the draw uses, after the whole chain,
    rather than the model's (:attr:`~onnxsample.SamplingParams.post_sampling_probs`)."""
    value = extra.pop("post_sampling_probs", None)
    if value is not None and not isinstance(value, bool):
        raise InvalidParameter(f"post_sampling_probs must be a boolean, got {value!r}")
    return bool(value)


def post_sampling_bound(body: Any, meta: Any) -> int | None:
    """How many probabilities a ``post_sampling_probs`` request may ask for: the candidates of
    the model `meta` describes, where it draws and the model has them but not the whole final
    distribution (greedy decoding needs neither; a model with neither is refused by the engine,
    naming the field)."""
    greedy = body.temperature is not None and body.temperature < GREEDY_BELOW
    if greedy or meta.final_probs or not meta.output_candidates:
        return None
    return meta.output_candidates


def _misordered(listed: list[str], on: dict[str, Any], order: tuple[str, ...]) -> tuple | None:
    """The first pair (a, b) of the samplers `on` that `order` runs a-then-b and `listed`
    b-then-a, where the two do not commute; None when `listed` gives `order`'s distribution."""
    ours = [s for s in order if s in on]
    for i, a in enumerate(ours):
        for b in ours[i + 1 :]:
            if listed.index(b) < listed.index(a) and not _commute(a, b, on):
                return a, b
    return None


def _last(body: Any) -> bool:
    return bool(getattr(body, "temperature_last", None))


def order_refusal(value: Any, body: Any) -> str | None:
    """Why llama-server's ``samplers`` `value` would change `body`'s answer here, or None
    (after :func:`apply_llama_names`, which takes the temperature last where only that order
    gives the listed one's distribution)."""
    if value is None:
        return None
    listed = _listed(value)
    if isinstance(listed, str):
        return listed
    for name in _NOT_HERE:
        if name in listed:
            return f"it lists {name}, which this server does not have"
    on = samplers_on(body)  # what the list leaves out is off (apply_llama_names)
    for name in on:
        if listed.count(name) > 1:
            return f"it lists {name} twice"
    order = _ORDER_LAST if _last(body) else _ORDER
    pair = _misordered(listed, on, order)
    if pair is None:
        return None
    if getattr(body, "temperature_last", None) is None and "temperature" in pair:
        # name, where there is one, a pair that temperature_last would not put in order
        pair = _misordered(listed, on, tuple(s for s in order if s != "temperature")) or pair
    a, b = pair
    if isinstance(value, _DefaultOrder):
        return (
            f"without samplers, llama-server runs {b} before {a}; this server runs "
            f"{', '.join(_ORDER_LAST)}: send samplers in that order, or turn one of them off"
        )
    if _last(body):
        return f"it runs {b} before {a}; with temperature_last this server's order is " + (
            ", ".join(_ORDER_LAST)
        )
    return (
        f"it runs {b} before {a}; this server's order is {', '.join(_ORDER)}, or "
        f"{', '.join(_ORDER_LAST)} (temperature_last)"
    )


def _whole(value: Any, context: int | None) -> bool:
    """Whether a penalties' window of `value` tokens covers every sequence: -1, or at least the
    `context` (no sequence is longer), which llama-server also takes where it refuses -1."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return value == -1 or (context is not None and value >= context)


def _whole_window(context: int | None) -> str:
    if context is None or context >= UNBOUNDED:  # a model that names no context
        return "-1"
    return f"-1 or at least the context, {context}"


def window_refusal(value: Any, body: Any, context: int | None = None) -> str | None:
    """Why llama-server's ``repeat_last_n`` `value` would change `body`'s answer here, or None:
    penalties here count the whole sequence (llama-server's -1, or a window of the `context`),
    and a window changes nothing when no penalty is on."""
    if value is None or _whole(value, context):
        return None
    if "penalties" not in samplers_on(body):
        return None
    return f"penalties count the whole sequence: send {_whole_window(context)}"


def apply_llama_defaults(body: Any, chain: SamplerChain) -> None:
    """On llama-server's own routes: set what `body` leaves out of llama-server's default
    sampling (:data:`LLAMA_DEFAULTS`, those `chain` draws with; and its ``samplers`` order, so the
    temperature comes after the cuts); :class:`InvalidParameter` for a presence or frequency
    penalty, which llama-server counts over the prompt and answer in its window, and this server
    over the answer alone. Before :func:`apply_llama_names`."""
    extra = body.model_extra if body.model_extra is not None else {}
    if extra.get("samplers") is None:
        extra["samplers"] = _default_order()
    listed = _listed(extra["samplers"])  # a sampler left out is skipped: no default for it
    for name, value in LLAMA_DEFAULTS.items():
        wanted = isinstance(listed, list) and name in listed and chain.samples and name in chain
        if getattr(body, name) is None and wanted:
            setattr(body, name, value)
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name) not in (None, 0, 0.0):
            raise InvalidParameter(
                f"{name} is not supported on this route (llama-server counts it over the prompt "
                "and the answer, here it counts the answer's tokens as OpenAI's does): use "
                "/v1/completions, or repeat_penalty with repeat_last_n -1"
            )


def apply_llama_names(body: Any) -> None:
    """Set `body`'s fields from llama-server's names for them (``n_predict``, -1 for no limit;
    ``repeat_penalty``), turn off a sampler ``samplers`` leaves out (llama-server builds its chain
    from the list alone: ``[]`` is a draw from the model's own distribution), and set
    ``temperature_last`` where the order it lists gives the distribution of that order only;
    :class:`InvalidParameter` where a name contradicts its field."""
    extra = body.model_extra or {}
    for name, (fields, kind) in _ALIASES.items():
        value = extra.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kind):
            what = "an integer" if kind is int else "a number"
            raise InvalidParameter(f"{name} must be {what}, got {value!r}")
        for field in fields:
            given = getattr(body, field, None)
            if given is not None and given != value:
                raise InvalidParameter(f"{name} is {value} but {field} is {given}: send one")
        setattr(body, fields[0], value)
    listed = _listed(extra.get("samplers"))
    if isinstance(listed, list):  # llama-server builds its chain from the list alone
        for name in samplers_on(body):
            if name not in listed:
                for field in sampler_fields(name):
                    setattr(body, field, None)  # off: a sampler the list leaves out is skipped
    if getattr(body, "temperature_last", None) is None and isinstance(listed, list):
        on = samplers_on(body)
        once = all(listed.count(name) == 1 for name in on)
        if once and _misordered(listed, on, _ORDER) and not _misordered(listed, on, _ORDER_LAST):
            body.temperature_last = True  # llama.cpp's order: the temperature after the cuts


def penalty_refusal(value: Any, body: Any, context: int | None = None) -> str | None:
    """Why llama-server's ``repeat_penalty`` `value` would change `body`'s answer here, or None:
    llama-server counts the last 64 tokens unless ``repeat_last_n`` says otherwise, and over the
    whole sequence (-1, or a window of the `context`; prompt included) its rule is
    ``repetition_penalty``'s."""
    extra = body.model_extra or {}
    if value in (None, 1, 1.0) or any(_whole(extra.get(w), context) for w in _WINDOWS):
        return None
    if "penalties" not in samplers_on(body):  # off: samplers leaves them out
        return None
    return (
        f"llama-server counts the last 64 tokens: send repeat_last_n {_whole_window(context)}, "
        "or repetition_penalty"
    )
