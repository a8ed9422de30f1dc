"""ASGI middleware of the server: the request body limit (413) and the replica's name header."""

from __future__ import annotations

from onnxsample.serve.errors import error_response

__all__ = ["BodyLimit", "ReplicaHeader"]


class BodyLimit:
    """413 for a body over `limit` bytes, by its Content-Length or as it arrives."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope, receive, send) -> None:
        response = error_response(413, f"the request body is over {self.limit} bytes")
        await response(scope, receive, send)


class _TooLarge(Exception):
    pass


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
