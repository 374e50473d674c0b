"""What a ranked request is answered with: the rerank response, the rank result record, and
the ``meta`` both carry (how the request was served)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import Request

from spdrank.core.outputs import result_record
from spdrank.core.slates import Slate
from spdrank.serving.batcher import Done
from spdrank.serving.engine import Ranked
from spdrank.serving.gate import START_KEY
from spdrank.serving.schemas import RerankRequest


def serve_meta(request: Request, done: Done[Ranked]) -> dict[str, Any]:
    """How ``request`` was served: its batch, its waits, its stages, what was cut."""
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


def rerank_reply(
    req: RerankRequest, model: str, request: Request, done: Done[Ranked]
) -> dict[str, Any]:
    """The rerank response (Cohere / vLLM / Jina shape) for ``req``, ranked by ``model``.

    Results are best first, each naming its document by its index in the request (the
    slate's docid); ``top_n`` cuts them after ranking the whole list.
    """
    ranked = done.value
    ranking = ranked.ranking
    texts = req.texts()
    results: list[dict[str, Any]] = []
    for docid, score in zip(ranking.docids, ranking.reported_scores()):
        item: dict[str, Any] = {"index": int(docid), "relevance_score": score}
        if req.return_documents:
            item["document"] = {"text": texts[int(docid)]}
        results.append(item)
    if req.top_n is not None:
        results = results[: req.top_n]
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": model,
        "results": results,
        "usage": {"prompt_tokens": ranked.prompt_tokens, "total_tokens": ranked.prompt_tokens},
        "meta": serve_meta(request, done),
    }


def rank_reply(slate: Slate, request: Request, done: Done[Ranked]) -> dict[str, Any]:
    """The slate's result record (as ``spdrank rank`` writes it) plus how it was served.

    Extra fields travel along untouched: a slate's own ``meta`` keeps its name, and the
    server's then goes under ``serve_meta``.
    """
    record = result_record(slate, done.value.ranking)
    record["serve_meta" if "meta" in record else "meta"] = serve_meta(request, done)
    return record
