"""The server's paths, named once: the app registers its routes from these and the gate
labels metrics with them, so a route added or renamed cannot go uncounted."""

from __future__ import annotations

#: The Cohere / vLLM / Jina rerank endpoint and its aliases.
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")
#: One slate in spdrank's own JSON format.
RANK_PATH = "/v1/rank"
MODELS_PATH = "/v1/models"
HEALTH_PATH = "/healthz"
METRICS_PATH = "/metrics"
#: The documentation FastAPI serves: Swagger UI, ReDoc, and the OpenAPI document they read.
DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
OPENAPI_PATH = "/openapi.json"
#: Where the documentation pages' scripts and styles are served from (no CDN: the pages work
#: offline).
DOCS_ASSETS_PATH = "/docs-assets"

#: Paths reported by name in metrics; anything else is "other", so scanners probing random
#: URLs cannot blow up the number of series.
KNOWN_ROUTES = frozenset(
    (
        *RERANK_PATHS, RANK_PATH, MODELS_PATH, HEALTH_PATH, METRICS_PATH,
        DOCS_PATH, REDOC_PATH, OPENAPI_PATH, DOCS_ASSETS_PATH,
    )
)


def route_label(path: str) -> str:
    """The metrics label of a request for ``path`` (every documentation asset is one route)."""
    if path.startswith(DOCS_ASSETS_PATH + "/"):
        return DOCS_ASSETS_PATH
    return path if path in KNOWN_ROUTES else "other"
