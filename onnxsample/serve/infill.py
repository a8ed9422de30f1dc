"""llama-server's code-infill endpoint, ``POST /infill`` (fill-in-the-middle), as editors call it
(llama.vim, llama.vscode).

The request is a ``/completion`` request whose prompt is built from ``input_prefix`` and
``input_suffix`` (text, or a list of token ids and texts), ``input_extra`` (other files' chunks,
``{"filename", "text"}``) and ``prompt`` (text that continues the prefix), with the model's FIM
tokens (:func:`~onnxsample.text.llama_tokens.fim_tokens`), exactly as llama-server builds it
(``format_prompt_infill``):

    [extra: <repo>myproject\\n <file_sep>filename\\n text ... <file_sep>filename\\n]
    [BOS] <fim_prefix> prefix prompt <fim_suffix> suffix <fim_middle>

The prefix keeps its last ``3 * batch / 4`` tokens and the suffix its first ``batch / 4 - 2 -
len(prompt)``, ``batch`` being llama-server's default ``--batch-size`` (2048); the extra chunks
keep their last ``context - batch + 2`` tokens (llama-server's default ``n_predict`` of -1 counted
twice). Texts are tokenised without parsing special tokens (code may contain them), the
``prompt`` with. A chunk without a file separator token is preceded by llama-server's
``--- snippet ---`` line. A model without the prefix, suffix and middle tokens answers 501, as
llama-server does. The answer is ``/completion``'s.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import Any

from onnxsample.engine import Engine
from onnxsample.params import SamplingParams
from onnxsample.serve.errors import APIError
from onnxsample.serve.infill_sampler import InfillSampler
from onnxsample.text import Tokenizer
from onnxsample.text.llama_tokens import FimTokens, end_of_turn, fim_tokens

__all__ = ["BATCH", "infill_body", "infill_tokens", "with_infill_sampler"]

BATCH = 2048  # llama-server's default --batch-size, which sizes the prefix and suffix kept
_REPO, _FILE, _SNIPPET = "myproject\n", "filename\n", "\n\n--- snippet ---\n\n"
_FIELDS = ("input_prefix", "input_suffix", "input_extra")


def _mixed(tokenizer: Tokenizer, value: Any, name: str) -> list[int]:
    """llama-server's ``tokenize_mixed``: text, or a list of token ids and texts, without BOS and
    without parsing special tokens."""
    parts = value if isinstance(value, list) else [value]
    ids: list[int] = []
    for part in parts:
        if isinstance(part, str):
            ids += tokenizer.encode(part, add_special_tokens=False, parse_special=False)
        elif isinstance(part, int) and not isinstance(part, bool):
            if not 0 <= part < tokenizer.vocab_size:
                raise APIError(400, f"{name}: token {part} is not in the vocabulary", param=name)
            ids.append(part)
        else:
            raise APIError(400, f"{name} is text or a list of token ids and texts", param=name)
    return ids


def _chunks(value: Any) -> list[tuple[str, str]]:
    """``input_extra`` as (filename, text) pairs (the filename defaults to ``tmp``)."""
    shape = 'an array of {"filename": string, "text": string}'
    if value is None:
        return []
    if not isinstance(value, list):
        raise APIError(400, f"input_extra must be {shape}", param="input_extra")
    chunks = []
    for chunk in value:
        text = chunk.get("text") if isinstance(chunk, dict) else None
        name = chunk.get("filename", "tmp") if isinstance(chunk, dict) else None
        if not isinstance(text, str) or not isinstance(name, str):
            raise APIError(400, f"input_extra must be {shape}, got {chunk!r}", param="input_extra")
        chunks.append((name, text))
    return chunks


def infill_tokens(
    tokenizer: Tokenizer,
    fim: FimTokens,
    prefix: list[int],
    suffix: list[int],
    extra: list[tuple[str, str]],
    prompt: list[int],
    context: int,
    batch: int = BATCH,
) -> list[int]:
    """The prompt llama-server's ``format_prompt_infill`` makes (prefix-suffix-middle order) of
    tokenised `prefix`, `suffix` and `prompt`, the `extra` chunks and a slot of `context`
    positions."""

    def plain(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False, parse_special=False)

    before: list[int] = []
    if fim.rep is not None:
        before += [fim.rep, *plain(_REPO)]
    for name, text in extra:
        before += [fim.sep, *plain(name + "\n")] if fim.sep is not None else plain(_SNIPPET)
        before += plain(text)
    if fim.sep is not None:
        before += [fim.sep, *plain(_FILE)]
    keep_prefix = min(len(prefix), 3 * (batch // 4))
    keep_suffix = min(len(suffix), max(0, batch // 4 - (2 + len(prompt))))
    keep_extra = min(max(0, context - batch + 2), len(before))
    head = [fim.pre, *prefix[len(prefix) - keep_prefix :], *prompt]
    if tokenizer.adds_bos:
        head.insert(0, tokenizer.bos_token_id)
    return [
        *before[len(before) - keep_extra :],
        *head,
        fim.suf,
        *suffix[:keep_suffix],
        fim.mid,
    ]


def infill_body(tokenizer: Tokenizer, context: int, data: Any) -> dict:
    """An ``/infill`` request as the ``/completion`` request it stands for: its ``prompt`` the
    token ids :func:`infill_tokens` makes; :class:`APIError` for a model without FIM tokens
    (501) or a malformed field (400)."""
    fim = fim_tokens(tokenizer)
    if missing := fim.missing():
        message = "Infill is not supported by this model: " + "".join(missing)
        raise APIError(501, message)
    if not isinstance(data, dict):
        raise APIError(400, "the body is a JSON object")
    for name in _FIELDS[:2]:
        if name not in data:
            raise APIError(400, f'"{name}" is required', param=name)
    prompt = data.get("prompt", "")
    if not isinstance(prompt, str):
        raise APIError(400, '"prompt" must be a string', param="prompt")
    tokens = infill_tokens(
        tokenizer,
        fim,
        _mixed(tokenizer, data["input_prefix"], "input_prefix"),
        _mixed(tokenizer, data["input_suffix"], "input_suffix"),
        _chunks(data.get("input_extra")),
        tokenizer.encode(prompt, add_special_tokens=False),
        context,
    )
    body = {k: v for k, v in data.items() if k not in _FIELDS}
    body["prompt"] = tokens
    return body


def with_infill_sampler(engine: Engine, params: list[SamplingParams]) -> list[SamplingParams]:
    """`params` with llama.cpp's ``infill`` sampler as their host sampler, for a request whose
    ``samplers`` lists it last. It picks from the graph's candidates, so the served model must
    have been composed with them (``serve --candidates K``, which draft tokens exclude) and the
    request's top-k must keep at most K. A greedy request needs none of it: of the one token greedy
    decoding leaves, the sampler keeps that token."""
    k = engine.meta.output_candidates
    tokenizer = engine.tokenizer
    special = tokenizer.special_ids
    end = end_of_turn(tokenizer)
    end = tokenizer.eos_token_id if end is None else end

    def piece(token: int) -> bytes:
        return b"" if token in special else tokenizer.token_bytes(token)

    chosen = []
    for p in params:
        if p.temperature == 0:
            chosen.append(p)
            continue
        if not k:
            raise APIError(
                400,
                "samplers: the infill sampler picks from the graph's candidates: serve the model "
                "with them (onnxsample serve MODEL --candidates 64)",
                param="samplers",
            )
        if not 0 < p.top_k <= k:
            raise APIError(
                400,
                f"top_k must be in [1, {k}] (the model's candidates) for the infill sampler, "
                f"got {p.top_k}",
                param="top_k",
            )
        seed = p.seed if p.seed is not None else secrets.randbits(64)
        sampler = InfillSampler(piece, engine.info.eos_ids, end, seed)
        chosen.append(replace(p, host_sampler=sampler))
    return chosen
