"""HTTP serving for a trained SPD model: ``spdrank serve``.

``app`` (FastAPI routes and the error contract), ``batcher`` (dynamic micro-batching into
one worker thread), ``engine`` (the model side), ``gate`` (body limit, timing, counting),
``metrics`` (Prometheus text), ``schemas`` (request/response models). See docs/serving.md.
"""

from spdrank.serving.app import ApiError, ServeSettings, create_app

__all__ = ["ApiError", "ServeSettings", "create_app"]
