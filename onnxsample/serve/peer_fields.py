"""The fields of OpenAI's, vLLM's and llama-server's requests that would change the answer and that
this server does not implement: refused by name, never ignored.

A field the server does not know is ignored, as vLLM ignores one, so a client that sends its own
metadata keeps working. A field that one of those servers honours and that changes what the answer
must be (beam search, stop token ids, mirostat, a request's own chat template...) is refused with a
400 naming it and what to use instead, unless it holds its neutral value (``best_of: 1`` or n,
``skip_special_tokens: true``, ``mirostat: 0``...), which clients send as defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onnxsample.serve.errors import APIError
from onnxsample.serve.llama_fields import order_refusal, penalty_refusal, window_refusal

__all__ = ["refuse_unsupported"]


def _absent(value: Any) -> bool:
    return value is None or value in ([], {}, "")


def _is(neutral: Any) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if value is None:
            return True
        if isinstance(value, bool) != isinstance(neutral, bool):  # true is not 1 here
            return False
        return value == neutral

    return check


def _disabled(value: Any) -> bool:  # llama.cpp's -1 / 0 "off"
    return value is None or (isinstance(value, (int, float)) and value <= 0)


_TEXT = "this server writes text only"
_BEAM = "this server samples; it has no beam search"
# name: (neutral, what to use instead), for chat and text completions alike.
_BOTH: dict[str, tuple[Callable[[Any], bool], str]] = {
    # OpenAI
    "functions": (_absent, "use tools"),
    "function_call": (_absent, "use tools and tool_choice"),
    "audio": (_absent, _TEXT),
    "modalities": (lambda v: v is None or v == ["text"], _TEXT),
    "web_search_options": (lambda v: v is None, "this server has no web search"),
    # vLLM
    "use_beam_search": (_is(False), _BEAM),
    "length_penalty": (_is(1.0), _BEAM),
    "stop_token_ids": (_absent, "use stop strings; the model's end-of-sequence ids end it already"),
    "bad_words": (_absent, "use logit_bias"),
    "allowed_token_ids": (_absent, "use logit_bias or a grammar"),
    "include_stop_str_in_output": (_is(False), "a stop string is never part of the text"),
    "skip_special_tokens": (_is(True), "special tokens are left out of the text"),
    "spaces_between_special_tokens": (_is(True), "special tokens are left out of the text"),
    "truncate_prompt_tokens": (_absent, "a prompt over the context is refused, never cut"),
    "prompt_logprobs": (_absent, "use a completion with echo and logprobs"),
    "logits_processors": (_absent, "use logit_bias or a grammar"),
    "return_tokens_as_token_ids": (_is(False), "use /tokenize"),
    "return_token_ids": (_is(False), "use /tokenize"),
    "structural_tag": (_absent, "use response_format, a grammar or tools"),
    "vllm_xargs": (_absent, "this server has no custom extensions"),
    "prompt_embeds": (_absent, "send text or token ids"),
    "priority": (_is(0), "requests are served first come, first served"),  # vLLM's default too
    # llama-server
    "mirostat": (_is(0), "use top_k, top_p, min_p or typical_p"),
    "dynatemp_range": (_is(0), "the temperature is fixed per request"),
    "dry_multiplier": (_is(0), "use repetition_penalty or frequency_penalty"),
    "xtc_probability": (_is(0), "use top_k, top_p, min_p or typical_p"),
    "top_n_sigma": (_disabled, "use top_k, top_p, min_p or typical_p"),
    "tfs_z": (_is(1.0), "use top_k, top_p, min_p or typical_p"),
    "n_probs": (_is(0), "use logprobs"),
    "min_keep": (
        lambda v: v is None or (v in (0, 1) and not isinstance(v, bool)),
        "cuts keep one token",
    ),
    "return_tokens": (_is(False), "use /tokenize"),
    "response_fields": (_absent, "responses have OpenAI's fields"),
    "lora": (_absent, "this server has no adapters"),
    "grammar_lazy": (_is(False), "a grammar holds from the first token"),
    "grammar_triggers": (_absent, "a grammar holds from the first token"),
    "reasoning_budget_tokens": (_is(-1), "use max_tokens"),
    "adaptive_target": (
        lambda v: v is None or (isinstance(v, (int, float)) and v < 0),
        "use top_k, top_p, min_p or typical_p",
    ),
}
# llama-server's, read with the request's sampling fields: (why it would change the answer, or None).
# (value, request, the server's context)
_BY_REQUEST: dict[str, Callable[[Any, Any, int | None], str | None]] = {
    "samplers": lambda v, body, _: order_refusal(v, body),
    "repeat_penalty": penalty_refusal,
    "repeat_last_n": window_refusal,
    "penalty_last_n": window_refusal,
    "n_cmpl": lambda v, body, _: None if v is None or v == body.n else "use n",
    # OpenAI's: n samples of which the best n are returned; with as many as n, all of them (vLLM)
    "best_of": lambda v, body, _: None if _is(1)(v) or _is(body.n)(v) else "ask for n choices",
}
# A chat's own (vLLM); a text completion takes its `echo` and its prompt's special tokens as
# fields of its own.
_CHAT: dict[str, tuple[Callable[[Any], bool], str]] = {
    "add_special_tokens": (_is(False), "the chat template writes the special tokens"),
    "echo": (_is(False), "use a text completion with echo"),
    "documents": (_absent, "put the documents in a message"),
    "chat_template": (_absent, "start the server with --chat-template"),
    "mm_processor_kwargs": (_absent, _TEXT),
}
_TEXT_COMPLETION: dict[str, tuple[Callable[[Any], bool], str]] = {
    "add_special_tokens": (_is(True), "a text prompt gets the model's special tokens"),
    "post_sampling_probs": (
        _is(False),
        "this route's logprobs are OpenAI's lists: use /completion or a chat",
    ),
}
# OpenAI's /v1/completions alone (llama-server's /completion has no such field and ignores it)
_OPENAI_TEXT: dict[str, tuple[Callable[[Any], bool], str]] = {
    "suffix": (_absent, "fill-in-the-middle is /infill's, with input_prefix and input_suffix"),
    "max_completion_tokens": (lambda v: v is None, "a text completion's limit is max_tokens"),
}
# llama-server's own /completion: what it adds to its answer, or stops on, that this one does not.
_NATIVE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "verbose": (_is(False), "the answer has llama-server's fields only"),
}  # t_max_prompt_ms is not here: llama-server does not implement it either (a TODO), and ignores it
# /tokenize: text is llama-server's (and vLLM's, its parse_special read by the route), a chat
# gives the ids the chat route would use.
_TOKENIZE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "parse_special": (_is(True), "a chat's template writes its special tokens"),
}
_TABLES = {
    "chat": {**_BOTH, **_CHAT},
    "completion": {**_BOTH, **_TEXT_COMPLETION, **_OPENAI_TEXT},
    "native": {**_BOTH, **_TEXT_COMPLETION, **_NATIVE},
    "tokenize": _TOKENIZE,
    # /apply-template writes the prompt's text: only what changes that text counts
    "apply_template": {k: v for k, v in _CHAT.items() if k not in ("echo", "add_special_tokens")},
    "tokenize_chat": {
        **_TOKENIZE,
        **_CHAT,
        "add_special": (_is(False), "the chat template writes the special tokens"),
    },
}


def refuse_unsupported(
    extra: dict[str, Any] | None, *, route: str, sampling: Any = None, context: int | None = None
) -> None:
    """A 400 naming the first field of `extra` (a request's fields the server does not
    implement) that a peer honours on `route` (``chat``, ``completion``, ``native`` (llama-server's
    ``/completion``), ``tokenize`` of text, ``tokenize_chat``, ``apply_template``) and that is not at its neutral value. `sampling`, the
    request of a completion route, is what llama-server's ``samplers`` and ``repeat_last_n`` are
    read against (:mod:`~onnxsample.serve.llama_fields`), with the server's `context` (a
    penalties' window that long is the whole sequence)."""
    table = _TABLES[route]
    for name, value in (extra or {}).items():
        if name in table and not table[name][0](value):
            raise APIError(400, f"{name} is not supported ({table[name][1]})", param=name)
        check = _BY_REQUEST.get(name) if sampling is not None else None
        why = check(value, sampling, context) if check is not None else None
        if why is not None:
            raise APIError(400, f"{name} is not supported ({why})", param=name)
