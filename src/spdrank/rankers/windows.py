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

:class:`WindowedRanker` is the one windowed ranking of ``rank``, ``eval`` and the server: it
counts the passes it spends, and ranks a model's windows from the prompts it encodes itself,
so what the prompts cut of a slate is known (:class:`WindowPrompts`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate

if TYPE_CHECKING:
    import numpy as np


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

    def check_fits(self, k: int, whose: str = "the model's") -> None:
        """Refuse a window over a model's K (:func:`check_window`)."""
        check_window(self.window, k, whose)


def check_window(window: int, k: int, whose: str = "the model's") -> None:
    """Refuse a window over a model's K (``whose`` names the model in the message): the model
    could rank none of its windows."""
    if window > k:
        raise ValueError(f"--window {window} is over {whose} K ({k})")


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


@dataclass
class WindowPrompts:
    """What a model's prompts did to one slate ranked by windows, over all its windows."""

    #: Per candidate: its text was cut to the model's per-item token budget.
    truncated: dict[str, bool] = field(default_factory=dict)
    #: The tokens the windows' prompts hold together.
    tokens: int = 0
    query_truncated: bool = False


class WindowedRanker:
    """Any ranker, run over sliding windows: what ``--window`` wraps a model in.

    A model (a ranker with ``encode`` and ``rank_batch``, :class:`~spdrank.model.ranker.SPDRanker`)
    is refused a window over its K, ranks each window from the prompt encoded here (its
    ``tokenize`` stage holds that encoding) with ``decoder``, and :attr:`prompts` says what
    the last slate's prompts cut. :attr:`passes` and :attr:`slates` count what it ranked.
    """

    needs_train = False

    def __init__(
        self, inner: Any, windows: Windows, decoder: str | None = None,
        whose: str = "the model's",
    ) -> None:
        config = getattr(inner, "config", None)
        if config is not None:
            windows.check_fits(int(config.head.positions), whose)
        self.inner = inner
        self.windows = windows
        self.decoder = decoder
        self.name = getattr(inner, "name", "ranker")
        self._encodes = hasattr(inner, "encode") and hasattr(inner, "rank_batch")
        #: Passes (prefills) spent, and slates ranked, since it was built.
        self.passes = 0
        self.slates = 0
        #: What the prompts did to the last slate ranked (a model's; else empty).
        self.prompts = WindowPrompts()

    def fit(self, train: object) -> None:
        """Nothing to learn here: the inner ranker is fitted as it is."""

    def rank(
        self, slate: Slate, before_window: Callable[[Slate], None] | None = None,
        features: np.ndarray | None = None,
    ) -> Ranking:
        """``slate`` ranked by windows; ``before_window`` is called with each window before it
        is ranked (what stops a slate whose client has left, by raising). ``features``: the
        slate's normalised features as the model's check returned them, a window's prompt
        taking its candidates' rows rather than normalising them again."""
        self.slates += 1
        self.prompts = WindowPrompts()
        position = {d: i for i, d in enumerate(slate.docids)}

        def one(part: Slate) -> Ranking:
            if before_window is not None:
                before_window(part)
            rows = None if features is None else features[[position[d] for d in part.docids]]
            ranking = self._window(part, rows)
            self.passes += max(ranking.decode_passes, 1)
            return ranking

        ranking = rank_windowed(slate, self.windows, one)
        return replace(ranking, indices=[position[d] for d in ranking.docids])

    def rank_batch(self, slates: Sequence[Slate]) -> list[Ranking]:
        """Each slate ranked by its own windows."""
        return [self.rank(slate) for slate in slates]

    def _window(self, part: Slate, features: np.ndarray | None = None) -> Ranking:
        """One window ranked by the inner ranker (a model from the prompt encoded here, with
        the window's ``features`` when given)."""
        if not self._encodes:
            return self.inner.rank(part)
        start = time.perf_counter()
        encoded = self.inner.encode(part, features)
        encode_ms = (time.perf_counter() - start) * 1e3
        prompts = self.prompts
        prompts.truncated.update(zip(part.docids, encoded.truncated))
        prompts.tokens += len(encoded.input_ids)
        prompts.query_truncated = prompts.query_truncated or bool(encoded.query_truncated)
        ranking = self.inner.rank_batch([part], decoder=self.decoder, encoded=[encoded])[0]
        tokenize = ranking.timings.get("tokenize", 0.0) + encode_ms
        return replace(ranking, timings={**ranking.timings, "tokenize": tokenize})

    def summary(self) -> str:
        """The passes spent, in words."""
        return (f"{self.passes} prefills for {self.slates} slates (windows of "
                f"{self.windows.window}, stride {self.windows.stride})")
