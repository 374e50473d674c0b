"""The FastAPI application: rerank and rank endpoints over one micro-batched model.

:func:`create_app` only assembles: the engine under the settings' batch policy, the batcher
that feeds it, the gate, the error contract (``errors.py``), the routes (requests become
slates in ``intake.py``, answers are built in ``replies.py``) and the OpenAPI document
(``openapi.py``), and the documentation pages, whose scripts and styles are served from
the ``fastapi-offline`` package rather than a CDN. Every request is validated completely on
the event loop before it is queued; inference happens only in the batcher's worker thread,
and a request whose client disconnects while it waits is taken out of the queue. The error
contract is in docs/serving.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline

from spdrank import __version__
from spdrank.serving.batcher import Done, MicroBatcher
from spdrank.serving.engine import Admitted, Engine, Ranked
from spdrank.serving.errors import ApiError, batcher_errors, install_error_handlers
from spdrank.serving.gate import Gate
from spdrank.serving.intake import admit, json_body, rerank_request, rerank_slate, slate_body
from spdrank.serving.metrics import CONTENT_TYPE, ServerMetrics
from spdrank.serving.openapi import ERROR_RESPONSES, RANK_BODY, RERANK_BODY, install_openapi
from spdrank.serving.policy import collector_limits
from spdrank.serving.replies import rank_reply, rerank_reply
from spdrank.serving.routes import (
    DOCS_ASSETS_PATH,
    DOCS_PATH,
    HEALTH_PATH,
    METRICS_PATH,
    MODELS_PATH,
    OPENAPI_PATH,
    RANK_PATH,
    REDOC_PATH,
    RERANK_PATHS,
)
from spdrank.serving.schemas import RerankResponse
from spdrank.serving.settings import ServeSettings

if TYPE_CHECKING:
    from spdrank.model.ranker import SPDRanker

__all__ = ["ApiError", "ServeSettings", "create_app"]

log = logging.getLogger(__name__)

Batcher = MicroBatcher[Admitted, Ranked]
T = TypeVar("T")


def create_app(
    model: SPDRanker | Engine,
    settings: ServeSettings | None = None,
    name: str | None = None,
    api_key: str | None = None,
) -> FastAPI:
    """The app serving ``model`` (an SPDRanker, or an Engine wrapping one) under ``name``.

    The settings' batch policy is applied to the engine (``auto`` resolved for its device).
    With ``api_key``, every route but the open ones (:func:`spdrank.serving.auth.is_open`)
    needs ``Authorization: Bearer <api_key>``.
    """
    settings = settings or ServeSettings()
    engine = model if isinstance(model, Engine) else Engine(model, name or model.name)
    engine.use_policy(settings.batch_policy, settings.max_padding)
    engine.use_windows(settings.window, settings.window_stride, settings.max_documents)
    metrics = ServerMetrics()
    max_batch_size, max_wait_ms = collector_limits(
        engine.policy, settings.max_batch_size, settings.max_wait_ms
    )
    batcher: Batcher = MicroBatcher(
        engine.rank,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        max_queue=settings.max_queue,
        metrics=metrics,
        parts=engine.rank_parts,
    )
    app = FastAPIOffline(
        title="spdrank",
        version=__version__,
        description="Single-pass generative reranking. Cohere/vLLM/Jina-compatible `/v1/rerank`, "
        'spdrank slates on `/v1/rank`. Errors: `{"error": {message, type, param, code}}`.',
        lifespan=_lifespan(engine, batcher, settings, max_wait_ms),
        docs_url=DOCS_PATH,
        redoc_url=REDOC_PATH,
        openapi_url=OPENAPI_PATH,
        static_url=DOCS_ASSETS_PATH,
    )
    app.state.engine = engine
    app.state.batcher = batcher
    app.state.metrics = metrics
    app.state.settings = settings
    app.add_middleware(
        Gate,
        max_body_bytes=settings.max_body_bytes,
        metrics=metrics,
        body_timeout=settings.body_timeout,
        api_key=api_key,
    )
    install_error_handlers(app, metrics)
    _add_ranking_routes(app, engine, batcher)
    _add_status_routes(app, engine, batcher, metrics)
    install_openapi(app, bearer=api_key is not None)
    return app


def served_sizes(engine: Engine) -> str:
    """What the startup line says of a request's size: a model ranks K documents in one pass,
    and with sliding windows up to ``--max-documents``; two numbers the log must not mix."""
    k = int(engine.model.config.head.positions)
    if engine.windows is None:
        return f"at most {k} documents a request, in one pass"
    return (f"at most {engine.max_documents} documents a request (--max-documents), those "
            f"over {k} by sliding windows of {engine.windows.window} (--window)")


def _lifespan(
    engine: Engine, batcher: Batcher, settings: ServeSettings, max_wait_ms: float
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start the batcher with the app (saying what is served, and how), stop it after."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        log.info(
            "serving %s (K=%d, %s, device %s): batches of up to %d, %.1f ms wait, queue %d, "
            "batch policy %s (%s)",
            engine.name,
            engine.model.config.head.positions,
            served_sizes(engine),
            engine.device,
            batcher.max_batch_size,
            max_wait_ms,
            settings.max_queue,
            engine.policy,
            settings.batch_policy,
        )
        try:
            yield
        finally:
            await batcher.stop()

    return lifespan


def _add_ranking_routes(app: FastAPI, engine: Engine, batcher: Batcher) -> None:
    """``POST /v1/rerank`` (and its aliases) and ``POST /v1/rank``: each turns its body into a
    slate (intake), queues it, and answers with its ranking (replies)."""

    async def submit(request: Request, admitted: Admitted) -> Done[Ranked]:
        with batcher_errors():
            return await until_disconnected(request, batcher.submit(admitted))

    async def rerank(request: Request) -> JSONResponse:
        req = rerank_request(await json_body(request), engine)
        done = await submit(request, rerank_slate(req, engine))
        return JSONResponse(rerank_reply(req, engine.name, request, done))

    for path in RERANK_PATHS:
        app.add_api_route(
            path,
            rerank,
            methods=["POST"],
            summary="Rerank documents for a query (Cohere / vLLM / Jina compatible)",
            response_model=None,
            responses={200: {"model": RerankResponse}, **ERROR_RESPONSES},
            openapi_extra=RERANK_BODY,
            operation_id="rerank_" + path.strip("/").replace("/", "_"),
        )

    @app.post(
        RANK_PATH,
        summary="Rank one slate in spdrank's JSON format; returns its result record",
        responses=ERROR_RESPONSES,
        openapi_extra=RANK_BODY,
    )
    async def rank(request: Request) -> JSONResponse:
        admitted = admit(slate_body(await json_body(request)), engine)
        done = await submit(request, admitted)
        return JSONResponse(rank_reply(admitted.slate, request, done))


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result; if the client disconnects first, ``work`` is cancelled (a batcher
    submit then leaves the queue) and the request ends with 499 ``client_closed``, which
    only the metrics see.

    The request's body has been read, so what its ASGI channel delivers next is the
    disconnect: the server's (uvicorn's) when the client closes, or half-closes, its side.
    """
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise ApiError(
        499, "the client disconnected before its answer was ready", "client_closed"
    )


async def _disconnect(request: Request) -> None:
    """Return once the client of ``request`` (its body already read) has gone."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _add_status_routes(
    app: FastAPI, engine: Engine, batcher: Batcher, metrics: ServerMetrics
) -> None:
    """What operators and clients ask of the server itself: liveness, the model, metrics."""

    @app.get(HEALTH_PATH, summary="Liveness: 200 while the server accepts work")
    async def healthz() -> JSONResponse:
        body = {
            "status": "ok",
            "model": engine.name,
            "max_documents": engine.max_documents,
            "device": engine.device,
            "batch_policy": engine.policy,
            "queue_depth": batcher.pending,
        }
        return JSONResponse(body)

    @app.get(MODELS_PATH, summary="The served model (OpenAI-style list)")
    async def models() -> JSONResponse:
        entry = {
            "id": engine.name,
            "object": "model",
            "owned_by": "spdrank",
            "max_documents": engine.max_documents,
        }
        return JSONResponse({"object": "list", "data": [entry]})

    @app.get(METRICS_PATH, summary="Prometheus metrics (text exposition)")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)
