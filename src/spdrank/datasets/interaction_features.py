"""Per-candidate features from the training interactions: popularity, co-occurrence, transition.

They are the statistics of the popularity and co-occurrence baselines
(:mod:`spdrank.rankers.baselines`), fitted the way those baselines fit: on each training slate's
sequence (its history, then its target), with the baselines' own defaults. A model trained
with ``--features popularity,cooccurrence`` can therefore be compared with those baselines on
the same evidence, and a features-only model shows what the statistics alone are worth.

- ``popularity``: ``log1p`` of the candidate's count in the training sequences;
- ``cooccurrence``: ``log1p`` of the co-occurrence baseline's score, the decayed sum of the
  candidate's co-occurrence counts with the user's most recent history items;
- ``transition``: ``log1p`` of how often the candidate came right after the user's last
  history item (the same counting with a window of 1, forward only, the last item only: a
  first-order Markov chain). Co-occurrence blends ten history items over a window of 20, so
  a strong "next purchase" link from the last item is diluted there; here it stands alone,
  and a model can weigh the two.

Both are rounded to 6 decimals, so the files do not depend on the last bit of a platform's
``log1p``. Counts are heavy-tailed, hence the ``log1p``; the model z-scores them again.

**Leave one user out.** A training slate's own sequence holds its target: counted, it would
give the target at least one count and one co-occurrence with the history that no negative
can have (negatives are items the user never touched), and a model would learn to read the
label off the features. So every slate's features are computed as if its user's own sequence
had not been counted. For a training user that removes exactly their sequence; an eval user's
sequence was never counted, so nothing is removed. Train and eval slates thus both see counts
over the other training users only, the same distribution (N-1 users against N, a negligible
difference), where the alternative of counting only earlier users, or splitting the training
users into folds, would give train slates noisier statistics than eval slates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from spdrank.core.slates import Slate
from spdrank.rankers.baselines import CooccurrenceRanker

#: The feature names, as they appear in a candidate's ``features``.
FEATURES: tuple[str, ...] = ("popularity", "cooccurrence", "transition")

#: Decimals kept of each value.
DECIMALS = 6


class InteractionFeatures:
    """The baselines' statistics, fitted once on the training sequences, per candidate."""

    def __init__(self, train_sequences: Iterable[Sequence[str]]) -> None:
        # The co-occurrence baseline counts items too (its popularity fallback): one pass.
        sequences = [list(s) for s in train_sequences]
        self.stats = CooccurrenceRanker()
        self.stats.fit_sequences(sequences)
        self.transition = CooccurrenceRanker(window=1, recent=1, backward=0.0)
        self.transition.fit_sequences(sequences)

    def __call__(self, slate: Slate, own: Sequence[str] | None) -> list[dict[str, float]]:
        """``{"popularity": ..., "cooccurrence": ..., "transition": ...}`` per candidate, in order.

        ``own``: the slate's own sequence when it was among the training sequences (a training
        slate), left out of the counts; None for a slate whose sequence was never counted.
        """
        popularity = self.stats.popularity.scores(slate, leave_out=own)
        cooccurrence = self.stats.scores(slate, leave_out=own)
        transition = self.transition.scores(slate, leave_out=own)
        return [
            {"popularity": _log1p(p), "cooccurrence": _log1p(c), "transition": _log1p(t)}
            for p, c, t in zip(popularity, cooccurrence, transition)
        ]


def _log1p(x: float) -> float:
    return round(math.log1p(x), DECIMALS)
