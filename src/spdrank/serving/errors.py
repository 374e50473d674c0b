"""The error contract: every non-2xx answer is ``{"error": {message, type, param, code}}``.

:class:`ApiError` is what handlers raise; :func:`install_error_handlers` turns it, FastAPI's
own 404/405 and any unexpected bug into that one shape, counted by route and type;
:func:`batcher_errors` maps what the batcher raises onto it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from spdrank.serving.batcher import BatcherClosedError, InferenceError, QueueFullError
from spdrank.serving.gate import ROUTE_KEY, error_json
from spdrank.serving.metrics import ServerMetrics
from spdrank.serving.routes import route_label

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered as ``{"error": {message, type, param, code}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.headers = headers


@contextmanager
def batcher_errors() -> Iterator[None]:
    """Answer a full queue or a closing server with 503 (+ Retry-After), a failed inference
    with 500."""
    try:
        yield
    except QueueFullError as exc:
        raise ApiError(
            503, str(exc), "queue_full", headers={"Retry-After": str(exc.retry_after)}
        ) from None
    except BatcherClosedError as exc:
        raise ApiError(503, str(exc), "unavailable", headers={"Retry-After": "5"}) from None
    except InferenceError as exc:
        raise ApiError(500, f"inference failed: {exc}", "inference_error") from None


def install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Every error, including FastAPI's own 404/405 and unexpected bugs, as one JSON shape."""

    def respond(
        request: Request,
        status: int,
        message: str,
        kind: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> JSONResponse:
        route = request.scope.get(ROUTE_KEY) or route_label(request.url.path)
        metrics.errors.inc(route=route, type=kind)
        return JSONResponse(
            error_json(status, message, kind, param), status_code=status, headers=headers
        )

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return respond(request, exc.status, exc.message, exc.kind, exc.param, exc.headers)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        kinds = {404: "not_found", 405: "method_not_allowed"}
        message = f"{request.method} {request.url.path}: {exc.detail}"
        headers = dict(exc.headers) if exc.headers else None
        return respond(
            request,
            exc.status_code,
            message,
            kinds.get(exc.status_code, "http_error"),
            headers=headers,
        )

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return respond(request, 422, str(exc.errors()), "invalid_request")

    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return respond(request, 500, f"internal error: {type(exc).__name__}", "internal_error")

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, internal_error)
