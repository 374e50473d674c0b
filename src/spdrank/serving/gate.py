"""The ASGI middleware every request passes first: API key, body size limit and deadline,
timing, counting.

Pure ASGI rather than Starlette's ``BaseHTTPMiddleware``, so it can refuse an over-large
body while reading it (a chunked upload has no Content-Length to check), refuse a request
without the API key before reading its body at all, and so the 401, 408 and 413 it sends are
counted and timed like any other response.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spdrank.serving.auth import authorized, is_open
from spdrank.serving.metrics import ServerMetrics
from spdrank.serving.routes import route_label

START_KEY = "spdrank.start"
ROUTE_KEY = "spdrank.route"


def error_json(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """The one error shape every non-2xx response uses."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class Gate:
    """Checks the API key (401), reads the body up to ``max_body_bytes`` (413 past it) within
    ``body_timeout`` seconds (408 past it), then times and counts the request."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        metrics: ServerMetrics,
        body_timeout: float = 30.0,
        api_key: str | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.body_timeout = body_timeout
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        route = route_label(scope.get("path", ""))
        scope[START_KEY] = start
        scope[ROUTE_KEY] = route
        status: list[int] = []

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            if not self._authorized(scope):
                await self._refuse(scope, receive, send_counted, route)
                return
            try:
                body = await asyncio.wait_for(self._read_body(scope, receive), self.body_timeout)
            except asyncio.TimeoutError:
                await self._too_slow(scope, receive, send_counted, route)
                return
            if body is None:
                await self._too_large(scope, receive, send_counted, route)
                return
            if body is _DISCONNECTED:
                status.append(499)  # nginx's "client closed request": nothing was sent
                return
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send_counted)
        finally:
            code = status[0] if status else 500
            self.metrics.requests.inc(route=route, status=str(code))
            self.metrics.latency.observe(time.perf_counter() - start, route=route)

    async def _read_body(self, scope: Scope, receive: Receive) -> Any:
        """The whole body; None when it exceeds the limit; _DISCONNECTED if the client left.

        An over-large body is still read to its end (up to :data:`DRAIN_FACTOR` times the
        limit) and dropped: closing the connection on a client still uploading resets it, and
        the client then sees a broken connection instead of the 413 that says why.
        """
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    if int(value) > self.max_body_bytes:
                        await _drain(receive, DRAIN_FACTOR * self.max_body_bytes)
                        return None
                except ValueError:
                    pass
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _DISCONNECTED
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                if message.get("more_body", False):
                    await _drain(receive, DRAIN_FACTOR * self.max_body_bytes)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _authorized(self, scope: Scope) -> bool:
        """Whether the request may go on: no key is set, its path is open, or it has the key."""
        return (
            self.api_key is None
            or is_open(scope.get("path", ""))
            or authorized(scope.get("headers", ()), self.api_key)
        )

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, route: str) -> None:
        message = f"the request body is larger than the limit of {self.max_body_bytes} bytes"
        await self._close_with(scope, receive, send, route, 413, message, "body_too_large")

    async def _too_slow(self, scope: Scope, receive: Receive, send: Send, route: str) -> None:
        message = f"the request body did not arrive within {self.body_timeout:g} s"
        await self._close_with(scope, receive, send, route, 408, message, "body_timeout")

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, route: str) -> None:
        has_header = any(name == b"authorization" for name, _ in scope.get("headers", ()))
        message = (
            "the API key is not valid"
            if has_header
            else "this server needs an API key: send 'Authorization: Bearer <key>'"
        )
        await self._close_with(
            scope, receive, send, route, 401, message, "unauthorized",
            {"WWW-Authenticate": "Bearer"},
        )

    async def _close_with(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: str,
        status: int,
        message: str,
        kind: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer ``status`` in the error shape and close the connection: the body may not
        have been read to its end, so the connection cannot carry another request."""
        self.metrics.errors.inc(route=route, type=kind)
        response = JSONResponse(
            error_json(status, message, kind),
            status_code=status,
            headers={"Connection": "close", **(headers or {})},
        )
        await response(scope, receive, send)


_DISCONNECTED = object()

#: How much of an over-large body is read (and dropped) before the 413, as a multiple of the
#: limit: a client sending more than that has its connection closed mid-upload.
DRAIN_FACTOR = 16


async def _drain(receive: Receive, limit: int) -> None:
    """Read and drop the rest of the request body, up to ``limit`` bytes."""
    drained = 0
    while drained <= limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        drained += len(message.get("body", b""))
        if not message.get("more_body", False):
            return
