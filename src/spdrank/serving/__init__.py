"""HTTP serving for a trained SPD model: ``spdrank serve``.

``app`` (assembles the FastAPI app), ``routes`` (the paths), ``intake`` (a request becomes a
slate), ``replies`` (a ranking becomes a response), ``errors`` (the error contract),
``openapi`` (the schema), ``settings`` (the knobs, and so the flags), ``batcher`` (dynamic
micro-batching into one worker thread), ``engine`` (the model side), ``policy`` (how a batch
shares prefills), ``gate`` (body limit, timing, counting), ``metrics`` (Prometheus text),
``schemas`` (request/response models). See docs/serving.md.

``ApiError``, ``ServeSettings`` and ``create_app`` are loaded on first use, so importing a
light submodule (``settings`` and ``policy``, when ``spdrank serve``'s flags are parsed) does
not import FastAPI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spdrank.serving.app import create_app
    from spdrank.serving.errors import ApiError
    from spdrank.serving.settings import ServeSettings

__all__ = ["ApiError", "ServeSettings", "create_app"]

#: Where each lazily loaded name lives.
_HOMES = {"ApiError": "errors", "ServeSettings": "settings", "create_app": "app"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"spdrank.serving.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
