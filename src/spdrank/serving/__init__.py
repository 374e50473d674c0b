"""HTTP serving for a trained SPD model: ``spdrank serve``.

``app`` (FastAPI routes and the error contract), ``batcher`` (dynamic micro-batching into
one worker thread), ``engine`` (the model side), ``policy`` (how a batch shares prefills),
``gate`` (body limit, timing, counting), ``metrics`` (Prometheus text), ``schemas``
(request/response models). See docs/serving.md.

``ApiError``, ``ServeSettings`` and ``create_app`` are loaded on first use, so importing a
light submodule (``policy``, when ``spdrank serve``'s flags are parsed) does not import
FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spdrank.serving.app import ApiError, ServeSettings, create_app

__all__ = ["ApiError", "ServeSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from spdrank.serving import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
