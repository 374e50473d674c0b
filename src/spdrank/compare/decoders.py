"""One SPD checkpoint under several decoders, from one forward pass per slate.

The decoders of :mod:`spdrank.methods.spd.decode` differ only after the score matrix. Running the
backbone again for each would multiply a benchmark's cost by the number of decoders and
measure nothing new, so the rows of one checkpoint share its forward pass: the first row to
ask for a slate computes the matrix (timing tokenize, prefill and head), and every row decodes
it with its own decoder, timing only that.

Each row reports the latency a user of that decoder would see, the shared forward's wall time
plus its own decode (``Ranking.recorded_ms``), so no row is charged, or spared, another row's
prefill.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate

if TYPE_CHECKING:
    from spdrank.model.ranker import SPDRanker


class SharedForward:
    """A checkpoint's score matrix for the current slate, computed once for all its rows."""

    def __init__(self, model: SPDRanker) -> None:
        self.model = model
        #: Forward passes run so far (what sharing saves is visible in tests and logs).
        self.passes = 0
        self._slate: Slate | None = None
        self._scores = np.empty(0)
        self._timings: dict[str, float] = {}
        self._forward_ms = 0.0
        self._served: set[int] = set()

    def scores(self, slate: Slate, row: object) -> tuple[np.ndarray, dict[str, float], float]:
        """The slate's scores [n, K], the forward's stage timings and its wall milliseconds.

        A row asking twice for the same slate (a warm-up call, then the timed one) gets a
        fresh forward pass: a timed call must never reuse its own warm-up's measurement.
        """
        if slate is not self._slate or id(row) in self._served:
            t0 = time.perf_counter()
            scores, timings = self.model.score_batch([slate])
            self._forward_ms = (time.perf_counter() - t0) * 1e3
            self._slate, self._scores, self._timings = slate, scores[0, : len(slate)], timings
            self._served = set()
            self.passes += 1
        self._served.add(id(row))
        return self._scores, self._timings, self._forward_ms


class DecodedRanker:
    """A ranker: the shared forward's scores, decoded by one named decoder."""

    needs_train = False

    def __init__(self, shared: SharedForward, decoder: str, name: str) -> None:
        shared.model.decoding(decoder)  # an unknown name fails before any ranking
        self.shared = shared
        self.decoder = decoder
        self.name = name

    def fit(self, train: Iterable[Slate]) -> None:
        """Trained by ``spdrank train``; nothing to fit here."""

    def rank(self, slate: Slate) -> Ranking:
        scores, timings, forward_ms = self.shared.scores(slate, self)
        model = self.shared.model
        t0 = time.perf_counter()
        order = model.order(scores, self.decoder)
        assign_ms = (time.perf_counter() - t0) * 1e3
        ranking = model.ranking(slate, order, scores, {**timings, "assign": assign_ms})
        ranking.recorded_ms = forward_ms + (time.perf_counter() - t0) * 1e3
        return ranking


def decoder_rows(model: SPDRanker, decoders: Sequence[str]) -> list[DecodedRanker]:
    """One row per decoder, named ``<model name>:<decoder>``, sharing one forward per slate."""
    if not model.method.matrix:
        raise ValueError(f"{model.name} scores one value per item: it has no decoders to compare")
    shared = SharedForward(model)
    return [DecodedRanker(shared, d, f"{model.name}:{d}") for d in dict.fromkeys(decoders)]
