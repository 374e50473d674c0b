"""What a request becomes before it is queued: a :class:`Slate` the model accepts, admitted
with what the model's check computed of it (:class:`~spdrank.serving.engine.Admitted`).

Both routes build their slate one way, :func:`admit`: ``/v1/rank`` takes a slate in
spdrank's JSON format, and ``/v1/rerank`` writes its request as that same JSON
(:func:`rerank_slate_json`) first, so the two cannot drift apart in what they check or how
candidates are named. Everything here runs on the event loop, so a request the model would
refuse is answered 4xx before it takes a place in the queue.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request
from pydantic import ValidationError

from spdrank.core.slates import Slate, SlateError
from spdrank.core.validation import loads
from spdrank.serving.engine import Admitted, Engine
from spdrank.serving.errors import ApiError
from spdrank.serving.schemas import RerankRequest, format_validation_error

log = logging.getLogger(__name__)


def check_json_type(content_type: str | None) -> None:
    """415 unless the body says it is JSON (``application/json``, parameters allowed).

    A web page may send a browser's "simple" request (``text/plain``, a form, or no type at
    all) to any address without asking first (no CORS preflight); only a JSON type needs that
    permission, which this server never gives. So a page a user visits cannot make a local
    server without an API key rank for it.
    """
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        given = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
        raise ApiError(415, f"the body must be JSON sent as Content-Type: application/json "
                            f"({given} given)", "unsupported_media_type")


async def json_body(request: Request) -> Any:
    """Parse the body, which must say it is JSON (:func:`check_json_type`), through the gate
    slate files pass (:func:`spdrank.core.validation.loads`): 400 for what is not JSON, 422
    naming the field for values spdrank cannot carry (lone surrogates, numbers beyond the
    float range)."""
    check_json_type(request.headers.get("content-type"))
    body = await request.body()
    if not body.strip():
        raise ApiError(400, "the request body is empty: send a JSON object", "invalid_json")
    try:
        return loads(body)
    except SlateError as exc:
        if exc.syntax:
            raise ApiError(400, str(exc), "invalid_json", exc.field) from None
        raise ApiError(422, str(exc), "invalid_value", exc.field) from None


def check_size(n: int, limit: int, field: str, windowed: bool = False) -> None:
    """Refuse more items than the server ranks (the model's K, or with sliding windows
    ``--max-documents``), before the engine's own checks (same words)."""
    if n > limit:
        bound = "--max-documents, with sliding windows" if windowed else "its K"
        raise ApiError(
            422,
            f"{field}: {n} given; this model ranks at most {limit} ({bound}). "
            f"Split the list, or pre-select the best {limit}.",
            "too_many_documents",
            field,
        )


#: Fields only a rerank request reads. A slate keeps any field it does not know and hands it
#: back, so one of these sent to ``/v1/rank`` would come back unread, its answer not what it
#: asked for (every candidate, not the best ``top_n``).
RERANK_ONLY_FIELDS = ("top_n", "return_documents")


def slate_body(data: Any) -> Any:
    """The body of a ``/v1/rank`` request, refused with 422 ``invalid_slate`` when it holds a
    field only ``/v1/rerank`` reads."""
    sent = [name for name in RERANK_ONLY_FIELDS if isinstance(data, dict) and name in data]
    if sent:
        raise ApiError(
            422, f"{sent[0]!r} is a /v1/rerank field, which /v1/rank does not read: a slate "
            "comes back whole, every candidate ranked; send a rerank request to /v1/rerank, or "
            "keep the first candidates of the answer", "invalid_slate", sent[0])
    return data


def admit(data: Any, engine: Engine, field: str = "candidates") -> Admitted:
    """The slate ``data`` (spdrank's slate JSON) describes, checked against the model: at most
    its K items (``field`` names the list in the message), the features it reads present
    (and normalised, once: they travel with the slate to its batch).

    The one way a request becomes a slate; 422 ``invalid_slate`` naming the field for a
    slate that is malformed or that the model cannot rank. Its ids pass the rule slate files
    and TREC runs hold them to (:func:`spdrank.core.validation.id_problem`), so no answer
    names an id (empty, or holding whitespace, a control or a format character) that a file
    could not carry.
    """
    try:
        slate = Slate.from_dict(data, text_fields=engine.model.config.text_fields)
        check_size(len(slate), engine.max_documents, field, engine.windows is not None)
        return engine.check(slate)
    except SlateError as exc:
        raise ApiError(422, str(exc), "invalid_slate", exc.field) from None


def rerank_request(data: Any, engine: Engine) -> RerankRequest:
    """``data`` as a rerank request this server can answer: 422 for a malformed one, 404 for
    another model's name, 422 when the model reads features documents do not carry."""
    try:
        req = RerankRequest.model_validate(data)
    except ValidationError as exc:
        message, param = format_validation_error(exc)
        raise ApiError(422, message, "invalid_request", param) from None
    if req.model is not None and req.model != engine.name:
        note_model_name(req.model, engine.name)
    if engine.features:
        raise ApiError(
            422,
            f"this model reads upstream features ({', '.join(engine.features)}) that "
            "rerank documents do not carry: send slates with candidates' features to /v1/rank",
            "features_required",
        )
    return req


#: The other model names clients sent, each noted once; past this many, no more are kept.
_NOTED_NAMES: set[str] = set()
_MAX_NOTED = 64


def note_model_name(asked: str, served: str) -> None:
    """Log, once per name, that a client asked for a model by another name: hosted-reranker
    clients always send one (``rerank-english-v3.0``), and the served model answers it."""
    if asked in _NOTED_NAMES or len(_NOTED_NAMES) >= _MAX_NOTED:
        return
    _NOTED_NAMES.add(asked)
    log.info("a client asked for model %r: answering with the served model %r", asked[:200],
             served)


def rerank_slate_json(req: RerankRequest, text_field: str) -> dict[str, Any]:
    """The rerank request as the slate JSON ``/v1/rank`` takes: no qid, and each document a
    candidate whose docid is its index in the request (which the response reports back)."""
    return {
        "query": {"qid": "", "text": req.query},
        "candidates": [
            {"docid": str(i), "doc": {text_field: text}} for i, text in enumerate(req.texts())
        ],
    }


def rerank_slate(req: RerankRequest, engine: Engine) -> Admitted:
    """The slate a rerank request ranks (too many documents: 422 naming ``documents``)."""
    return admit(rerank_slate_json(req, engine.text_field), engine, "documents")
