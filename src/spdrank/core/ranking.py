"""What every ranker returns, and the interface the evaluation runs them through.

Baselines, teachers and the SPD student all answer ``rank(slate) -> Ranking``, so one
evaluation loop measures them on the same slates, side by side.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from spdrank.core.slates import Slate

#: The stages of one ranking call, in order, as :attr:`Ranking.timings` names them: encoding and
#: collating the prompts, the backbone's forward, pooling its states into what the head reads
#: (the items' last tokens, means or words), the head, and the assignment decoder.
STAGES = ("tokenize", "prefill", "readout", "head", "assign")


@dataclass
class Ranking:
    """A ranked slate: docids best first, optional scores aligned with them, stage timings."""

    docids: list[str]
    scores: list[float] | None = None
    #: Milliseconds per stage (e.g. tokenize, prefill, head, assign); empty if not measured.
    timings: dict[str, float] = field(default_factory=dict)
    #: Sequential forward passes spent decoding (1 for a single-pass ranker, 0 for non-LLM).
    decode_passes: int = 0
    #: Milliseconds the evaluation reports instead of the time this call took, when the work
    #: was measured where it was done: a replayed teacher's own run, a forward pass shared by
    #: the rows of several decoders, a bare prefill timed without its tokenization (bench).
    recorded_ms: float | None = None
    #: Where each ranked candidate sat in the slate (0-based ints, best first), when the
    #: ranker reports it: for plain texts, their positions in the list given, as
    #: sentence-transformers' ``CrossEncoder.rank`` and ``/v1/rerank`` answer.
    indices: list[int] | None = None

    def reported_scores(self) -> list[float]:
        """The scores to report, best first: the ranker's own, or :func:`rank_scores` for a
        ranker that gave none, so every output (result records, TREC runs, the server's
        relevance scores) carries one score per ranked item, strictly decreasing when derived.
        """
        if self.scores is not None:
            return [float(s) for s in self.scores]
        return rank_scores(len(self.docids))

    def top(self, n: int) -> Ranking:
        """The best ``n`` (all when fewer): docids, scores and indices cut alike."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"top_n must be a positive integer, got {n!r}")
        n = int(n)  # a numpy integer too
        return replace(
            self,
            docids=self.docids[:n],
            scores=None if self.scores is None else self.scores[:n],
            indices=None if self.indices is None else self.indices[:n],
        )


def rank_scores(n: int) -> list[float]:
    """Rank-derived relevances of ``n`` ranked items: ``1 - r/n`` for rank ``r`` from 0.

    In (0, 1], 1 for the first, strictly decreasing: the scores of a ranker whose order is
    all it knows (an assignment fixes SPD's order, and its matrix entries are not comparable
    across positions), and the scores reported for any ranking that came without them.
    """
    return [1.0 - r / n for r in range(n)]


@runtime_checkable
class Ranker(Protocol):
    """Anything that orders a slate's candidates."""

    name: str

    def fit(self, train: Iterable[Slate]) -> None:
        """Learn whatever statistics the ranker needs from training slates (may do nothing)."""

    def rank(self, slate: Slate) -> Ranking:
        """Return a permutation of ``slate``'s candidates, best first."""
