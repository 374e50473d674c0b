"""Sliding windows: rank a slate larger than a model reads in one prompt, RankGPT's way.

A single-pass student reads at most K candidates (its head's positions) and the backbone's
context holds a bounded prompt, while a first stage hands over 100 passages or more. RankGPT
(Sun et al. 2023) ranks such lists with a window of ``window`` candidates that slides from the
bottom of the list to the top by ``stride``: each pass reorders its window in place, so a
relevant candidate found low in the list is carried up window by window, and the top
``window - stride`` of each pass go on into the next. The student ranks each window in one
prefill; the windows are sequential (each reads the order the one below left), so a ranking
costs one pass per window, which :attr:`~spdrank.core.ranking.Ranking.decode_passes` counts.

The result is a permutation of the whole slate. Its ``scores`` are rank-derived: scores from
different windows are not comparable. ``timings`` are summed over the windows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate


@dataclass(frozen=True)
class Windows:
    """The window scheme: ``window`` candidates a pass, moving up by ``stride``."""

    window: int
    stride: int

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ValueError(f"a window holds at least 2 candidates, got {self.window}")
        if not 1 <= self.stride <= self.window:
            raise ValueError(
                f"the stride must be between 1 and the window ({self.window}), got {self.stride}"
            )

    def spans(self, n: int) -> list[tuple[int, int]]:
        """The ``[start, end)`` of each pass over ``n`` candidates, bottom window first; one
        span when the slate fits a window."""
        if n <= self.window:
            return [(0, n)]
        spans = []
        end = n
        while True:
            start = max(end - self.window, 0)
            spans.append((start, end))
            if start == 0:
                return spans
            end -= self.stride

    def passes(self, n: int) -> int:
        """How many prefills a slate of ``n`` candidates costs."""
        return len(self.spans(n))


def rank_windowed(
    slate: Slate, windows: Windows, rank: Callable[[Slate], Ranking]
) -> Ranking:
    """Rank ``slate`` with ``rank`` over sliding windows (a slate within one window is ranked
    once, as it is)."""
    spans = windows.spans(len(slate))
    if len(spans) == 1:
        return rank(slate)
    order = list(slate.candidates)
    timings: dict[str, float] = {}
    passes = 0
    for start, end in spans:
        part = replace(slate, candidates=order[start:end], clicked=None, teacher=None,
                       teacher_scores=None, relevance=None)
        ranking = rank(part)
        by_id = {c.docid: c for c in part.candidates}
        order[start:end] = [by_id[d] for d in ranking.docids]
        for stage, ms in ranking.timings.items():
            timings[stage] = timings.get(stage, 0.0) + ms
        passes += max(ranking.decode_passes, 1)
    return Ranking(
        docids=[c.docid for c in order],
        timings=timings,
        decode_passes=passes,
    )


class WindowedRanker:
    """Any ranker, run over sliding windows: what ``--window`` wraps a model in."""

    needs_train = False

    def __init__(self, inner: object, windows: Windows) -> None:
        self.inner = inner
        self.windows = windows
        self.name = getattr(inner, "name", "ranker")

    def fit(self, train: object) -> None:
        """Nothing to learn here: the inner ranker is fitted as it is."""

    def rank(self, slate: Slate) -> Ranking:
        ranking = rank_windowed(slate, self.windows, self.inner.rank)  # type: ignore[attr-defined]
        position = {d: i for i, d in enumerate(slate.docids)}
        return replace(ranking, indices=[position[d] for d in ranking.docids])
