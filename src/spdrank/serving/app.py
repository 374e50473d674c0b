"""The FastAPI application: rerank and rank endpoints over one micro-batched model.

Every request is validated completely on the event loop (JSON, types, sizes, K) before it is
queued, so what reaches the model is a slate the model accepts; the error contract is in
docs/serving.md. Inference happens only in the batcher's worker thread.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from spdrank import __version__
from spdrank.results import result_record
from spdrank.serving.batcher import (
    BatcherClosedError,
    Done,
    InferenceError,
    MicroBatcher,
    QueueFullError,
)
from spdrank.serving.engine import Engine, Ranked
from spdrank.serving.gate import ROUTE_KEY, START_KEY, Gate, error_json, route_label
from spdrank.serving.metrics import CONTENT_TYPE, ServerMetrics
from spdrank.serving.policy import BATCH_POLICIES, DEFAULT_BATCH_POLICY, DEFAULT_MAX_PADDING
from spdrank.serving.schemas import (
    ErrorResponse,
    RerankRequest,
    RerankResponse,
    format_validation_error,
)
from spdrank.slates import Candidate, Query, Slate, SlateError
from spdrank.validation import loads

if TYPE_CHECKING:
    from spdrank.model import SPDRanker

log = logging.getLogger(__name__)

RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")


@dataclass
class ServeSettings:
    """The server's knobs (``spdrank serve`` flags)."""

    max_batch_size: int = 8
    max_wait_ms: float = 5.0
    max_queue: int = 64
    max_body_bytes: int = 1_000_000
    #: How collected slates share prefills: auto, padded, bucketed or single (policy.py).
    batch_policy: str = DEFAULT_BATCH_POLICY
    #: ``bucketed``: padded positions a prefill may hold, as a share of its real tokens.
    max_padding: float = DEFAULT_MAX_PADDING

    def __post_init__(self) -> None:
        if self.batch_policy not in BATCH_POLICIES:
            raise ValueError(
                f"unknown batch policy {self.batch_policy!r}: use one of {', '.join(BATCH_POLICIES)}"
            )
        if self.max_padding < 0:
            raise ValueError("max_padding must be >= 0")


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


def create_app(
    model: SPDRanker | Engine, settings: ServeSettings | None = None, name: str | None = None
) -> FastAPI:
    """The app serving ``model`` (an SPDRanker, or an Engine wrapping one) under ``name``.

    The settings' batch policy is applied to the engine (``auto`` resolved for its device).
    """
    settings = settings or ServeSettings()
    engine = model if isinstance(model, Engine) else Engine(model, name or model.name)
    engine.use_policy(settings.batch_policy, settings.max_padding)
    metrics = ServerMetrics()
    # With one prefill per slate nothing is shared: the collector takes one slate at a time
    # and never waits, which is exactly the unbatched server (collecting several only to run
    # them one by one costs the event loop and the worker a little more per request).
    single = engine.policy == "single"
    max_wait_ms = 0.0 if single else settings.max_wait_ms
    max_batch_size = 1 if single else settings.max_batch_size
    batcher: MicroBatcher[Slate, Ranked] = MicroBatcher(
        engine.rank,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        max_queue=settings.max_queue,
        metrics=metrics,
        parts=engine.rank_parts,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        log.info(
            "serving %s (K=%d, device %s): batches of up to %d, %.1f ms wait, queue %d, "
            "batch policy %s (%s)",
            engine.name,
            engine.max_documents,
            engine.device,
            max_batch_size,
            max_wait_ms,
            settings.max_queue,
            engine.policy,
            settings.batch_policy,
        )
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(
        title="spdrank",
        version=__version__,
        description="Single-pass generative reranking. Cohere/vLLM/Jina-compatible `/v1/rerank`, "
        'spdrank slates on `/v1/rank`. Errors: `{"error": {message, type, param, code}}`.',
        lifespan=lifespan,
    )
    app.state.engine = engine
    app.state.batcher = batcher
    app.state.metrics = metrics
    app.state.settings = settings
    app.add_middleware(Gate, max_body_bytes=settings.max_body_bytes, metrics=metrics)
    _install_error_handlers(app, metrics)

    async def submit(slate: Slate) -> Done[Ranked]:
        try:
            return await batcher.submit(slate)
        except QueueFullError as exc:
            raise ApiError(
                503, str(exc), "queue_full", headers={"Retry-After": str(exc.retry_after)}
            ) from None
        except BatcherClosedError as exc:
            raise ApiError(503, str(exc), "unavailable", headers={"Retry-After": "5"}) from None
        except InferenceError as exc:
            raise ApiError(500, f"inference failed: {exc}", "inference_error") from None

    rerank_doc = {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/RerankRequest"}}
            },
        }
    }
    error_doc: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 500, 503)
    }

    async def rerank(request: Request) -> JSONResponse:
        data = await _json_body(request)
        try:
            req = RerankRequest.model_validate(data)
        except ValidationError as exc:
            message, param = format_validation_error(exc)
            raise ApiError(422, message, "invalid_request", param) from None
        if req.model is not None and req.model != engine.name:
            raise ApiError(
                404,
                f"model {req.model!r} is not served here; this server serves {engine.name!r} "
                "(or leave 'model' out)",
                "model_not_found",
                "model",
            )
        if engine.features:
            raise ApiError(
                422,
                f"this model reads upstream features ({', '.join(engine.features)}) that "
                "rerank documents do not carry: send slates with candidates' features to /v1/rank",
                "features_required",
            )
        texts = req.texts()
        _check_size(len(texts), engine.max_documents, "documents")
        slate = Slate(
            query=Query(qid="", text=req.query),
            candidates=[
                Candidate(docid=str(i), doc={engine.text_field: t}) for i, t in enumerate(texts)
            ],
        )
        done = await submit(slate)
        ranked = done.value
        ranking = ranked.ranking
        scores = _scores(ranking.scores, len(ranking.docids))
        results: list[dict[str, Any]] = []
        for docid, score in zip(ranking.docids, scores):
            item: dict[str, Any] = {"index": int(docid), "relevance_score": score}
            if req.return_documents:
                item["document"] = {"text": texts[int(docid)]}
            results.append(item)
        if req.top_n is not None:
            results = results[: req.top_n]
        return JSONResponse(
            {
                "id": f"rerank-{uuid.uuid4().hex}",
                "model": engine.name,
                "results": results,
                "usage": {
                    "prompt_tokens": ranked.prompt_tokens,
                    "total_tokens": ranked.prompt_tokens,
                },
                "meta": _meta(request, done),
            }
        )

    for path in RERANK_PATHS:
        app.add_api_route(
            path,
            rerank,
            methods=["POST"],
            summary="Rerank documents for a query (Cohere / vLLM / Jina compatible)",
            response_model=None,
            responses={200: {"model": RerankResponse}, **error_doc},
            openapi_extra=rerank_doc,
            operation_id="rerank_" + path.strip("/").replace("/", "_"),
        )

    @app.post(
        "/v1/rank",
        summary="Rank one slate in spdrank's JSON format; returns its result record",
        responses=error_doc,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _SLATE_SCHEMA}},
            }
        },
    )
    async def rank(request: Request) -> JSONResponse:
        data = await _json_body(request)
        try:
            slate = Slate.from_dict(data, text_fields=engine.model.config.text_fields)
            _check_size(len(slate), engine.max_documents, "candidates")
            engine.check(slate)
        except SlateError as exc:
            raise ApiError(422, str(exc), "invalid_slate", exc.field) from None
        done = await submit(slate)
        record = result_record(slate, done.value.ranking)
        # Extra fields travel along untouched: a slate's own 'meta' keeps its name, and the
        # server's then goes under 'serve_meta'.
        record["serve_meta" if "meta" in record else "meta"] = _meta(request, done)
        return JSONResponse(record)

    @app.get("/healthz", summary="Liveness: 200 while the server accepts work")
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

    @app.get("/v1/models", summary="The served model (OpenAI-style list)")
    async def models() -> JSONResponse:
        entry = {
            "id": engine.name,
            "object": "model",
            "owned_by": "spdrank",
            "max_documents": engine.max_documents,
        }
        return JSONResponse({"object": "list", "data": [entry]})

    @app.get("/metrics", summary="Prometheus metrics (text exposition)")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    def openapi() -> dict[str, Any]:
        """FastAPI's schema plus the rerank request model, which handlers validate themselves."""
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        request_schema = RerankRequest.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(request_schema.pop("$defs", {}))
        components["RerankRequest"] = request_schema
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


# -- helpers ---------------------------------------------------------------------------------


async def _json_body(request: Request) -> Any:
    """Parse the body as JSON, whatever its Content-Type, through the gate slate files pass
    (:func:`spdrank.validation.loads`): 400 for what is not JSON, 422 naming the field for
    values spdrank cannot carry (lone surrogates, numbers beyond the float range)."""
    body = await request.body()
    if not body.strip():
        raise ApiError(400, "the request body is empty: send a JSON object", "invalid_json")
    try:
        return loads(body)
    except SlateError as exc:
        if exc.syntax:
            raise ApiError(400, str(exc), "invalid_json", exc.field) from None
        raise ApiError(422, str(exc), "invalid_value", exc.field) from None


def _check_size(n: int, limit: int, field: str) -> None:
    """Refuse more items than the model's K, before the engine's own checks (same words)."""
    if n > limit:
        raise ApiError(
            422,
            f"{field}: {n} given; this model ranks at most {limit} (its K). "
            f"Split the list, or pre-select the best {limit}.",
            "too_many_documents",
            field,
        )


def _scores(scores: list[float] | None, n: int) -> list[float]:
    """The ranking's scores, or rank-derived ones (1 - r/n) for a ranker that gave none."""
    if scores is not None:
        return [float(s) for s in scores]
    return [1.0 - r / n for r in range(n)]


def _meta(request: Request, done: Done[Ranked]) -> dict[str, Any]:
    start = request.scope.get(START_KEY, time.perf_counter())
    ranked = done.value
    return {
        "batch_size": done.batch_size,
        "collected": done.collected,
        "queue_ms": round(done.queue_ms, 3),
        "inference_ms": round(done.inference_ms, 3),
        "total_ms": round((time.perf_counter() - start) * 1e3, 3),
        "timings_ms": {k: round(v, 3) for k, v in ranked.ranking.timings.items()},
        "truncated_documents": [i for i, cut in enumerate(ranked.truncated) if cut],
        "query_truncated": ranked.query_truncated,
    }


def _install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
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


_SLATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["query", "candidates"],
    "properties": {
        "query": {
            "description": "{qid, text[, history]} or a bare string",
            "anyOf": [{"type": "string"}, {"type": "object"}],
        },
        "candidates": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["docid", "doc"],
                "properties": {
                    "docid": {"type": "string"},
                    "doc": {"type": "object", "description": "title, text or contents"},
                    "score": {"type": "number"},
                },
            },
        },
        "clicked": {"type": "array", "items": {"type": "string"}},
        "teacher": {"type": "array", "items": {"type": "string"}},
    },
    "example": {
        "query": {"qid": "u1", "text": "1. Rose shampoo\n2. Argan hair oil"},
        "candidates": [
            {"docid": "B01", "doc": {"title": "Argan oil conditioner"}},
            {"docid": "B02", "doc": {"title": "Nail polish remover"}},
        ],
    },
}
