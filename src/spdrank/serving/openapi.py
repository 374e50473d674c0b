"""The OpenAPI document: the request bodies handlers parse themselves, and the error shape.

Handlers read their bodies through :func:`spdrank.serving.intake.json_body` (so every JSON
problem gets the one error contract), which hides the bodies from FastAPI's own schema; the
pieces here put them back.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from spdrank.serving.auth import is_open
from spdrank.serving.schemas import ErrorResponse, RerankRequest

#: The rerank routes' request body: the :class:`RerankRequest` model.
RERANK_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RerankRequest"}}},
    }
}

#: The error answers every route documents.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 408, 413, 415, 422, 500, 503)
}


def install_openapi(app: FastAPI, bearer: bool = False) -> None:
    """Serve FastAPI's schema plus the rerank request model, built once on first request.

    With ``bearer`` (the server has an API key), the routes that need the key say so, which
    gives the documentation page the button to enter it.
    """

    def openapi() -> dict[str, Any]:
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
        if bearer:
            bearer_scheme = {"type": "http", "scheme": "bearer"}
            schema["components"]["securitySchemes"] = {"bearer": bearer_scheme}
            for path, operations in schema.get("paths", {}).items():
                if not is_open(path):
                    for operation in operations.values():
                        operation["security"] = [{"bearer": []}]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


#: The body ``/v1/rank`` takes (handlers parse it themselves, through ``Slate.from_dict``).
SLATE_SCHEMA: dict[str, Any] = {
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


#: The ``/v1/rank`` route's request body.
RANK_BODY: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": SLATE_SCHEMA}}}
}
