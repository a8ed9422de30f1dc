"""ASGI middleware of the server: the Host check, cross-origin requests (CORS), the API key, the
request body limit (413) and the replica's name header."""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Iterable

from onnxsample.errors import InvalidParameter
from onnxsample.serve.errors import error_response

__all__ = [
    "LOOPBACK_HOSTS",
    "BodyLimit",
    "HostCheck",
    "KeyRequired",
    "ReplicaHeader",
    "cross_origin",
    "hosts_for",
    "origins_for",
]

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# What stays open with an API key: the liveness probe, the chat page and its files (the page asks
# for the key itself).
_OPEN = ("/health", "/static/")


def hosts_for(bind: str, extra: Iterable[str] = ()) -> frozenset[str] | None:
    """The Host names a server bound to `bind` answers: its own address and the loopback names
    (a web page that points its own domain at 127.0.0.1 — DNS rebinding — is refused), plus
    `extra`; None (any) when bound to every interface or when `extra` holds ``*``."""
    extra = {h.lower() for h in extra}
    if "*" in extra or bind in ("0.0.0.0", "::", ""):
        return None
    return frozenset({bind.lower(), *LOOPBACK_HOSTS, *extra})


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#]+")


def origins_for(values: Iterable[str]) -> frozenset[str] | None:
    """The web origins whose pages may call the server from a browser (CORS): `values` checked
    and lower-cased; None (any) when they hold ``*``; empty (the default): none but the server's
    own, whose chat page needs no CORS."""
    origins = {v.strip().lower() for v in values}
    if "*" in origins:
        return None
    for origin in sorted(origins):
        if not _ORIGIN.fullmatch(origin):
            raise InvalidParameter(
                f"the allowed origin {origin!r} is not an origin such as http://localhost:5173 "
                "(scheme://host[:port], no path) nor *"
            )
    return frozenset(origins)


def cross_origin(app, origins: frozenset[str] | None) -> None:
    """Answer browsers' cross-origin requests from `origins` (None: any), preflights included
    (before the API key, which a preflight never carries), as llama-server and vLLM do."""
    if origins is not None and not origins:
        return
    from starlette.middleware.cors import CORSMiddleware

    app.add_middleware(
        CORSMiddleware,
        allow_origins=["*"] if origins is None else sorted(origins),
        allow_methods=["*"],
        allow_headers=["*"],
    )


def _host_name(value: str) -> str:
    """`value` of a Host header without its port (``[::1]:8080`` -> ``::1``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.split(":")[0]
    return value


class HostCheck:
    """400 for a request whose Host header is not one this server answers (None: any)."""

    def __init__(self, app, allowed: frozenset[str] | None) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self.allowed is None:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        host = _host_name(headers.get(b"host", b"").decode("latin-1"))
        if host not in self.allowed and not _same_address(host, self.allowed):
            response = error_response(
                400, f"the Host header {host!r} is not one this server answers (--allowed-host)"
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _same_address(host: str, allowed: frozenset[str]) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(str(address) == a for a in allowed)


class KeyRequired:
    """401 (with ``WWW-Authenticate: Bearer``) for every route but the open ones without
    ``Authorization: Bearer <key>``: the API, /tokenize, /metrics, /docs and /openapi.json."""

    def __init__(self, app, key: str) -> None:
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path == "/" or path.startswith(_OPEN):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if secrets.compare_digest(headers.get(b"authorization", b""), self.expected):
            await self.app(scope, receive, send)
            return
        response = error_response(
            401,
            "a valid API key is needed: Authorization: Bearer <key>",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)


class BodyLimit:
    """413 for a body over `limit` bytes: by its Content-Length, or, for a chunked body, as it
    arrives (read up to the limit before the app sees it, then handed over as it came)."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.limit:
                await self._refuse(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        messages, seen = [], 0
        while True:
            message = await receive()
            messages.append(message)
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await self._refuse(scope, receive, send)
                return
            if message["type"] != "http.request" or not message.get("more_body"):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send) -> None:
        response = error_response(413, f"the request body is over {self.limit} bytes")
        await response(scope, receive, send)


class ReplicaHeader:
    """``x-onnxsample-replica: <name>`` on every response, streams included."""

    def __init__(self, app, name: str) -> None:
        self.app, self.header = app, (b"x-onnxsample-replica", name.encode())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, named)
