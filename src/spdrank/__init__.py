"""spdrank: single-pass generative reranking (SPD).

One prefill of a decoder-only LLM over a prompt holding the user context and N candidates,
a light head mapping each candidate's hidden state to N x K item-position scores, and a
linear-assignment decode that returns a valid permutation by construction.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spdrank.model.ranker import SPDRanker

__version__ = "0.1.0"
__all__ = ["SPDRanker", "__version__"]


def __getattr__(name: str) -> Any:
    """``from spdrank import SPDRanker``, imported on first use: ``import spdrank`` (and the
    CLI's ``--help``) stays free of torch and transformers."""
    if name == "SPDRanker":
        from spdrank.model.ranker import SPDRanker

        return SPDRanker
    raise AttributeError(f"module 'spdrank' has no attribute {name!r}")
