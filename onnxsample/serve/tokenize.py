"""``/tokenize``: llama-server's text (``content``, text or text and ids mixed, ``add_special``,
``parse_special``, ``with_pieces``), vLLM's text
(``prompt``, ``add_special_tokens``, ``return_token_strs``) and vLLM's chat (``messages`` with
``tools``, ``tool_choice``, ``chat_template_kwargs`` and ``reasoning_effort``), whose ids are those
the chat route gives the engine for the same chat, so ``count`` is the chat's ``prompt_tokens``.
``/apply-template``: llama-server's text of a chat."""

from __future__ import annotations

from onnxsample.errors import InvalidParameter
from onnxsample.serve import convert, tools
from onnxsample.serve.errors import APIError
from onnxsample.serve.peer_fields import refuse_unsupported
from onnxsample.serve.schemas import ChatPromptFields, ChatRequest, TokenizeRequest
from onnxsample.text.tokenizer import Tokenizer

__all__ = ["applied_template", "tokenized"]


def tokenized(tokenizer: Tokenizer, body: TokenizeRequest, limit: int, vocab_size: int) -> dict:
    """The answer to `body`: ``tokens`` (``{"id", "piece"}`` objects with ``with_pieces``, as
    llama-server writes them), ``count``, ``max_model_len`` and, with ``return_token_strs``,
    ``token_strs`` (the vocabulary's own strings, as vLLM writes them).

    Text gets the model's special tokens (BOS) as its server adds them by default: none for
    llama-server's ``content``, the tokenizer's for vLLM's ``prompt``; ``add_special`` or
    ``add_special_tokens`` says otherwise. A chat takes none beyond what its template writes."""
    _check_one_prompt(body)
    if body.messages is not None:
        special = {"add_special": body.add_special, "add_special_tokens": body.add_special_tokens}
        refuse_unsupported({**(body.model_extra or {}), **special}, route="tokenize_chat")
        ids = _chat_ids(tokenizer, body)
    else:
        extra = dict(body.model_extra or {})
        parse = extra.pop("parse_special", True)  # llama-server's; a chat's template writes them
        if not isinstance(parse, bool):
            raise APIError(400, f"parse_special must be a boolean, got {parse!r}", "parse_special")
        refuse_unsupported(extra, route="tokenize")
        text = body.content if body.content is not None else body.prompt
        if text is None:
            raise InvalidParameter("content: give the text to tokenise (or messages)")
        ids = convert.mixed_ids(tokenizer, text, add_special=_adds_special(body),
                                parse_special=parse)  # fmt: skip
        if bad := [i for i in ids if not 0 <= i < vocab_size]:  # the model's, as /detokenize
            raise InvalidParameter(f"token ids must be in [0, {vocab_size}), got {bad[0]}")
    answer: dict = {"tokens": ids, "count": len(ids), "max_model_len": limit}
    if body.with_pieces:
        answer["tokens"] = [{"id": i, "piece": _piece(tokenizer.token_bytes(i))} for i in ids]
    if body.return_token_strs:
        answer["token_strs"] = [tokenizer.piece(i) for i in ids]
    return answer


def applied_template(tokenizer: Tokenizer, body: ChatRequest) -> dict:
    """llama-server's ``/apply-template`` answer to a chat request: ``{"prompt": text}``, the text
    the chat route tokenises, less a BOS the template writes where the vocabulary adds one when
    it tokenises (and an EOS it writes last where the vocabulary adds that), as llama-server
    strips them. That text, tokenised with the model's special tokens (a text completion's
    default), gives llama-server's ids for the chat."""
    refuse_unsupported(body.model_extra, route="apply_template")
    tools.check_text_only(body)
    native = tools.native_format(tokenizer)
    text = tools.chat_text(tokenizer, body, native, tools.plan_tools(body, native))
    added = tokenizer.encode("", add_special_tokens=True)
    if added[:1] == [tokenizer.bos_token_id]:
        text = text.removeprefix(tokenizer.token_to_text(added.pop(0)))
    if added[-1:] == [tokenizer.eos_token_id]:
        text = text.removesuffix(tokenizer.token_to_text(added[-1]))
    return {"prompt": text}


def _chat_ids(tokenizer: Tokenizer, body: TokenizeRequest) -> list[int]:
    prompt_fields = {name: getattr(body, name) for name in ChatPromptFields.model_fields}
    chat = ChatRequest(messages=body.messages, **prompt_fields)
    tools.check_text_only(chat)
    native = tools.native_format(tokenizer)
    prompt = tools.chat_prompt(tokenizer, chat, native, tools.plan_tools(chat, native))
    if prompt and isinstance(prompt[0], dict):
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
    return prompt


def _check_one_prompt(body: TokenizeRequest) -> None:
    """A 400 for what one prompt form would leave unread: two prompts, or a chat's fields with
    text."""
    given = [n for n in ("messages", "content", "prompt") if getattr(body, n) is not None]
    if len(given) > 1:
        raise APIError(
            400, f"give one of messages, content or prompt, not {given[1]} too", given[1]
        )
    if body.messages is None:
        for name in ChatPromptFields.model_fields:
            if getattr(body, name) is not None:
                raise APIError(400, f"{name} applies to a chat: send messages", name)


def _adds_special(body: TokenizeRequest) -> bool:
    given = {v for v in (body.add_special, body.add_special_tokens) if v is not None}
    if len(given) > 1:
        raise APIError(400, "add_special and add_special_tokens disagree: give one", "add_special")
    return given.pop() if given else body.content is None


def _piece(raw: bytes) -> str | list[int]:
    """A token's bytes as llama-server's ``with_pieces`` writes them: text where they are whole
    UTF-8, else the byte values."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)
