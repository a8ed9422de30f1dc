"""Between OpenAI's shapes and the engine's: sampling parameters in, choices, logprobs, usage and
llama-server-style timings out."""

from __future__ import annotations

import codecs
import math
import secrets
from collections.abc import Sequence
from typing import Any

from onnxsample.constraint import Constraint
from onnxsample.engine.request import Completion, StreamEvent, Timings, TopLogprobs
from onnxsample.errors import InvalidParameter
from onnxsample.params import SamplingParams
from onnxsample.serve.schemas import SamplingFields
from onnxsample.serve.structured import constraint_of
from onnxsample.text.tokenizer import Tokenizer

MAX_N = 32
_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "temperature_last",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}


def choice_params(
    body: SamplingFields,
    *,
    logprobs: bool = False,
    top_logprobs: int = 0,
    prompt_logprobs: int | None = None,
    tools: Constraint | None = None,
    post_sampling_probs: int | None = None,
) -> list[SamplingParams]:
    """One SamplingParams per choice (``n``), seeded seed, seed + 1, ...: the same request gives the
    same n choices every time. Without a seed, a random one stands in. `tools` is the constraint
    of a chat's tool calls (:mod:`onnxsample.serve.tools`)."""
    if not 1 <= body.n <= MAX_N:
        raise InvalidParameter(f"n must be in [1, {MAX_N}], got {body.n}")
    values = {name: getattr(body, name) for name in _FIELDS if getattr(body, name) is not None}
    if values.get("top_k") == -1 and type(values["top_k"]) is int:
        values["top_k"] = 0  # vLLM's and llama-server's "no top-k" as well as 0
    bias = {}
    for key, value in (body.logit_bias or {}).items():
        try:
            bias[int(key)] = value
        except ValueError:
            raise InvalidParameter(f"logit_bias keys must be token ids, got {key!r}") from None
    constraint = constraint_of(body)
    if tools is not None and constraint is not None:
        raise InvalidParameter(
            "tools (with tool_choice other than none) constrain the answer already: they cannot "
            "be combined with response_format or another output constraint"
        )
    constraint = constraint or tools
    # a random base below 2**53 - n: every choice's seed, reported in JSON, survives a double
    base = body.seed if body.seed is not None else secrets.randbits(53) % (2**53 - body.n)
    choices = []
    for i in range(body.n):
        params = SamplingParams(
            **values,
            logit_bias=bias,
            seed=(base + i) % 2**64 if 0 <= base < 2**64 else base,  # out of range: refused
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            prompt_logprobs=prompt_logprobs,
            post_sampling_probs=post_sampling_probs,
            ignore_eos=body.ignore_eos,
            min_tokens=body.min_tokens,
            constraint=constraint,
        )
        choices.append(params.validate())
    return choices


def prompts(prompt: Any) -> list:
    """The prompt forms of the completions APIs (OpenAI's and llama-server's): a string, strings,
    token ids, lists of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InvalidParameter("prompt must not be empty")
    if all(isinstance(p, int) for p in prompt):
        return [prompt]
    return list(prompt)


def mixed_ids(
    tokenizer: Tokenizer, parts: str | list, *, add_special: bool = True, parse_special: bool = True
) -> list:
    """llama-server's prompt of text and token ids together (``[12, " cat", 34]``; its
    ``tokenize_mixed``) as ids: each text tokenised in place, the special tokens (BOS, as the model
    adds it) only where the prompt begins with text. Ids are left as they are, for the caller to
    check."""
    ids: list = []
    for i, part in enumerate([parts] if isinstance(parts, str) else parts):
        if type(part) is not str:
            ids.append(part)
            continue
        special = add_special and i == 0
        ids += tokenizer.encode(part, add_special_tokens=special, parse_special=parse_special)
    return ids


def token_limit(value: int | None, default: int | None) -> int | None:
    """A request's ``max_tokens``: `default` when absent; llama-server's -1 (what its web UI sends
    for "no limit") as no limit, until the end of the sequence or the context."""
    if value is None:
        return default
    return None if value == -1 else value


def usage(completions: Sequence[Completion], prompts: Sequence[list[int]]) -> dict:
    """OpenAI's usage: each prompt counted once (n choices share it), every choice's tokens."""
    completion_tokens = sum(predicted(c) for c in completions)
    prompt_tokens = sum(len(p) for p in prompts)
    cached = {}
    for c in completions:  # the best reuse any choice of a prompt had
        key = tuple(c.prompt_token_ids)
        cached[key] = max(cached.get(key, 0), c.timings.cached_tokens)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(cached.values())},
    }


def timings(completion: Completion, *, score_only: bool = False) -> dict:
    """llama-server's ``timings`` object for one choice; with `score_only` (echo with max_tokens
    0) the token drawn after the prompt is not part of the answer, so nothing was predicted."""
    return _timings(completion.timings, 0 if score_only else predicted(completion))


def predicted(completion: Completion) -> int:
    """The tokens a choice generated, as vLLM's usage and llama-server's ``predicted_n`` count
    them: the end-of-sequence token that ended it is one."""
    return len(completion.token_ids) + (completion.end_token is not None)


def end_entry(completion: Completion) -> tuple[list[int], list[float], list[TopLogprobs]]:
    """The end-of-sequence token that finished a choice, its logprob and its alternatives, as
    one more position of its logprobs (vLLM and llama-server list it last, and usage counts it);
    nothing when no such token ended it or no logprobs were asked for."""
    if completion.end_token is None or completion.end_logprob is None:
        return [], [], []
    return [completion.end_token], [completion.end_logprob], [completion.end_top_logprobs or []]


def event_timings(event: StreamEvent) -> dict:
    """llama-server's ``timings`` when a streamed token came (its ``timings_per_token``)."""
    if event.completion is not None:
        return timings(event.completion)
    assert event.timings is not None
    return _timings(event.timings, event.timings.generated_tokens)


def _timings(t: Timings, predicted: int) -> dict:
    """As llama-server's: a rate without steps is 0, the first token (from the prompt's call)
    is no decode step, and speculative decoding adds the drafted and accepted counts."""
    computed = t.prompt_tokens - t.cached_tokens
    decoded = max(predicted - 1, 0)
    drafted = (
        {"draft_n": t.draft_tokens, "draft_n_accepted": t.accepted_tokens} if t.draft_tokens else {}
    )
    return {
        "cache_n": t.cached_tokens,
        "prompt_n": computed,
        "prompt_ms": round(t.prefill_s * 1000, 3),
        "prompt_per_token_ms": round(t.prefill_s * 1000 / computed, 3) if computed else 0.0,
        "prompt_per_second": round(computed / t.prefill_s, 2) if t.prefill_s else 0.0,
        "predicted_n": predicted,
        "predicted_ms": round(t.decode_s * 1000, 3),
        "predicted_per_token_ms": round(t.decode_s * 1000 / decoded, 3) if decoded else 0.0,
        "predicted_per_second": round(decoded / t.decode_s, 2) if t.decode_s else 0.0,
        **drafted,
        "ttft_ms": round(t.ttft_s * 1000, 3),
    }


def _text(tokenizer: Tokenizer, token: int) -> str:
    """A token's own text (its bytes, an unfinished UTF-8 character as U+FFFD)."""
    return tokenizer.token_bytes(token).decode("utf-8", errors="replace")


def _entry(tokenizer: Tokenizer, token: int, logprob: float) -> dict:
    raw = tokenizer.token_bytes(token)
    return {
        "token": raw.decode("utf-8", errors="replace"),
        "logprob": logprob,
        "bytes": list(raw),
    }


def chat_logprobs(
    tokenizer: Tokenizer,
    tokens: Sequence[int],
    logprobs: Sequence[float],
    tops,
    *,
    post_sampling: bool = False,
) -> list[dict]:
    """``logprobs.content``: each token's text, logprob, bytes and top alternatives;
    `post_sampling`: the final distribution's, in llama-server's form
    (:func:`post_sampling_entry`)."""
    content = []
    for i, (token, lp) in enumerate(zip(tokens, logprobs, strict=False)):
        entry = _entry(tokenizer, token, lp)
        alternatives: TopLogprobs = tops[i] if tops is not None and i < len(tops) else []
        entry["top_logprobs"] = [_entry(tokenizer, t, v) for t, v in alternatives]
        if post_sampling:
            entry = post_sampling_entry({"id": token, **entry}, [t for t, _ in alternatives])
        content.append(entry)
    return content


def post_sampling_entry(entry: dict, ids: Sequence[int]) -> dict:
    """A token's logprobs `entry` (``id``, ``token``, ``bytes``, ``logprob``, ``top_logprobs``)
    as llama-server writes it for ``post_sampling_probs``: probabilities (``prob``, ``top_probs``),
    each alternative with its id (`ids`)."""
    tops = entry.pop("top_logprobs")
    entry["prob"] = math.exp(entry.pop("logprob"))
    entry["top_probs"] = [
        {"id": t, "token": a["token"], "bytes": a["bytes"], "prob": math.exp(a["logprob"])}
        for t, a in zip(ids, tops, strict=True)
    ]
    return entry


class TextOffsets:
    """Where each token's text begins, in characters of the text the tokens' bytes spell (from
    `start`), token after token: a token that ends a character the one before began begins where
    that character does."""

    def __init__(self, tokenizer: Tokenizer, start: int = 0) -> None:
        self._tokenizer, self.chars = tokenizer, start
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def __call__(self, tokens: Sequence[int]) -> list[int]:
        offsets = []
        for token in tokens:
            offsets.append(self.chars)
            self.chars += len(self._decoder.decode(self._tokenizer.token_bytes(token)))
        return offsets


def legacy_logprobs(
    tokenizer: Tokenizer,
    tokens: Sequence[int],
    logprobs: Sequence[float | None],
    tops: Sequence[TopLogprobs | None],
    offsets: TextOffsets | None = None,
) -> dict:
    """The completions API's ``tokens`` / ``token_logprobs`` / ``top_logprobs`` / ``text_offset``
    (`offsets` goes on from the tokens before, in a stream).

    As OpenAI's legacy API (and vLLM): a position's ``top_logprobs`` holds the most likely tokens
    and always the chosen one, so up to logprobs + 1 entries (with ``logprobs: 0``, the chosen
    token alone), the chosen one's under its text where another token's text is the same (bytes
    of an unfinished character read as U+FFFD); a position without a logprob (a prompt's first
    token) has none."""
    texts = [_text(tokenizer, t) for t in tokens]
    top_dicts: list[dict | None] = []
    for text, logprob, top in zip(texts, logprobs, tops, strict=True):
        if logprob is None:
            top_dicts.append(None)
            continue
        top_dicts.append({**{_text(tokenizer, t): v for t, v in top or []}, text: logprob})
    return {
        "tokens": texts,
        "token_logprobs": list(logprobs),
        "top_logprobs": top_dicts,
        "text_offset": (offsets or TextOffsets(tokenizer))(tokens),
    }
