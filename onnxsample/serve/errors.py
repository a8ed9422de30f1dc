"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every error a client can cause maps to a 4xx with a one-line message (the library's own, which names
the parameter and its allowed range); nothing a client sends reaches a 500, and no response carries
a traceback.
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from onnxsample.errors import (
    ContextExceeded,
    EngineClosed,
    GenerationError,
    InvalidParameter,
    ModelError,
    OnnxSampleError,
    OutOfMemory,
    QueueFull,
)


class ClientGone(Exception):
    """The client of a response that is not streamed went away before it was ready."""


log = logging.getLogger(__name__)

# The engine's names for what the API calls otherwise.
_PARAMS = {
    "max_new_tokens": "max_tokens",
    "prompt_logprobs": "logprobs",
    "the": "prompt",  # "the prompt is N tokens, which does not fit ..."
    "token": "prompt",  # "token ids must be integers in [0, V)"
    "a": "prompt",  # "a prompt is a string, ..."
    "each": "messages",  # "each chat message needs ..."
    "one": "response_format",  # "one output constraint per request, got ..."
    "invalid": "response_format",  # "invalid constraint: ...", "invalid JSON schema: ..."
    "structured": "response_format",  # "structured output (a constraint) needs ..."
    "this model": "messages",  # "this model has no chat template: ..."
    "the chat": "messages",  # "the chat template refused the messages: ..."
}
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    501: "not_supported_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error response: HTTP status, message, and optionally the parameter and a code."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
        extra: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers, self.extra = headers or {}, extra or {}


def error_body(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    extra: dict | None = None,
) -> dict:
    """OpenAI's error object: an answer's body, or a stream's last event; `extra` adds or
    replaces fields (llama-server's ``type`` and numbers for a prompt past the context)."""
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code or status,
            **(extra or {}),
        }
    }


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers=None,
    extra: dict | None = None,
) -> JSONResponse:
    body = error_body(status, message, param, code, extra)
    return JSONResponse(body, status_code=status, headers=headers)


# What the library's errors about a request's constraint name (its kind, or by _PARAMS)
_CONSTRAINT_WORDS = ("response_format", "json_schema", "regex", "choice", "grammar")


def name_fields(request: Request, constraint: str | None = None, **names: str) -> None:
    """What `request` calls the fields the library's errors name: `constraint` is the field its
    output constraint came from (:func:`~onnxsample.serve.structured.constraint_field`), and
    `names` others (a chat's ``prompt`` is its ``messages``). Its error answers name them so."""
    words = dict.fromkeys(_CONSTRAINT_WORDS, constraint) if constraint else {}
    request.state.names = {**words, **names}


def request_names(request: Request) -> dict[str, str]:
    """The names :func:`name_fields` gave `request`'s fields, if any."""
    return getattr(request.state, "names", {})


def from_library(exc: OnnxSampleError, names: dict[str, str] | None = None) -> APIError:
    """The HTTP face of a library error; `names` rename the parameter it names
    (:func:`name_fields`)."""
    message = " ".join(str(exc).split())
    if isinstance(exc, QueueFull):
        return APIError(429, message, code="queue_full", headers={"Retry-After": "1"})
    if isinstance(exc, InvalidParameter):
        message = message.replace("max_new_tokens", "max_tokens")  # the API's name for it
        words = re.match(r"([a-z_]+)(?: ([a-z_]+))?", message)
        param = None
        if words:  # the parameter a message starts with, or what its first words stand for
            first = words.group(1)
            param = _PARAMS.get(f"{first} {words.group(2)}", _PARAMS.get(first, first))
        param = (names or {}).get(param, param)
        if isinstance(exc, ContextExceeded):  # OpenAI's code; llama-server's type and numbers
            extra = {"type": "exceed_context_size_error", "n_prompt_tokens": exc.prompt_tokens,
                     "n_ctx": exc.context}  # fmt: skip
            return APIError(400, message, param, code="context_length_exceeded", extra=extra)
        return APIError(400, message, param=param)
    if isinstance(exc, (OutOfMemory, EngineClosed)):
        return APIError(503, message, code="unavailable")
    if isinstance(exc, (GenerationError, ModelError)):
        return APIError(500, message, code="generation_failed")
    return APIError(400, message)


# pydantic's names for a union's members in an error's location ('str', "literal['a','b']",
# 'function-after[...]'), which are no field of the request's
_MEMBER = re.compile(r"^(str|int|float|bool|list|dict|none|[a-z-]+\[.*\])$", re.S)


def _where(error: dict) -> list[str]:
    """An error's place in the request: its fields and indices, without a union's member names."""
    loc = [p for p in error.get("loc", ()) if p != "body"]
    return [str(p) for p in loc if not isinstance(p, str) or not _MEMBER.match(p)]


def invalid_body(errors: list[dict], content_type: str | None = None) -> tuple[str, str | None]:
    """The message and the field of a body that does not validate: its first error, with what
    else the same field would have taken (the other members of a union)."""
    first = errors[0] if errors else {}
    where = _where(first)
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    if not where and first.get("type") == "missing":
        return "the request body is empty: send a JSON object", None
    if not where and first.get("type") in ("model_attributes_type", "model_type", "dict_type"):
        json_type = (content_type or "").split(";")[0].strip().lower() == "application/json"
        sent = f" (Content-Type: application/json; got {content_type!r})"
        sent = "" if content_type is None or json_type else sent
        return f"the request body must be a JSON object{sent}", None
    path = ".".join(where)
    said = [first.get("msg", "invalid request")]
    for error in errors[1:]:  # a union's other members at the same field, or inside it
        other = _where(error)
        inner = ".".join(other[len(where) :])
        line = f"{inner}: {error.get('msg')}" if inner else error.get("msg")
        if other[: len(where)] == where and line not in said:
            said.append(line)
    detail = "; or ".join(said)
    return (f"{path}: {detail}" if path else detail), (where[0] if where else None)


# llama-server's names of OpenAI routes without /v1 (they read JSON bodies only, as those do)
_OPENAI_ALIASES = ("/chat/completions", "/models")


def install(app: FastAPI) -> None:
    """Every error the app can meet, answered in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api(_request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers, exc.extra)

    @app.exception_handler(OnnxSampleError)
    async def _library(request: Request, exc: OnnxSampleError) -> JSONResponse:
        err = from_library(exc, request_names(request))
        return error_response(err.status, err.message, err.param, err.code, err.headers, err.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # the OpenAI routes read JSON bodies only; llama-server's read any body as JSON
        openai_route = request.url.path.startswith("/v1/") or request.url.path in _OPENAI_ALIASES
        sent = request.headers.get("content-type") if openai_route else None
        message, param = invalid_body(list(exc.errors()), sent)
        return error_response(400, message, param=param)

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(ClientGone)
    @app.exception_handler(ClientDisconnect)  # gone before its body was read whole
    async def _gone(_request: Request, _exc: Exception) -> Response:
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it

    @app.exception_handler(Exception)
    async def _bug(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error_response(500, f"internal error: {type(exc).__name__}")
